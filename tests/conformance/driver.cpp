// tests/conformance/driver.cpp: the conformance driver's walk over the op table, the support
// matrix and the helpers paths share. See Note [Conformance] in driver.h.
#include "conformance/driver.h"

#include <cmath>
#include <iomanip>
#include <map>
#include <optional>
#include <ostream>
#include <sstream>

#include "samples/util.h"

namespace kiln::conformance {

const char* status_name(Status s) {
  switch (s) {
    case Status::NotClaimed:
      return "not claimed";
    case Status::Missing:
      return "missing";
    case Status::Failed:
      return "failed";
    case Status::Untested:
      return "untested";
    case Status::Ok:
      return "ok";
  }
  return "?";
}

namespace {

std::vector<std::unique_ptr<Path>>& path_registry() {
  static std::vector<std::unique_ptr<Path>> r;
  return r;
}

// One character per cell in the printed table.
char status_char(Status s) {
  switch (s) {
    case Status::NotClaimed:
      return '.';
    case Status::Missing:
      return 'M';
    case Status::Failed:
      return 'F';
    case Status::Untested:
      return '?';
    case Status::Ok:
      return 'o';
  }
  return ' ';
}

bool is_missing_kernel(const Error& e) {
  const std::string what = e.what();
  return e.kind() == ErrorKind::NotImplemented ||
         (e.kind() == ErrorKind::Type && what.find("is not supported") != std::string::npos);
}

// ---- tracing a composite's decomposition ----------------------------------------------------

// An op a decomposition called, with the dtype of its first tensor argument (none: a factory).
struct Call {
  const OperatorHandle* op;
  std::optional<ScalarType> dtype;
};
thread_local std::vector<Call>* t_calls = nullptr;

// Composite rows run their decomposition at every key, Tracing included, so this fallback sees
// exactly the non-composite ops a decomposition reaches; their own kernels run untraced.
void record_call(const OperatorHandle& op, DispatchKeySet ks, Stack& stack) {
  const int n = op.info().num_args;
  std::optional<ScalarType> dtype;
  for (int i = 0; i < n && !dtype; ++i) {
    const IValue& v = stack[stack.size() - n + i];
    if (v.is_tensor() && v.to_tensor().defined()) dtype = v.to_tensor().dtype();
    if (v.is_tensor_list() && !v.to_tensor_list().empty()) dtype = v.to_tensor_list()[0].dtype();
  }
  if (t_calls != nullptr) t_calls->push_back({&op, dtype});
  ExcludeDispatchKeyGuard below(DispatchKey::Tracing);
  op.redispatch_boxed(ks & DispatchKeySet::below(DispatchKey::Tracing), stack);
}

// The ops `op`'s decomposition calls on `s` (on CPU). The Tracing fallback is installed for the
// call only, and whatever was there before is put back.
std::vector<Call> decomposition_calls(const OperatorHandle& op, Stack s) {
  Dispatcher& d = Dispatcher::get();
  const BoxedKernel before = d.fallback(DispatchKey::Tracing);
  d.register_fallback(DispatchKey::Tracing, &record_call);
  std::vector<Call> calls;
  t_calls = &calls;
  try {
    IncludeDispatchKeyGuard trace(DispatchKey::Tracing);
    op.call_boxed(s);
  } catch (const Error&) {
  }
  t_calls = nullptr;
  d.register_fallback(DispatchKey::Tracing, before);
  return calls;
}

// Why a claim of `row` for (`key`, `backend`) in the dtype the calls were made with has no
// kernel: "" when it has one.
std::string no_kernel(const testing::ManifestRow& row, DispatchKey key, testing::Backend backend,
                      const std::vector<Call>& calls) {
  if (!row.composite) {
    if (row.op->has_kernel(key)) return "";
    return std::string("no ") + dispatch_key_name(key) + " kernel registered";
  }
  for (const Call& c : calls) {
    const testing::ManifestRow* callee = testing::manifest_row(c.op->name());
    if (!c.op->has_kernel(key))
      return std::string("calls ") + c.op->name() + ", which has no " + dispatch_key_name(key) +
             " kernel";
    if (callee != nullptr && c.dtype && !callee->claims_dtype(backend, *c.dtype))
      return std::string("calls ") + c.op->name() + " in " + scalar_type_name(*c.dtype) +
             ", which its row does not claim for " + testing::backend_name(backend);
  }
  return "";
}

// Whether an in-place op may write a result of dtype `from` into a self of dtype `to`: PyTorch's
// torch.can_cast, the rule eager CPU applies (no floating -> integral, no non-bool -> bool).
// See Note [Variant dtypes].
bool result_fits(ScalarType from, ScalarType to) {
  if (is_floating(from) && !is_floating(to)) return false;
  return from == kBool || to != kBool;
}

// A cell while the samples run.
struct Tally {
  bool claimed = false;
  int ran = 0;
  std::string missing, failed, skipped;
  bool skipped_documented = true;  // every skip so far had a reason of Note [Untested cells]
};

void note(Tally& t, const Outcome& o, const std::string& where) {
  if (o.status == Status::Ok) {
    ++t.ran;
  } else if (o.status == Status::Missing) {
    if (t.missing.empty()) t.missing = where + ": " + o.detail;
  } else if (o.status == Status::Failed) {
    if (t.failed.empty()) t.failed = where + ": " + o.detail;
  } else if (o.status == Status::Untested) {
    if (t.skipped.empty() || (t.skipped_documented && !o.documented))
      t.skipped = where + ": " + o.detail;
    t.skipped_documented = t.skipped_documented && o.documented;
  }
}

Cell finish(const Tally& t, const std::string& unavailable) {
  if (!t.claimed) return {};
  if (!t.missing.empty()) return {Status::Missing, t.ran, t.missing};
  if (!t.failed.empty()) return {Status::Failed, t.ran, t.failed};
  if (t.ran > 0) return {Status::Ok, t.ran, ""};
  if (!unavailable.empty()) return {Status::Untested, 0, unavailable, true};
  if (t.skipped.empty()) return {Status::Untested, 0, "no sample in this dtype", false};
  return {Status::Untested, 0, t.skipped, t.skipped_documented};
}

}  // namespace

void register_path(std::unique_ptr<Path> p) { path_registry().push_back(std::move(p)); }
const std::vector<std::unique_ptr<Path>>& paths() { return path_registry(); }

const std::vector<ScalarType>& matrix_dtypes() {
  static const std::vector<ScalarType> d = testing::dtypes_of_set("all");
  return d;
}

std::string compare_values(const std::vector<Tensor>& got, const std::vector<Tensor>& want,
                           bool exact) {
  if (got.size() != want.size())
    return std::to_string(got.size()) + " outputs, eager CPU has " + std::to_string(want.size());
  for (size_t o = 0; o < got.size(); ++o) {
    std::ostringstream where;
    where << "output " << o << ": ";
    if (got[o].sizes() != want[o].sizes()) {
      where << "sizes " << got[o].sizes() << ", eager CPU " << want[o].sizes();
      return where.str();
    }
    if (got[o].dtype() != want[o].dtype()) {
      where << "dtype " << scalar_type_name(got[o].dtype()) << ", eager CPU "
            << scalar_type_name(want[o].dtype());
      return where.str();
    }
    const ScalarType t = want[o].dtype();
    // Two units in the last place of the dtype, relative (float16 2^-9, bfloat16 2^-6).
    const double tol = exact || !is_floating(t) ? 0.0
                       : t == kFloat16          ? 2e-3
                       : t == kBFloat16         ? 1.6e-2
                       : t == kFloat32          ? 1e-5
                                                : 1e-9;
    std::vector<double> g = testing::to_doubles(got[o]), w = testing::to_doubles(want[o]);
    for (size_t i = 0; i < g.size(); ++i) {
      if (std::isnan(w[i]) && std::isnan(g[i])) continue;
      if (g[i] == w[i]) continue;
      if (std::fabs(g[i] - w[i]) <= tol * (1 + std::fabs(w[i]))) continue;
      where << "element " << i << " is " << std::setprecision(17) << g[i] << ", eager CPU " << w[i];
      return where.str();
    }
  }
  return "";
}

Tensor to_device(const Tensor& t, Device device) {
  if (!t.defined() || t.impl()->is_wrapped_number()) return t;
  return testing::copy_tensor(t, t.dtype(), device);
}

Stack to_device(const Stack& s, Device device, const OpInfo& info) {
  Stack out;
  for (size_t i = 0; i < s.size(); ++i) {
    const IValue& v = s[i];
    const bool device_arg =
        i < static_cast<size_t>(info.num_args) && info.args[i].arg_type == ArgType::OptionalDevice;
    if (v.is_tensor()) {
      out.emplace_back(to_device(v.to_tensor(), device));
    } else if (v.is_tensor_list()) {
      std::vector<Tensor> ts;
      for (const Tensor& t : v.to_tensor_list()) ts.push_back(to_device(t, device));
      out.emplace_back(std::move(ts));
    } else if (device_arg && (v.is_none() || (v.is<Device>() && v.get<Device>().is_cpu()))) {
      out.emplace_back(device);
    } else if (v.is<Generator>()) {
      out.emplace_back(testing::copy_generator(v.get<Generator>()));
    } else {
      out.push_back(v);
    }
  }
  return out;
}

Outcome run_on_device(const Case& c, Device device) {
  Stack s = to_device(c.sample, device, c.op().info());
  manual_seed(c.seed);
  c.op().call_boxed(s);
  std::vector<Tensor> got = testing::outputs_of(s), want = testing::outputs_of(c.cpu_out);
  if (c.row.name.rfind("empty", 0) == 0) {  // uninitialized
    for (size_t i = 0; i < got.size() && i < want.size(); ++i) {
      got[i] = zeros(got[i].sizes(), got[i].dtype());  // never read: it may be any bytes
      want[i] = zeros(want[i].sizes(), want[i].dtype());
    }
  }
  return Outcome::failed_unless(compare_values(got, want, c.random()));
}

Outcome outcome_of_error(const std::string& path, const Error& e) {
  if (e.kind() == ErrorKind::NotImplemented &&
      std::string(e.what()).find("data-dependent output shape") != std::string::npos)
    return Outcome::nothing_to_compare(std::string("nothing to compare: ") + e.what());
  if (is_missing_kernel(e)) return Outcome::missing(e.what());
  return Outcome::failed(path + " raised where eager CPU did not: " + e.what());
}

std::vector<Matrix::Problem> Matrix::problems() const {
  std::vector<Problem> out;
  for (const Row& r : rows)
    for (size_t p = 0; p < paths.size(); ++p)
      for (int d = 0; d < kMatrixDtypes; ++d) {
        const Cell& c = r.cells[p][d];
        if (c.status == Status::Missing || c.status == Status::Failed ||
            (c.status == Status::Untested && !c.documented))
          out.push_back({r.op, paths[p], matrix_dtypes()[d], c.status, c.detail});
      }
  return out;
}

int Matrix::count(size_t path, Status s) const {
  int n = 0;
  for (const Row& r : rows)
    for (const Cell& c : r.cells[path]) n += c.status == s;
  return n;
}

int Matrix::count_documented(size_t path) const {
  int n = 0;
  for (const Row& r : rows)
    for (const Cell& c : r.cells[path]) n += c.status == Status::Untested && c.documented;
  return n;
}

Matrix run(const Options& opt) {
  std::vector<const Path*> ps;
  for (const auto& p : paths()) {
    bool wanted = opt.paths.empty();
    for (const std::string& n : opt.paths) wanted = wanted || n == p->name();
    if (wanted) ps.push_back(p.get());
  }
  for (const std::string& n : opt.paths) {
    bool known = false;
    for (const auto& p : paths()) known = known || n == p->name();
    KILN_CHECK(known, Value, "conformance: no path named '", n, "' in this build");
  }
  Matrix m;
  m.paths.push_back("CPU");
  m.unavailable.push_back("");
  for (const Path* p : ps) {
    m.paths.push_back(p->name());
    m.unavailable.push_back(p->unavailable());
  }
  const std::vector<ScalarType>& dtypes = matrix_dtypes();
  const auto& registry = testing::op_sample_registry();
  for (const testing::ManifestRow& row : testing::manifest()) {
    if (!opt.op.empty() && row.name != opt.op) continue;
    const OperatorHandle& op = *row.op;
    std::vector<std::array<Tally, kMatrixDtypes>> tally(m.paths.size());
    auto backend_of = [&](size_t col) {
      return col == 0 ? testing::Backend::CPU : ps[col - 1]->claims();
    };
    auto key_of = [&](size_t col) { return col == 0 ? DispatchKey::CPU : ps[col - 1]->key(); };
    for (size_t col = 0; col < m.paths.size(); ++col)
      for (int d = 0; d < kMatrixDtypes; ++d)
        tally[col][d].claimed = row.claims_dtype(backend_of(col), dtypes[d]);

    auto it = registry.find(row.name);
    const std::vector<Stack> samples = it == registry.end() ? std::vector<Stack>{} : it->second();
    // Options::one_dtype_per_sample: the samples that have a float32 version run in it alone.
    std::vector<bool> in_float32(samples.size());
    if (opt.one_dtype_per_sample)
      for (size_t si = 0; si < samples.size(); ++si)
        in_float32[si] = testing::sample_in_dtype(samples[si], kFloat32, op.info()).has_value();
    for (int d = 0; d < kMatrixDtypes; ++d) {
      bool any_claim = false;
      for (size_t col = 0; col < m.paths.size(); ++col)
        any_claim = any_claim || tally[col][d].claimed;
      if (!any_claim) continue;
      // The samples in this dtype, and each again with its data laid out non-contiguously.
      // An in-place variant's sample whose functional result self cannot hold is no sample of
      // it; with no other, the variant does not claim the dtype (Note [Variant dtypes]).
      std::vector<std::pair<std::string, Stack>> cases;
      bool promoted = false;
      for (size_t si = 0; si < samples.size(); ++si) {
        if (opt.one_dtype_per_sample && dtypes[d] != kFloat32 && in_float32[si]) continue;
        std::optional<Stack> s = testing::sample_in_dtype(samples[si], dtypes[d], op.info());
        if (!s) continue;
        if (op.info().is_inplace) {
          const std::optional<ScalarType> r = testing::functional_result_dtype(op.info(), *s);
          if (r && !result_fits(*r, dtypes[d])) {
            promoted = true;
            continue;
          }
        }
        cases.emplace_back("sample " + std::to_string(si), *s);
        if (!opt.non_contiguous) continue;
        if (std::optional<Stack> nc = testing::non_contiguous_variant(*s))
          cases.emplace_back("sample " + std::to_string(si) + " (non-contiguous)", *nc);
      }
      if (cases.empty() && (promoted || opt.one_dtype_per_sample)) {
        for (size_t col = 0; col < m.paths.size(); ++col) tally[col][d].claimed = false;
        continue;
      }
      for (size_t si = 0; si < cases.size(); ++si) {
        const std::string& where = cases[si].first;
        const Stack* sample = &cases[si].second;
        const uint64_t seed = 1000 + si;
        Stack cpu_in = testing::clone_stack(*sample), cpu_out = cpu_in;
        bool cpu_ran = true;
        try {
          manual_seed(seed);
          op.call_boxed(cpu_out);
          if (tally[0][d].claimed) note(tally[0][d], Outcome::ok(), where);
        } catch (const Error& e) {
          // Eager CPU refusing the sample in this dtype is a missing kernel; other errors (the
          // sample outside what the op accepts in this dtype) leave nothing to compare. Either
          // way the other paths have no reference: untested, a gap (See Note [Untested cells]),
          // as where a GPU-only build lacks the CPU kernel.
          cpu_ran = false;
          const bool missing = is_missing_kernel(e);
          for (size_t col = 0; col < m.paths.size(); ++col) {
            if (!tally[col][d].claimed) continue;
            if (col == 0 && missing) {
              note(tally[col][d], Outcome::missing(e.what()), where);
            } else {
              note(tally[col][d],
                   Outcome::skipped(
                       std::string(missing ? "no eager CPU reference: " : "eager CPU raised: ") +
                       e.what()),
                   where);
            }
          }
        }
        if (!cpu_ran) continue;
        const std::vector<Call> calls = row.composite
                                            ? decomposition_calls(op, testing::clone_stack(*sample))
                                            : std::vector<Call>{};
        for (size_t col = 1; col < m.paths.size(); ++col) {
          Tally& t = tally[col][d];
          if (!t.claimed || !t.missing.empty()) continue;
          const std::string why = no_kernel(row, key_of(col), backend_of(col), calls);
          if (!why.empty()) {
            note(t, Outcome::missing(why), where);
            continue;
          }
          if (!m.unavailable[col].empty()) continue;
          // Each path gets a copy of its own: in-place ops and generators change what they run on.
          const Stack own = testing::clone_stack(*sample);
          const Case c{row, own, dtypes[d], static_cast<int>(si), cpu_in, cpu_out, seed, where};
          Outcome o;
          try {
            o = ps[col - 1]->run(c);
          } catch (const Error& e) {
            o = outcome_of_error(m.paths[col], e);
          } catch (const std::exception& e) {
            o = Outcome::failed(std::string("threw ") + e.what());
          }
          note(t, o, where);
        }
      }
    }
    Matrix::Row out{row.name, std::vector<std::array<Cell, kMatrixDtypes>>(m.paths.size())};
    for (size_t col = 0; col < m.paths.size(); ++col)
      for (int d = 0; d < kMatrixDtypes; ++d) {
        Tally& t = tally[col][d];
        // A claim of a non-composite row without a kernel for the key is missing whether or not
        // a sample ran in that dtype.
        if (t.claimed && t.missing.empty() && !row.composite && !op.has_kernel(key_of(col)))
          t.missing = no_kernel(row, key_of(col), backend_of(col), {});
        out.cells[col][d] = finish(t, m.unavailable[col]);
      }
    m.rows.push_back(std::move(out));
  }
  return m;
}

void print_summary(std::ostream& os, const Matrix& m) {
  os << "summary (cells: op x dtype):\n";
  for (size_t p = 0; p < m.paths.size(); ++p) {
    os << "  " << std::left << std::setw(8) << m.paths[p] << std::right;
    const int documented = m.count_documented(p);
    os << "  ok " << m.count(p, Status::Ok) << "  failed " << m.count(p, Status::Failed)
       << "  missing " << m.count(p, Status::Missing) << "  untested "
       << m.count(p, Status::Untested) - documented << "  untested, documented " << documented
       << "  not claimed " << m.count(p, Status::NotClaimed);
    if (!m.unavailable[p].empty()) os << "  (not run here: " << m.unavailable[p] << ")";
    os << "\n";
  }
}

void print_matrix(std::ostream& os, const Matrix& m) {
  size_t width = 4;
  for (const Matrix::Row& r : m.rows) width = std::max(width, r.op.size());
  os << "The support matrix: per path, one character per dtype, in the order b bool, u uint8,\n"
        "c int8, s int16, i int32, l int64, h float16, B bfloat16, f float32, d float64:\n"
        "o ok, F failed, M claimed but missing, ? claimed but untested here, . not claimed.\n"
        "tensor/ops/README.md \"The support matrix\" explains it.\n\n";
  os << std::left << std::setw(static_cast<int>(width)) << "op";
  for (const std::string& p : m.paths) os << "  " << std::setw(kMatrixDtypes) << p;
  os << "\n" << std::setw(static_cast<int>(width)) << "";
  for (size_t p = 0; p < m.paths.size(); ++p)
    os << "  "
       << "bucsilhBfd";
  os << std::right << "\n";
  for (const Matrix::Row& r : m.rows) {
    os << std::left << std::setw(static_cast<int>(width)) << r.op << std::right;
    for (const auto& cells : r.cells) {
      os << "  ";
      for (const Cell& c : cells) os << status_char(c.status);
    }
    os << "\n";
  }
  std::vector<Matrix::Problem> problems = m.problems();
  if (!problems.empty()) {
    os << "\nproblems:\n";
    for (const Matrix::Problem& p : problems)
      os << "  " << status_name(p.status) << "  " << p.path << "  " << p.op << "  "
         << scalar_type_name(p.dtype) << ": " << p.detail << "\n";
  }
  os << "\n";
  print_summary(os, m);
}

}  // namespace kiln::conformance
