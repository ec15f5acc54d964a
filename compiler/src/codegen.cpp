// Fusion and C++ code generation for captured programs (the Inductor role), and the on-disk
// cache of what it builds.
//
// Note [Fusion]: a fusion group is a run of pointwise nodes of one dtype (float32 or float64)
// and one contiguous shape whose op has a lowering below. A member's tensor arguments are values
// of the group, or values from outside it that are contiguous with the group's shape, hold
// one element, or (on the CPU) broadcast to the shape (Note [Broadcast inputs]). The group runs
// where its last member stood, so a node in between that reads a group value or has effects (Note
// [Passes]) closes it, and so does a change of phase (a compiled backward runs apart from its
// forward: Note [Compiled backward]). Values used after the group (by other nodes, as program
// outputs or as .grad writes) are its outputs; the others live in registers only. Each group
// becomes one loop, `for i < numel: out_k[i] = f(in_0[i], ...)`, vectorized by the compiler and
// parallel with OpenMP over large tensors. Bounds need no checks: the guards fix every input's
// geometry, so the loop covers exactly numel elements of each buffer. The expressions use <cmath>'s
// functions, so results may differ from the eager kernels' vectorized ones in the last bits (no
// -ffast-math, no FMA contraction).
//
// Note [Compile cache]: a program's groups become one C++ file, built with the system compiler
// into a shared object and loaded with dlopen. The file is cached under
// $KILN_CACHE_DIR (default $XDG_CACHE_HOME/kiln or ~/.cache/kiln) as <key>.so, keyed by a hash
// of the source, the flags and the compiler's version, next to <key>.sum, the hash of the
// object's bytes: an entry whose bytes do not match (truncated, altered) is rebuilt. Objects are
// written to a temporary name and renamed, so concurrent builds never see half a file. An
// unwritable cache directory falls back to a fresh temporary one, with a warning.
#include <dlfcn.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <map>
#include <optional>
#include <sstream>

#include "program.h"

namespace kiln::compiler::detail {
namespace {

namespace fs = std::filesystem;

// ---- lowerings ---------------------------------------------------------------------------------

using Lowering = std::function<std::string(const std::vector<std::string>& in, const ir::Node& n)>;

std::string scalar_attr(const ir::Node& n, int arg) {
  std::ostringstream os;
  os.precision(17);
  os << "T(" << n.args[arg].attribute().to_double() << ")";
  return os.str();
}

std::string str_attr(const ir::Node& n, int arg) {
  const IValue& v = n.args[arg].attribute();
  return v.is_none() ? "" : v.get<std::string>();
}

const std::map<std::string, Lowering>& lowerings() {
  static const std::map<std::string, Lowering> m = {
      {"add", [](auto& in, auto& n) { return "(" + in[0] + " + " + scalar_attr(n, 2) + " * " + in[1] + ")"; }},
      {"sub", [](auto& in, auto& n) { return "(" + in[0] + " - " + scalar_attr(n, 2) + " * " + in[1] + ")"; }},
      {"mul", [](auto& in, auto&) { return "(" + in[0] + " * " + in[1] + ")"; }},
      {"div", [](auto& in, auto&) { return "(" + in[0] + " / " + in[1] + ")"; }},
      {"neg", [](auto& in, auto&) { return "(-" + in[0] + ")"; }},
      {"exp", [](auto& in, auto&) { return "std::exp(" + in[0] + ")"; }},
      {"log", [](auto& in, auto&) { return "std::log(" + in[0] + ")"; }},
      {"tanh", [](auto& in, auto&) { return "std::tanh(" + in[0] + ")"; }},
      {"sin", [](auto& in, auto&) { return "std::sin(" + in[0] + ")"; }},
      {"cos", [](auto& in, auto&) { return "std::cos(" + in[0] + ")"; }},
      {"sqrt", [](auto& in, auto&) { return "std::sqrt(" + in[0] + ")"; }},
      {"rsqrt", [](auto& in, auto&) { return "(T(1) / std::sqrt(" + in[0] + "))"; }},
      {"abs", [](auto& in, auto&) { return "std::abs(" + in[0] + ")"; }},
      {"sigmoid", [](auto& in, auto&) { return "(T(1) / (T(1) + std::exp(-" + in[0] + ")))"; }},
      {"silu", [](auto& in, auto&) { return "(" + in[0] + " / (T(1) + std::exp(-" + in[0] + ")))"; }},
      {"relu", [](auto& in, auto&) { return "relu(" + in[0] + ")"; }},
      {"maximum", [](auto& in, auto&) { return "maximum(" + in[0] + ", " + in[1] + ")"; }},
      {"minimum", [](auto& in, auto&) { return "minimum(" + in[0] + ", " + in[1] + ")"; }},
      {"gelu", [](auto& in, auto& n) {
         return (str_attr(n, 1) == "tanh" ? "gelu_tanh(" : "gelu_erf(") + in[0] + ")";
       }},
      {"gelu_backward", [](auto& in, auto& n) {
         return (str_attr(n, 2) == "tanh" ? "gelu_tanh_bwd(" : "gelu_erf_bwd(") + in[0] + ", " +
                in[1] + ")";
       }},
      {"threshold_backward", [](auto& in, auto& n) {
         return "(" + in[1] + " <= " + scalar_attr(n, 2) + " ? T(0) : " + in[0] + ")";
       }},
  };
  return m;
}

// Helpers every generated file starts with, for both targets: @FN@ is how a helper is declared
// and @M@ where the math functions live (prelude()). NaN propagates through relu and
// maximum/minimum as it does in the eager kernels.
constexpr const char* kPreludeTemplate = R"(
template <typename T> @FN@ T relu(T x) { return @M@isnan(x) ? x : (x > T(0) ? x : T(0)); }
template <typename T> @FN@ T maximum(T a, T b) { return @M@isnan(a) || @M@isnan(b) ? a + b : (a > b ? a : b); }
template <typename T> @FN@ T minimum(T a, T b) { return @M@isnan(a) || @M@isnan(b) ? a + b : (a < b ? a : b); }
template <typename T> @FN@ T gelu_erf(T x) { return T(0.5) * x * (T(1) + @M@erf(x * T(0.70710678118654752440))); }
template <typename T> @FN@ T gelu_erf_bwd(T g, T x) {
  T cdf = T(0.5) * (T(1) + @M@erf(x * T(0.70710678118654752440)));
  T pdf = @M@exp(T(-0.5) * x * x) * T(0.39894228040143267794);
  return g * (cdf + x * pdf);
}
template <typename T> @FN@ T gelu_tanh(T x) {
  T inner = T(0.79788456080286535588) * (x + T(0.044715) * x * x * x);
  return T(0.5) * x * (T(1) + @M@tanh(inner));
}
template <typename T> @FN@ T gelu_tanh_bwd(T g, T x) {
  T inner = T(0.79788456080286535588) * (x + T(0.044715) * x * x * x);
  T t = @M@tanh(inner);
  T d = T(0.79788456080286535588) * (T(1) + T(3) * T(0.044715) * x * x);
  return g * (T(0.5) * (T(1) + t) + T(0.5) * x * (T(1) - t * t) * d);
}
)";

std::string replace_all(std::string s, const std::string& from, const std::string& to) {
  for (size_t at = s.find(from); at != std::string::npos; at = s.find(from, at + to.size()))
    s.replace(at, from.size(), to);
  return s;
}

std::string prelude(bool cuda) {
  std::string s =
      replace_all(kPreludeTemplate, "@FN@", cuda ? "__device__ inline" : "static inline");
  s = replace_all(s, "@M@", cuda ? "" : "std::");
  return (cuda ? "typedef long long int64_t;\n" : "#include <cmath>\n#include <cstdint>\n") + s;
}

// ---- grouping ------------------------------------------------------------------------------

// The C type of a one-element input the loop reads (nullptr: not readable).
const char* c_type(ScalarType t) {
  switch (t) {
    case kFloat32: return "float";
    case kFloat64: return "double";
    case kInt64: return "int64_t";
    default: return nullptr;
  }
}

bool contiguous(const TensorSpec& s) { return s.strides.ref() == contiguous_strides(s.sizes).ref(); }

// Note [Broadcast inputs]: on the CPU a group also reads inputs that broadcast to its shape (a
// conv's bias viewed as (1, C, 1, 1), a row of positions), or that are views with other strides.
// Such an input's strides, broadcast to the group's shape (0 where it broadcasts), are split
// into an outer part and an inner run: the longest trailing dims over which every stride is 0
// (the input holds one value for the run) or over which the input is laid out as the group
// (it holds the run contiguously). The loop then runs over outer indices, finds each such
// input's start from the outer index once, and runs a vectorized inner loop over the shortest
// run of the group's inputs. Runs under kMinRun elements are not fused.
constexpr int64_t kMinRun = 8;

// `s`'s strides broadcast to `shape`, or nullopt when its sizes do not broadcast to it.
std::optional<DimVector> broadcast_strides(const TensorSpec& s, const DimVector& shape) {
  const size_t r = shape.size(), sr = s.sizes.size();
  if (sr > r) return std::nullopt;
  DimVector st(r, 0);
  for (size_t k = 0; k < sr; ++k) {
    const int64_t size = s.sizes[sr - 1 - k], want = shape[r - 1 - k];
    if (size == want)
      st[r - 1 - k] = size == 1 ? 0 : s.strides[sr - 1 - k];
    else if (size != 1)
      return std::nullopt;
  }
  return st;
}

// The first dim of `s`'s inner run over `shape` (Note [Broadcast inputs]): shape.size() when it
// has none; -1 when it does not broadcast.
int64_t run_start(const TensorSpec& s, const DimVector& shape) {
  const std::optional<DimVector> st = broadcast_strides(s, shape);
  if (!st) return -1;
  const int64_t r = static_cast<int64_t>(shape.size());
  int64_t zero = r, dense = r, expect = 1;
  for (int64_t d = r - 1; d >= 0; --d) {
    const bool trivial = shape[d] == 1;
    if (zero == d + 1 && ((*st)[d] == 0 || trivial)) zero = d;
    if (dense == d + 1 && ((*st)[d] == expect || trivial)) dense = d;
    expect *= shape[d];
  }
  return std::min(zero, dense);
}

// The length of that run in elements (0 when `s` does not broadcast to `shape`).
int64_t run_of(const TensorSpec& s, const DimVector& shape) {
  const int64_t d = run_start(s, shape);
  if (d < 0) return 0;
  int64_t n = 1;
  for (size_t k = static_cast<size_t>(d); k < shape.size(); ++k) n *= shape[k];
  return n;
}

// Whether node i can be a member of a group of `shape` and `dtype` given the values already in it.
bool fits(const Program& p, size_t i, const std::map<ir::ValueId, bool>& in_group,
          const DimVector& shape, ScalarType dtype, bool any_device) {
  const ir::Node& n = p.graph.nodes()[i];
  if (!lowerings().count(n.op_name) || n.outputs.size() != 1 || p.generators[i] || n.rng)
    return false;
  if (n.op_name == "div" && !n.args[2].attribute().is_none()) return false;  // trunc, floor
  const TensorSpec& out = p.graph.value(n.outputs[0]).meta;
  if (out.dtype != dtype || out.sizes.ref() != shape.ref() || !contiguous(out) || out.offset != 0 ||
      (!any_device && !out.device.is_cpu()) || out.alias_of >= 0)
    return false;
  for (const ir::NodeArg& a : n.args) {
    if (a.is_value_list()) return false;
    if (!a.is_value()) continue;
    const ir::ValueId v = a.values()[0];
    if (in_group.count(v)) continue;
    const TensorSpec& s = p.graph.value(v).meta;
    if (!any_device && !s.device.is_cpu()) return false;
    if (numel_of(s.sizes) == 1) {  // a one-element input, such as a wrapped number, of any dtype
      if (c_type(s.dtype) == nullptr || (s.dtype != dtype && !s.wrapped_number)) return false;
      continue;
    }
    if (s.dtype != dtype) return false;
    if (flat_input(s, shape)) continue;
    // See Note [Broadcast inputs]: the CPU loop reads it in runs of kMinRun elements or more.
    if (any_device || run_of(s, shape) < kMinRun) return false;
  }
  return true;
}

std::vector<FusedKernel> find_groups(const Program& p, bool any_device = false) {
  const auto& nodes = p.graph.nodes();
  std::vector<FusedKernel> groups;
  FusedKernel cur;
  std::map<ir::ValueId, bool> in_group;
  auto close = [&] {
    if (cur.members.size() >= 2) groups.push_back(cur);
    cur = FusedKernel();
    in_group.clear();
  };
  for (size_t i = 0; i < nodes.size(); ++i) {
    const ir::Node& n = nodes[i];
    bool candidate = lowerings().count(n.op_name) && n.outputs.size() == 1;
    if (candidate) {
      const TensorSpec& out = p.graph.value(n.outputs[0]).meta;
      candidate = (out.dtype == kFloat32 || out.dtype == kFloat64);
      if (candidate && !cur.members.empty() && p.phases[i] == p.phases[cur.members[0]] &&
          fits(p, i, in_group, cur.sizes, cur.dtype, any_device)) {
        cur.members.push_back(i);
        in_group[n.outputs[0]] = true;
        continue;
      }
      if (candidate) {
        close();
        if (fits(p, i, in_group, out.sizes, out.dtype, any_device)) {
          cur.sizes = out.sizes;
          cur.dtype = out.dtype;
          cur.members.push_back(i);
          in_group[n.outputs[0]] = true;
          continue;
        }
      }
    }
    // Not a member: it closes the group if it reads a group value or has effects.
    bool reads = false;
    for (ir::ValueId v : n.inputs()) reads = reads || in_group.count(v);
    if (reads || has_effects(p, i)) close();
  }
  close();
  return groups;
}

// The members' expressions, one `const T v<id> = ...;` line each; fills the group's inputs and
// outputs. `input(j, spec)` declares input j and returns how the loop reads it.
std::string loop_body(const Program& p, FusedKernel& k, const std::vector<bool>& used_later,
                      const std::function<std::string(size_t, const TensorSpec&)>& input) {
  const auto& nodes = p.graph.nodes();
  std::map<ir::ValueId, std::string> expr;
  std::ostringstream body;
  for (size_t i : k.members) {
    const ir::Node& n = nodes[i];
    std::vector<std::string> in;
    for (const ir::NodeArg& a : n.args) {
      if (!a.is_value()) continue;
      const ir::ValueId v = a.values()[0];
      if (!expr.count(v)) {  // an input of the group
        expr[v] = input(k.inputs.size(), p.graph.value(v).meta);
        k.inputs.push_back(v);
      }
      in.push_back(expr.at(v));
    }
    const ir::ValueId out = n.outputs[0];
    body << "    const T v" << out << " = " << lowerings().at(n.op_name)(in, n) << ";\n";
    expr[out] = "v" + std::to_string(out);
    if (used_later[out]) k.outputs.push_back(out);
  }
  return body.str();
}

const char* value_type(ScalarType t) { return t == kFloat64 ? "double" : "float"; }

// The group as a C++ function over arrays of pointers, an OpenMP loop; with broadcast inputs,
// an outer loop over runs and a vectorized inner one (Note [Broadcast inputs]).
std::string emit(const Program& p, FusedKernel& k, const std::vector<bool>& used_later) {
  const int64_t r = static_cast<int64_t>(k.sizes.size());
  int64_t start = 0;  // the group's inner run: the dims from `start` on, the shortest input's
  bool strided = false;
  for (size_t i : k.members)
    for (ir::ValueId v : p.graph.nodes()[i].inputs()) {
      const TensorSpec& s = p.graph.value(v).meta;
      if (numel_of(s.sizes) == 1 || flat_input(s, k.sizes)) continue;
      strided = true;
      start = std::max(start, run_start(s, k.sizes));
    }
  int64_t inner = 1;
  for (int64_t d = start; d < r; ++d) inner *= k.sizes[d];
  std::ostringstream loads, starts;
  const std::string body = loop_body(p, k, used_later, [&](size_t j, const TensorSpec& spec) {
    const std::string idx = std::to_string(j);
    if (numel_of(spec.sizes) == 1) {
      loads << "  const T s" << idx << " = static_cast<T>(*static_cast<const " << c_type(spec.dtype)
            << "*>(ins[" << idx << "]));\n";
      return "s" + idx;
    }
    loads << "  const T* in" << idx << " = static_cast<const T*>(ins[" << idx << "]);\n";
    if (!strided || flat_input(spec, k.sizes)) return "in" + idx + "[i]";
    // This run's start, from the outer index o, and whether the run holds one value or many.
    const DimVector st = *broadcast_strides(spec, k.sizes);
    starts << "    const T* b" << idx << " = in" << idx;
    for (int64_t d = start - 1, below = 1; d >= 0; below *= k.sizes[d], --d)
      if (st[d] != 0 && k.sizes[d] != 1)
        starts << " + (o / " << below << " % " << k.sizes[d] << ") * " << st[d];
    starts << ";\n";
    bool dense = false;  // the run holds many values (else one)
    for (int64_t d = start; d < r; ++d) dense = dense || (k.sizes[d] != 1 && st[d] != 0);
    return "b" + idx + (dense ? "[j]" : "[0]");
  });
  std::ostringstream os;
  os << "extern \"C\" void " << k.name
     << "(const void* const* ins, void* const* outs, int64_t n) {\n"
     << "  using T = " << value_type(k.dtype) << ";\n"
     << loads.str();
  for (size_t j = 0; j < k.outputs.size(); ++j)
    os << "  T* out" << j << "[[maybe_unused]] = static_cast<T*>(outs[" << j << "]);\n";
  std::ostringstream stores;
  for (size_t j = 0; j < k.outputs.size(); ++j)
    stores << "    out" << j << "[i] = v" << k.outputs[j] << ";\n";
  if (!strided) {
    os << "#pragma omp parallel for simd if (n >= 65536)\n"
       << "  for (int64_t i = 0; i < n; ++i) {\n"
       << body << stores.str() << "  }\n}\n";
    return os.str();
  }
  os << "#pragma omp parallel for if (n >= 65536)\n"
     << "  for (int64_t o = 0; o < n / " << inner << "; ++o) {\n"
     << starts.str() << "#pragma omp simd\n"
     << "  for (int64_t j = 0; j < " << inner << "; ++j) {\n"
     << "    const int64_t i = o * " << inner << " + j;\n"
     << body << stores.str() << "  }\n  }\n}\n";
  return os.str();
}

// A member's value is an output of its group when anything outside the group reads it.
std::vector<bool> group_outputs(const Program& p, const std::vector<FusedKernel>& groups) {
  std::vector<bool> used_later = program_results(p);
  std::vector<int> group_of(p.graph.nodes().size(), -1);
  std::map<ir::ValueId, int> made_by_group;
  for (size_t g = 0; g < groups.size(); ++g)
    for (size_t i : groups[g].members) {
      group_of[i] = static_cast<int>(g);
      made_by_group[p.graph.nodes()[i].outputs[0]] = static_cast<int>(g);
    }
  for (size_t i = 0; i < p.graph.nodes().size(); ++i)
    for (ir::ValueId v : p.graph.nodes()[i].inputs()) {
      auto it = made_by_group.find(v);
      if (it == made_by_group.end() || it->second != group_of[i]) used_later[v] = true;
    }
  return used_later;
}

// ---- building and the cache (Note [Compile cache]) -----------------------------------------

uint64_t fnv1a(std::string_view s, uint64_t h = 1469598103934665603ull) {
  for (unsigned char c : s) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

std::string hex(uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

std::string run_capture(const std::string& cmd) {
  std::string out;
  if (FILE* f = popen(cmd.c_str(), "r")) {
    char buf[256];
    while (fgets(buf, sizeof buf, f)) out += buf;
    pclose(f);
  }
  return out;
}

std::string quoted(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

// The C++ compiler: $CXX, else c++ or g++ on PATH; with its version line. Looked up once per
// ($CXX, $PATH).
std::pair<std::string, std::string> compiler() {
  static std::map<std::string, std::pair<std::string, std::string>> found;
  const char* cxx_env = std::getenv("CXX");
  const char* path_env = std::getenv("PATH");
  const std::string key = std::string(cxx_env ? cxx_env : "") + '\n' + (path_env ? path_env : "");
  auto it = found.find(key);
  if (it != found.end()) return it->second;
  return found[key] = [] {
    std::vector<std::string> tries;
    if (const char* cxx = std::getenv("CXX"); cxx && *cxx) tries.push_back(cxx);
    tries.push_back("c++");
    tries.push_back("g++");
    for (const std::string& c : tries) {
      std::string v = run_capture(quoted(c) + " --version 2>/dev/null");
      if (!v.empty()) return std::make_pair(c, v.substr(0, v.find('\n')));
    }
    return std::make_pair(std::string(), std::string());
  }();
}

std::string read_file(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::ostringstream os;
  os << f.rdbuf();
  return os.str();
}

bool writable_dir(const fs::path& d) {
  std::error_code ec;
  fs::create_directories(d, ec);
  const fs::path probe = d / (".probe." + std::to_string(getpid()));
  {
    std::ofstream f(probe);
    if (!f) return false;
  }
  fs::remove(probe, ec);
  return true;
}

fs::path cache_dir(std::vector<std::string>* warnings) {
  fs::path d;
  if (const char* e = std::getenv("KILN_CACHE_DIR"); e && *e) d = e;
  else if (const char* x = std::getenv("XDG_CACHE_HOME"); x && *x) d = fs::path(x) / "kiln";
  else if (const char* h = std::getenv("HOME"); h && *h) d = fs::path(h) / ".cache" / "kiln";
  else d = fs::temp_directory_path() / "kiln-cache";
  if (writable_dir(d)) return d;
  static const fs::path fallback = [] {
    std::string tmpl = (fs::temp_directory_path() / "kiln-compile-XXXXXX").string();
    return fs::path(mkdtemp(tmpl.data()) ? tmpl : fs::temp_directory_path().string());
  }();
  if (warnings)
    warnings->push_back("the compile cache " + d.string() + " is not writable; using " +
                        fallback.string());
  return fallback;
}

std::string emit_cuda(const Program& p, FusedKernel& k, const std::vector<bool>& used_later);

// The source of every group, named kiln_fused_<i>, for the host or for CUDA.
std::string generate(const Program& p, std::vector<FusedKernel>& groups, bool cuda) {
  const std::vector<bool> used_later = group_outputs(p, groups);
  std::string src = prelude(cuda);
  for (size_t g = 0; g < groups.size(); ++g) {
    groups[g].name = "kiln_fused_" + std::to_string(g);
    groups[g].label = groups[g].name + "(";
    for (size_t m : groups[g].members)
      groups[g].label += p.graph.nodes()[m].op_name + (m == groups[g].members.back() ? ")" : ",");
    groups[g].numel = numel_of(groups[g].sizes);
    src += cuda ? emit_cuda(p, groups[g], used_later) : emit(p, groups[g], used_later);
  }
  return src;
}

}  // namespace

bool flat_input(const TensorSpec& s, const DimVector& shape) {
  return s.sizes.ref() == shape.ref() && contiguous(s);
}

bool fusion_enabled() {
  const char* e = std::getenv("KILN_COMPILE_FUSE");
  return !(e && std::string(e) == "0");
}

std::string compiler_problem() {
  if (!compiler().first.empty()) return "";
  return "kiln.compile: no C++ compiler found (tried $CXX, c++ and g++); install one "
         "(apt-get install g++) or set CXX, or set KILN_COMPILE_FUSE=0 to replay without fused "
         "code";
}

std::string fuse(Program& p) {
  if (!fusion_enabled()) return "";
  std::vector<FusedKernel> groups = find_groups(p);
  if (groups.empty()) return "";
  const auto [cxx, version] = compiler();
  if (cxx.empty()) return "no C++ compiler found";

  const std::string src = generate(p, groups, /*cuda=*/false);
  const std::string flags = "-O3 -march=native -fopenmp -ffp-contract=off -fPIC -shared -std=c++17";
  const std::string key = hex(fnv1a(version, fnv1a(flags, fnv1a(src))));
  std::vector<std::string> warnings;
  const fs::path dir = cache_dir(&warnings);
  for (const std::string& w : warnings) std::cerr << "kiln.compile: warning: " << w << "\n";
  const fs::path so = dir / (key + ".so"), sum = dir / (key + ".sum");
  std::string note;
  std::string bytes = fs::exists(so) ? read_file(so) : std::string();
  const bool cached = !bytes.empty() && fs::exists(sum) && read_file(sum) == hex(fnv1a(bytes));
  if (!cached) {
    if (fs::exists(so)) note = "cache entry " + so.string() + " did not match its hash; rebuilt";
    const std::string tag = "." + std::to_string(getpid()) + ".tmp";
    const fs::path cpp = dir / (key + ".cpp"), tmp = dir / (key + ".so" + tag),
                   log = dir / (key + ".log" + tag);
    { std::ofstream(cpp) << src; }
    const std::string cmd = quoted(cxx) + " " + flags + " -o " + quoted(tmp.string()) + " " +
                            quoted(cpp.string()) + " > " + quoted(log.string()) + " 2>&1";
    const int rc = std::system(cmd.c_str());
    std::error_code ec;
    if (rc != 0) {
      std::string msg = read_file(log);
      fs::remove(tmp, ec);
      fs::remove(log, ec);
      return "fused code did not compile (" + cpp.string() + "): " + msg.substr(0, 2000);
    }
    fs::remove(log, ec);
    bytes = read_file(tmp);
    { std::ofstream(sum.string() + tag) << hex(fnv1a(bytes)); }
    fs::rename(tmp, so, ec);
    fs::rename(sum.string() + tag, sum, ec);
  }
  // The checked bytes are loaded from a private copy: the loader would hand back an object
  // already loaded from the same path, and a cache file changed later must not change code
  // that runs.
  static std::atomic<int> loads{0};
  const fs::path copy = fs::temp_directory_path() /
                        ("kiln-" + key + "." + std::to_string(getpid()) + "." +
                         std::to_string(loads++) + ".so");
  { std::ofstream(copy, std::ios::binary) << bytes; }
  void* handle = dlopen(copy.c_str(), RTLD_NOW | RTLD_LOCAL);
  std::error_code ec;
  fs::remove(copy, ec);
  if (handle == nullptr) return std::string("cannot load ") + so.string() + ": " + dlerror();
  p.library = std::shared_ptr<void>(handle, [](void* h) { dlclose(h); });
  for (FusedKernel& k : groups) {
    k.fn = reinterpret_cast<FusedKernel::Fn>(dlsym(handle, k.name.c_str()));
    if (k.fn == nullptr) return "cannot find " + k.name + " in " + so.string();
  }
  p.kernels = std::move(groups);
  p.cache_note = note;
  return "";
}

// ---- CUDA through NVRTC ----------------------------------------------------------------------
//
// Note [CUDA fusion]: the same groups (Note [Fusion]) as CUDA kernels, one thread per element,
// each input and output a kernel parameter, compiled to PTX by NVRTC. NVRTC is loaded with
// dlopen when first asked for (libnvrtc.so.13, libnvrtc.so, then $CUDA_HOME/lib64), so builds and
// machines without CUDA need nothing. Only generation and compilation exist so far: launching
// the kernels on CUDA tensors needs the driver API and a GPU to test it, so programs on CUDA
// replay unfused.

namespace {

std::string emit_cuda(const Program& p, FusedKernel& k, const std::vector<bool>& used_later) {
  std::vector<std::string> params;
  const std::string body = loop_body(p, k, used_later, [&](size_t j, const TensorSpec& spec) {
    const std::string idx = std::to_string(j);
    if (numel_of(spec.sizes) == 1) {
      params.push_back(std::string("const ") + c_type(spec.dtype) + "* __restrict__ s" + idx);
      return "static_cast<T>(s" + idx + "[0])";
    }
    params.push_back("const T* __restrict__ in" + idx);
    return "in" + idx + "[i]";
  });
  std::ostringstream os;
  os << "template <typename T> __device__ inline void " << k.name << "_body(";
  std::ostringstream sig;
  for (const std::string& q : params) sig << q << ", ";
  for (size_t j = 0; j < k.outputs.size(); ++j) sig << "T* __restrict__ out" << j << ", ";
  sig << "int64_t i";
  os << sig.str() << ") {\n" << replace_all(body, "std::", "");
  for (size_t j = 0; j < k.outputs.size(); ++j)
    os << "    out" << j << "[i] = v" << k.outputs[j] << ";\n";
  os << "}\n";
  // The kernel: T fixed, every pointer a parameter, n elements.
  std::string kparams = replace_all(sig.str(), "T*", std::string(value_type(k.dtype)) + "*");
  kparams = replace_all(kparams, "int64_t i", "int64_t n");
  std::ostringstream call;
  for (size_t j = 0; j < params.size(); ++j)
    call << (j < k.inputs.size() && numel_of(p.graph.value(k.inputs[j]).meta.sizes) == 1 ? "s"
                                                                                         : "in")
         << j << ", ";
  for (size_t j = 0; j < k.outputs.size(); ++j) call << "out" << j << ", ";
  os << "extern \"C\" __global__ void " << k.name << "(" << kparams << ") {\n"
     << "  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;\n"
     << "  if (i < n) " << k.name << "_body<" << value_type(k.dtype) << ">(" << call.str()
     << "i);\n}\n";
  return os.str();
}

// NVRTC's entry points, loaded once.
struct Nvrtc {
  using Create = int (*)(void**, const char*, const char*, int, const char* const*,
                         const char* const*);
  using Compile = int (*)(void*, int, const char* const*);
  using Size = int (*)(void*, size_t*);
  using Get = int (*)(void*, char*);
  using Destroy = int (*)(void**);
  Create create = nullptr;
  Compile compile = nullptr;
  Size ptx_size = nullptr, log_size = nullptr;
  Get ptx = nullptr, log = nullptr;
  Destroy destroy = nullptr;
  std::string error;
};

const Nvrtc& nvrtc() {
  static const Nvrtc n = [] {
    Nvrtc r;
    std::vector<std::string> names = {"libnvrtc.so.13", "libnvrtc.so"};
    const char* home = std::getenv("CUDA_HOME");
    names.push_back(std::string(home && *home ? home : "/usr/local/cuda") + "/lib64/libnvrtc.so");
    void* h = nullptr;
    for (const std::string& name : names)
      if ((h = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL)) != nullptr) break;
    if (h == nullptr) {
      r.error = "NVRTC not found (libnvrtc.so.13; install the CUDA toolkit or set CUDA_HOME)";
      return r;
    }
    r.create = reinterpret_cast<Nvrtc::Create>(dlsym(h, "nvrtcCreateProgram"));
    r.compile = reinterpret_cast<Nvrtc::Compile>(dlsym(h, "nvrtcCompileProgram"));
    r.ptx_size = reinterpret_cast<Nvrtc::Size>(dlsym(h, "nvrtcGetPTXSize"));
    r.ptx = reinterpret_cast<Nvrtc::Get>(dlsym(h, "nvrtcGetPTX"));
    r.log_size = reinterpret_cast<Nvrtc::Size>(dlsym(h, "nvrtcGetProgramLogSize"));
    r.log = reinterpret_cast<Nvrtc::Get>(dlsym(h, "nvrtcGetProgramLog"));
    r.destroy = reinterpret_cast<Nvrtc::Destroy>(dlsym(h, "nvrtcDestroyProgram"));
    if (!r.create || !r.compile || !r.ptx_size || !r.ptx || !r.log_size || !r.log || !r.destroy)
      r.error = "NVRTC lacks an entry point this build uses";
    return r;
  }();
  return n;
}

}  // namespace

std::string cuda_source(Program& p) {
  std::vector<FusedKernel> groups = find_groups(p, /*any_device=*/true);
  if (groups.empty()) return "";
  return generate(p, groups, /*cuda=*/true);
}

std::string nvrtc_compile(const std::string& src, const std::string& arch, std::string* ptx) {
  const Nvrtc& n = nvrtc();
  if (!n.error.empty()) return n.error;
  void* prog = nullptr;
  if (n.create(&prog, src.c_str(), "kiln_fused.cu", 0, nullptr, nullptr) != 0)
    return "nvrtcCreateProgram failed";
  const std::string opt_arch = "--gpu-architecture=" + arch;
  const char* opts[] = {opt_arch.c_str(), "--std=c++17", "--fmad=false"};
  const int rc = n.compile(prog, 3, opts);
  std::string out;
  if (rc != 0) {
    size_t size = 0;
    n.log_size(prog, &size);
    std::string log(size, '\0');
    if (size) n.log(prog, log.data());
    out = "NVRTC could not compile the fused kernels: " + log;
  } else {
    size_t size = 0;
    n.ptx_size(prog, &size);
    ptx->assign(size, '\0');
    n.ptx(prog, ptx->data());
  }
  n.destroy(&prog);
  return out;
}

}  // namespace kiln::compiler::detail
