// GangTransport: one SPMD program over N workers (Note [Gangs] in kiln/client/transport.h), and
// its stages (Note [Gang stages]).
#include <algorithm>
#include <chrono>

#include "kiln/client/transport.h"
#include "kiln/error.h"

namespace kiln::client {

GangTransport::GangTransport(std::vector<std::unique_ptr<Transport>> ranks)
    : ranks_(std::move(ranks)) {
  KILN_CHECK(!ranks_.empty(), Value, "a gang needs at least one worker");
  name_ = "gang of " + std::to_string(ranks_.size()) + " workers (rank 0: " + ranks_[0]->name() + ")";
  for (size_t r = 0; r < ranks_.size(); ++r) {
    if (ranks_.size() == 1 || !ranks_[r]->can_send_concurrently()) {
      lanes_.push_back(nullptr);
      continue;
    }
    auto lane = std::make_unique<Lane>();
    Lane* l = lane.get();
    Transport* t = ranks_[r].get();
    l->thread = std::thread([l, t] {
      std::unique_lock<std::mutex> lock(l->mu);
      for (;;) {
        l->cv.wait(lock, [l] { return l->stop || !l->queue.empty(); });
        if (l->queue.empty()) return;  // stopped, everything written
        proto::Batch b = std::move(l->queue.front());
        l->queue.pop_front();
        l->busy = true;
        lock.unlock();
        std::exception_ptr error;
        try {
          t->send_concurrently(std::move(b));
        } catch (...) {
          error = std::current_exception();
        }
        lock.lock();
        l->busy = false;
        if (error) {
          l->error = error;
          l->queue.clear();
          l->cv.notify_all();
          return;
        }
        l->cv.notify_all();
      }
    });
    lanes_.push_back(std::move(lane));
  }
}

GangTransport::~GangTransport() { stop_lanes(); }

void GangTransport::write(int rank, proto::Batch&& batch) {
  Lane* l = lanes_[rank].get();
  if (!l) return ranks_[rank]->send(std::move(batch));
  std::lock_guard<std::mutex> lock(l->mu);
  if (l->error) std::rethrow_exception(l->error);
  KILN_CHECK(!l->stop, Runtime, name_, " is closed");
  l->queue.push_back(std::move(batch));
  l->cv.notify_all();
}

void GangTransport::rethrow(int rank) {
  Lane* l = lanes_[rank].get();
  if (!l) return;
  std::lock_guard<std::mutex> lock(l->mu);
  if (l->error) std::rethrow_exception(l->error);
}

// Lets the writers finish what is queued (2 s at most: a hung worker is cancelled), then joins.
void GangTransport::stop_lanes() {
  for (auto& l : lanes_)
    if (l) {
      std::lock_guard<std::mutex> lock(l->mu);
      l->stop = true;
      l->cv.notify_all();
    }
  for (size_t r = 0; r < lanes_.size(); ++r) {
    Lane* l = lanes_[r].get();
    if (!l || !l->thread.joinable()) continue;
    {
      std::unique_lock<std::mutex> lock(l->mu);
      if (!l->cv.wait_for(lock, std::chrono::seconds(2),
                          [l] { return l->queue.empty() && !l->busy; }))
        ranks_[r]->cancel();
    }
    l->thread.join();
  }
}

void GangTransport::send_to(int rank, proto::Batch&& batch) {
  KILN_CHECK(rank >= 0 && rank < world_size(), Value, "send_to: no rank ", rank, " in ", name_);
  write(rank, std::move(batch));
}

// ---- Routing (Note [Gang stages]) ----------------------------------------------------------

namespace {

thread_local const std::vector<int>* g_scope = nullptr;

void add_all(std::vector<int>& into, const std::vector<int>& ranks) {
  into.insert(into.end(), ranks.begin(), ranks.end());
}

}  // namespace

StageScope::StageScope(std::vector<int> ranks) : ranks_(std::move(ranks)), outer_(g_scope) {
  g_scope = &ranks_;
}
StageScope::~StageScope() { g_scope = outer_; }
const std::vector<int>* StageScope::current() { return g_scope; }

const std::vector<int>* GangTransport::holders(int64_t id) const {
  auto it = held_.find(id);
  return it == held_.end() ? nullptr : &it->second;
}

std::vector<int> GangTransport::route(const proto::Command& c) {
  const int n = world_size();
  std::vector<int> ranks;
  auto held_by = [&](int64_t id) {
    if (const std::vector<int>* h = holders(id)) add_all(ranks, *h);
  };
  for (int r : c.ranks())
    KILN_CHECK(r >= 0 && r < n, Value, "a command for worker ", r, " of a gang of ", n);
  if (c.ranks_size() > 0) {
    ranks.assign(c.ranks().begin(), c.ranks().end());
  } else if (c.has_op()) {
    for (const proto::Argument& a : c.op().args()) {
      if (a.has_value()) held_by(a.value());
      if (a.has_values())
        for (int64_t id : a.values().ids()) held_by(id);
    }
  } else if (c.has_redistribute()) {
    held_by(c.redistribute().input());
  } else if (c.has_release()) {
    for (int64_t id : c.release().ids()) held_by(id);
  } else if (c.has_transfer()) {
    ranks.assign(c.transfer().src().begin(), c.transfer().src().end());
    add_all(ranks, {c.transfer().dst().begin(), c.transfer().dst().end()});
  }
  std::sort(ranks.begin(), ranks.end());
  ranks.erase(std::unique(ranks.begin(), ranks.end()), ranks.end());
  if (ranks.size() == static_cast<size_t>(n)) ranks.clear();  // every rank
  // Where the command's outputs are held now.
  auto hold = [&](int64_t id, const std::vector<int>& where) {
    if (where.empty())
      held_.erase(id);
    else
      held_[id] = where;
  };
  if (c.has_op()) {
    for (int64_t id : c.op().outputs()) hold(id, ranks);
  } else if (c.has_create()) {
    // Pieces of one value may go to different workers (scatter_to): they all hold it.
    auto it = held_.find(c.create().id());
    if (!ranks.empty() && it != held_.end()) {
      std::vector<int> both = it->second;
      add_all(both, ranks);
      std::sort(both.begin(), both.end());
      both.erase(std::unique(both.begin(), both.end()), both.end());
      hold(c.create().id(), both.size() == static_cast<size_t>(n) ? std::vector<int>{} : both);
    } else {
      hold(c.create().id(), ranks);
    }
  } else if (c.has_redistribute()) {
    hold(c.redistribute().output(), ranks);
  } else if (c.has_transfer()) {
    std::vector<int> dst(c.transfer().dst().begin(), c.transfer().dst().end());
    std::sort(dst.begin(), dst.end());
    hold(c.transfer().output(), dst);
  }
  return ranks;
}

// A list op (foreach ops, fused optimizers) over the values of several stages: each worker gets
// the instruction with the elements it holds, when the lists are aligned (equal lengths, every
// element's values on the same workers; empty lists aside), no other tensor argument is held by a
// part of the gang, and the outputs come one per element (or none). Anything else is routed as one
// instruction.
bool GangTransport::split_lists(const proto::Command& c, std::vector<proto::Batch>& out) {
  if (!c.has_op() || c.ranks_size() > 0 || c.op().dtensor_args_size() > 0) return false;
  const proto::Instruction& in = c.op();
  int len = -1;
  for (const proto::Argument& a : in.args()) {
    if (a.has_values()) {
      if (a.values().ids_size() == 0) continue;  // an empty list (no momentum buffers yet)
      if (len >= 0 && a.values().ids_size() != len) return false;
      len = a.values().ids_size();
    } else if (a.has_value() && holders(a.value())) {
      return false;
    }
  }
  if (len <= 0 || in.outputs_size() % len != 0) return false;
  std::vector<const std::vector<int>*> elem(len, nullptr);  // null: every worker
  bool split = false;
  for (const proto::Argument& a : in.args()) {
    if (!a.has_values() || a.values().ids_size() == 0) continue;
    for (int i = 0; i < len; ++i) {
      const std::vector<int>* h = holders(a.values().ids(i));
      if (!h) continue;
      if (elem[i] && *elem[i] != *h) return false;
      elem[i] = h;
      split = true;
    }
  }
  if (!split) return false;
  for (int r = 0; r < world_size(); ++r) {
    std::vector<int> keep;
    for (int i = 0; i < len; ++i)
      if (!elem[i] || std::binary_search(elem[i]->begin(), elem[i]->end(), r)) keep.push_back(i);
    if (keep.empty()) continue;
    proto::Command* copy = out[r].add_commands();
    *copy = c;
    proto::Instruction* ci = copy->mutable_op();
    for (proto::Argument& a : *ci->mutable_args()) {
      if (!a.has_values() || a.values().ids_size() == 0) continue;
      auto* ids = a.mutable_values()->mutable_ids();
      std::vector<int64_t> all(ids->begin(), ids->end());
      ids->Clear();
      for (int i : keep) ids->Add(all[i]);
    }
    ci->clear_outputs();
    for (int b = 0; b < in.outputs_size() / len; ++b)
      for (int i : keep) ci->add_outputs(in.outputs(b * len + i));
  }
  for (int b = 0; b < in.outputs_size() / len; ++b)
    for (int i = 0; i < len; ++i) {
      if (elem[i])
        held_[in.outputs(b * len + i)] = *elem[i];
      else
        held_.erase(in.outputs(b * len + i));
    }
  return true;
}

void GangTransport::send(proto::Batch&& batch) {
  const int n = world_size();
  std::vector<proto::Batch> out(n);
  for (proto::Command& c : *batch.mutable_commands()) {
    if (c.has_free()) {  // each id to the ranks that hold it
      std::vector<proto::Free*> frees(n, nullptr);
      for (int64_t id : c.free().ids()) {
        const std::vector<int>* h = holders(id);
        for (int r = 0; r < n; ++r) {
          if (h && !std::binary_search(h->begin(), h->end(), r)) continue;
          if (!frees[r]) frees[r] = out[r].add_commands()->mutable_free();
          frees[r]->add_ids(id);
        }
        held_.erase(id);
      }
      continue;
    }
    if (c.has_fetch()) {  // the first holder reads it; the others report in a Sync
      const std::vector<int>* h = holders(c.fetch().id());
      reply_rank_ = h ? h->front() : 0;
      for (int r = 0; r < n; ++r) {
        if (r == reply_rank_)
          *out[r].add_commands() = c;
        else
          out[r].add_commands()->mutable_sync()->set_request(c.fetch().request());
      }
      continue;
    }
    if (c.has_sync()) reply_rank_ = 0;
    if (split_lists(c, out)) continue;
    const std::vector<int> ranks = route(c);
    if (ranks.empty()) {
      for (int r = 0; r < n; ++r) *out[r].add_commands() = c;
    } else {
      for (int r : ranks) *out[r].add_commands() = c;
    }
  }
  for (int r = n - 1; r >= 0; --r)
    if (out[r].commands_size() > 0) write(r, std::move(out[r]));
}

// ---- Replies --------------------------------------------------------------------------------

std::optional<proto::Error> GangTransport::check_ranks(uint64_t request, int skip) {
  std::optional<proto::Error> first;
  for (int r = 0; r < world_size(); ++r) {
    if (r == skip) continue;
    rethrow(r);
    proto::WorkerMessage mr = ranks_[r]->receive();  // a dead rank raises UNAVAILABLE here
    KILN_CHECK(mr.has_sync() && mr.sync().request() == request, Runtime, ranks_[r]->name(),
               ": expected the reply to sync ", request, ", got ", mr.ShortDebugString());
    if (!first && mr.sync().has_error()) {
      first = mr.sync().error();
      first->set_message("rank " + std::to_string(r) + " (" + ranks_[r]->name() +
                         "): " + first->message());
    }
  }
  return first;
}

namespace {

// The answering rank's reply carries another rank's error when it has none of its own; when it
// has one, the other's is appended: a collective that timed out there was often left by a rank
// that failed first, and that rank's error names the cause.
template <typename Reply>
void merge(Reply& reply, const proto::Error& other) {
  if (!reply.has_error()) {
    *reply.mutable_error() = other;
  } else if (reply.error().message() != other.message()) {
    reply.mutable_error()->set_message(reply.error().message() + "; and " + other.message());
  }
}

}  // namespace

proto::WorkerMessage GangTransport::receive() {
  rethrow(reply_rank_);
  proto::WorkerMessage m = ranks_[reply_rank_]->receive();
  if (m.has_fetch() && checked_fetch_ != m.fetch().request()) {  // its first piece
    checked_fetch_ = m.fetch().request();
    std::optional<proto::Error> e = check_ranks(m.fetch().request(), reply_rank_);  // in step
    if (e) merge(*m.mutable_fetch(), *e);
    return m;
  }
  if (!m.has_sync()) return m;
  std::optional<proto::Error> e = check_ranks(m.sync().request(), reply_rank_);
  if (e) merge(*m.mutable_sync(), *e);
  return m;
}

void GangTransport::close() {
  stop_lanes();
  for (auto& t : ranks_) t->close();
}

}  // namespace kiln::client
