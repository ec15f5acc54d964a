// A gang's commands on a worker: device meshes (Note [Remote DTensor] in kiln/dist/remote.h),
// releases and redistributions (Note [FSDP on a gang]), transfers (Note [Gang stages] in
// kiln/client/transport.h) and checkpoints (Note [Gang checkpoints] in kiln/dist/remote.h). The
// executor is session.cpp; what both share, session_state.h.
#include <absl/strings/str_cat.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstring>
#include <vector>

#include "kiln/dist/checkpoint.h"
#include "kiln/dist/remote.h"
#include "kiln/generated/ops.h"
#include "session_state.h"

namespace kiln::worker::session_detail {

void run_mesh(State& s, const SessionOptions& opt, const proto::MeshCreate& m) {
  if (s.roots.contains(m.root()) || s.failed_roots.contains(m.root()))
    throw StreamError{absl::StrCat("MeshCreate: device mesh ", m.root(), " exists already")};
  try {
    KILN_CHECK(dist::is_initialized(), Runtime,
               "init_device_mesh: this worker has no process group: a device mesh needs a gang "
               "of workers from a coordinator (kiln.connect(COORDINATOR, workers=N)), not "
               "embedded workers or a single worker");
    std::vector<std::string> names(m.names().begin(), m.names().end());
    s.roots.emplace(m.root(), dist::init_device_mesh(opt.device.is_cuda() ? "cuda" : "cpu",
                                                     {m.shape().begin(), m.shape().end()}, names));
  } catch (const Error& x) {
    ErrorPtr err = make_error(code_of(x), kind_name(x.kind()), x.what(), 0, "init_device_mesh");
    s.failed_roots.emplace(m.root(), err);
    fail(s, err);
  } catch (const std::exception& x) {
    ErrorPtr err = make_error("INTERNAL", "runtime", x.what(), 0, "init_device_mesh");
    s.failed_roots.emplace(m.root(), err);
    fail(s, err);
  }
}

void run_release(State& s, const proto::Release& r) {
  for (int64_t id : r.ids()) {
    auto it = s.values.find(id);
    if (it == s.values.end() || it->second.error || !it->second.t.defined()) continue;
    const auto& st = it->second.t.impl()->storage();
    if (s.released.contains(st.get())) continue;
    auto use = s.storages.find(st.get());
    if (use != s.storages.end()) {  // the table's count follows the memory
      s.in_use.fetch_sub(use->second.bytes, std::memory_order_relaxed);
      use->second.bytes = 0;
    }
    s.released.emplace(st.get(), st->nbytes());
    st->resize(0);
  }
}

// A Redistribute `into` a Released value: its memory back, and the result copied in.
static void refill(State& s, const SessionOptions& opt, int64_t id, const Tensor& result) {
  auto it = s.values.find(id);
  KILN_CHECK(it != s.values.end() && !it->second.error && it->second.t.defined(), Value,
             "redistribute into value id ", id, ": no such value");
  const Tensor& out = it->second.t;
  const auto& st = out.impl()->storage();
  auto rel = s.released.find(st.get());
  KILN_CHECK(rel != s.released.end(), Value, "redistribute into value id ", id,
             ": the value was not released");
  KILN_CHECK(out.sizes() == result.sizes() && out.dtype() == result.dtype(), Value,
             "redistribute into value id ", id, " of shape ", out.sizes(),
             ": the result has shape ", result.sizes());
  const uint64_t bytes = rel->second, used = s.in_use.load(std::memory_order_relaxed);
  if (opt.memory_limit_bytes && used + bytes > opt.memory_limit_bytes)
    KILN_FAIL(Runtime, memory_message(opt.memory_limit_bytes, "redistribute", bytes, used),
              " (out of memory)");
  st->resize(bytes);
  s.released.erase(rel);
  auto use = s.storages.find(st.get());
  if (use != s.storages.end()) {
    use->second.bytes = bytes;
    s.in_use.fetch_add(bytes, std::memory_order_relaxed);
  }
  out.copy_(result);
}

void run_redistribute(State& s, const SessionOptions& opt, const proto::Redistribute& r) {
  const int64_t id = r.output();
  if (id <= 0 || (!r.into() && (s.values.contains(id) || s.pending.contains(id))))
    throw StreamError{absl::StrCat("redistribute (seq ", r.seq(), "): output id ", id,
                                   " is not > 0 or is already in use")};
  ErrorPtr err;
  try {
    auto it = s.values.find(r.input());
    KILN_CHECK(it != s.values.end(), Value, "redistribute: ", missing_value(s, r.input()));
    if (it->second.error) {
      err = it->second.error;
    } else {
      const Tensor& local = it->second.t;
      check_resident(s, "redistribute", r.input(), local);
      dist::DTensorSpec spec = decode_spec(s, r.from(), local);
      dist::Placements to =
          dist::detail::check_placements("redistribute", spec.mesh, decode_placements(r.to()),
                                         static_cast<int64_t>(spec.shape.size()));
      Tensor result = dist::detail::redistribute_local(local, spec, to);
      if (r.into()) {
        refill(s, opt, id, result);
        return;
      }
      const uint64_t need = result.impl()->storage()->nbytes(),
                     used = s.in_use.load(std::memory_order_relaxed);
      if (!opt.memory_limit_bytes || used + need <= opt.memory_limit_bytes ||
          s.storages.contains(result.impl()->storage().get())) {
        bind(s, id, std::move(result), nullptr);
        return;
      }
      err = make_error("RESOURCE_EXHAUSTED", "runtime",
                       memory_message(opt.memory_limit_bytes, "redistribute", need, used), r.seq(),
                       "redistribute");
    }
  } catch (const Error& x) {
    err = make_error(code_of(x), kind_name(x.kind()), x.what(), r.seq(), "redistribute");
  } catch (const std::exception& x) {
    err = make_error("INTERNAL", "runtime", x.what(), r.seq(), "redistribute");
  }
  if (!r.into() || s.values.contains(id)) bind(s, id, Tensor(), err);  // no stray id for `into`
  fail(s, err);
}

// Note [Gang stages] (kiln/client/transport.h): a Transfer pairs src[i] with dst[i]. The command
// is checked whole first (every worker it names reaches the same verdict, so none sends or waits
// alone). A sender then sends a status word (0: the value follows; 1: it is missing, failed, or
// not of the command's dtype and shape here, and this worker's error says why), so a receiver
// never waits for data that will not come, and every message sent is received: a receiver over
// its memory limit takes the data and drops it, binding the error. A send is not waited for (its
// peer may not have reached the Transfer yet); a receive is.
constexpr int kTransferTag = 7;

void run_transfer(State& s, const SessionOptions& opt, const proto::Transfer& t) {
  const int64_t id = t.output();
  const int me = dist::is_initialized() ? dist::default_group()->rank() : -1;
  const bool receives = std::find(t.dst().begin(), t.dst().end(), me) != t.dst().end();
  if (receives && (id <= 0 || s.values.contains(id) || s.pending.contains(id)))
    throw StreamError{absl::StrCat("transfer (seq ", t.seq(), "): output id ", id,
                                   " is not > 0 or is already in use")};
  std::erase_if(s.sends, [](auto& w) { return w.first->is_completed(); });
  ErrorPtr err;
  auto error = [&](const Error& x) {
    return make_error(code_of(x), kind_name(x.kind()), x.what(), t.seq(), "transfer");
  };
  try {
    KILN_CHECK(dist::is_initialized(), Runtime,
               "transfer: this worker has no process group (transfers move values between the "
               "workers of a gang)");
    const auto& group = dist::default_group();
    KILN_CHECK(t.src_size() == t.dst_size(), Value, "transfer: ", t.src_size(), " senders for ",
               t.dst_size(), " receivers");
    for (int i = 0; i < t.src_size(); ++i)
      KILN_CHECK(t.src(i) >= 0 && t.src(i) < group->size() && t.dst(i) >= 0 &&
                     t.dst(i) < group->size() && t.src(i) != t.dst(i),
                 Value, "transfer: worker ", t.src(i), " to worker ", t.dst(i),
                 " is not a pair of distinct ranks of a gang of ", group->size());
    proto::TensorData header;  // the dtype and shape checks of a Create
    header.set_dtype(t.dtype());
    *header.mutable_shape() = t.sizes();
    const uint64_t bytes = proto::wire_bytes(header);
    const ScalarType dtype = scalar_type_from_name(t.dtype().c_str());
    const std::vector<int64_t> sizes(t.sizes().begin(), t.sizes().end());
    for (int i = 0; i < t.src_size(); ++i) {
      if (t.src(i) == me) {
        Tensor data;
        try {
          auto it = s.values.find(t.input());
          KILN_CHECK(it != s.values.end(), Value, "transfer: ", missing_value(s, t.input()));
          if (!it->second.error) {
            KILN_CHECK(it->second.t.dtype() == dtype && it->second.t.sizes() == IntArrayRef(sizes),
                       Value, "transfer: value id ", t.input(), " is ", it->second.t.sizes(), " ",
                       it->second.t.dtype(), " here, the command says ", IntArrayRef(sizes), " ",
                       dtype);
            data = it->second.t.contiguous();
          }
        } catch (const Error& x) {
          fail(s, error(x));
        }
        Tensor status = kiln::full({1}, data.defined() ? 0 : 1, kInt64);
        s.sends.emplace_back(group->send(status, t.dst(i), kTransferTag), status);
        if (data.defined()) s.sends.emplace_back(group->send(data, t.dst(i), kTransferTag), data);
      }
      if (t.dst(i) == me) {
        Tensor status = kiln::zeros({1}, kInt64);
        group->recv(status, t.src(i), kTransferTag)->wait();
        KILN_CHECK(status.data_ptr<int64_t>()[0] == 0, Runtime, "transfer: the value on worker ",
                   t.src(i), " failed (that worker's error says why)");
        Tensor out = kiln::empty(sizes, dtype, opt.device);
        group->recv(out, t.src(i), kTransferTag)->wait();
        const uint64_t used = s.in_use.load(std::memory_order_relaxed);
        if (opt.memory_limit_bytes && used + bytes > opt.memory_limit_bytes) {
          err = make_error("RESOURCE_EXHAUSTED", "runtime",
                           memory_message(opt.memory_limit_bytes, "transfer", bytes, used), t.seq(),
                           "transfer");
          continue;  // `out` is dropped; this worker may still send to another
        }
        bind(s, id, std::move(out), nullptr);
      }
    }
    if (!err) return;
  } catch (const Error& x) {
    err = error(x);
  } catch (const std::exception& x) {
    err = make_error("INTERNAL", "runtime", x.what(), t.seq(), "transfer");
  }
  if (receives) bind(s, id, Tensor(), err);
  fail(s, err);
}

// See Note [Gang checkpoints] in kiln/dist/remote.h. The workers first agree (one all-reduce)
// that every one of them has all the values, so none enters the checkpoint's collectives alone.
void run_checkpoint(State& s, const proto::Checkpoint& c) {
  const int64_t id = c.output();
  if (id <= 0 || s.values.contains(id) || s.pending.contains(id))
    throw StreamError{absl::StrCat("checkpoint (seq ", c.seq(), "): output id ", id,
                                   " is not > 0 or is already in use")};
  const char* what = c.load() ? "checkpoint.load" : "checkpoint.save";
  auto error = [&](const Error& x) {
    return make_error(code_of(x), kind_name(x.kind()), x.what(), c.seq(), what);
  };
  ErrorPtr err;
  try {
    KILN_CHECK(dist::is_initialized(), Runtime, what,
               ": this worker has no process group (a gang's checkpoint is saved by its workers "
               "together)");
    TensorMap state;
    try {
      for (const proto::CheckpointEntry& e : c.entries()) {
        auto it = s.values.find(e.id());
        KILN_CHECK(it != s.values.end(), Value, what, " '", e.name(), "': ",
                   missing_value(s, e.id()));
        if (it->second.error) {
          err = it->second.error;
          break;
        }
        check_resident(s, what, e.id(), it->second.t);
        Tensor t = it->second.t;
        if (e.dtensor()) t = dist::detail::make_dtensor(t, decode_spec(s, e.spec(), t));
        KILN_CHECK(state.emplace(e.name(), std::move(t)).second, Value, what, ": the name '",
                   e.name(), "' comes twice");
      }
    } catch (const Error& x) {
      err = error(x);
    }
    Tensor ok = kiln::full({1}, err ? 0 : 1, kInt64);
    dist::default_group()->all_reduce(ok, dist::ReduceOp::Min)->wait();
    if (!err)
      KILN_CHECK(ok.data_ptr<int64_t>()[0] == 1, Runtime, what,
                 ": a value is missing or failed on another worker of the gang (its error says "
                 "why); nothing was ",
                 c.load() ? "loaded" : "saved");
    if (!err) {
      nlohmann::json report = nlohmann::json::object();
      if (c.load()) {
        dist::checkpoint::LoadResult r = dist::checkpoint::load(state, c.dir(), c.strict());
        report = {{"missing", r.missing_keys}, {"unexpected", r.unexpected_keys},
                  {"extra", r.extra}};
      } else {
        dist::checkpoint::save(state, c.dir(), c.extra().empty() ? "{}" : c.extra());
      }
      const std::string text = report.dump();
      Tensor out = kiln::empty({static_cast<int64_t>(text.size())}, kUInt8);
      std::memcpy(out.data_ptr(), text.data(), text.size());
      bind(s, id, std::move(out), nullptr);
      return;
    }
  } catch (const Error& x) {
    err = error(x);
  } catch (const std::exception& x) {
    err = make_error("INTERNAL", "runtime", x.what(), c.seq(), what);
  }
  bind(s, id, Tensor(), err);
  fail(s, err);
}

}  // namespace kiln::worker::session_detail
