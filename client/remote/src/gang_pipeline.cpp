// Pipelines over a gang's workers (kiln/client/gang_pipeline.h; Note [Gang stages] in
// kiln/client/transport.h).
#include "kiln/client/gang_pipeline.h"

#include <map>
#include <memory>

#include "kiln/client/connection.h"
#include "kiln/client/transport.h"
#include "kiln/error.h"

namespace kiln::client {

dist::pipelining::Controller gang_controller(std::vector<std::vector<int>> workers) {
  KILN_CHECK(!workers.empty(), Value, "gang_controller: no pipeline ranks");
  for (const auto& w : workers)
    KILN_CHECK(!w.empty() && w.size() == workers[0].size(), Value,
               "gang_controller: every pipeline rank needs the same number (>= 1) of workers");
  const int ranks = static_cast<int>(workers.size());
  auto scopes = std::make_shared<std::vector<std::unique_ptr<StageScope>>>();
  dist::pipelining::Controller c;
  c.ranks = ranks;
  c.enter = [scopes, workers, ranks](int stage) {
    scopes->push_back(std::make_unique<StageScope>(workers[stage % ranks]));
  };
  c.leave = [scopes] { scopes->pop_back(); };
  // The senders' halves wait here, by the output's remote id, for their receivers' halves.
  auto sent = std::make_shared<std::map<int64_t, proto::Transfer>>();
  c.send = [workers, ranks, sent](const std::vector<Tensor>& ts, int from, int to) {
    const std::vector<int>&src = workers[from % ranks], &dst = workers[to % ranks];
    if (src == dst) return ts;  // two stages of the same workers
    std::vector<Tensor> out;
    for (const Tensor& t : ts) {
      auto [moved, x] = transfer_send(t, src, dst);
      (*sent)[x.output()] = std::move(x);
      out.push_back(std::move(moved));
    }
    return out;
  };
  c.receive = [workers, ranks, sent](const std::vector<Tensor>& ts, int from, int to) {
    if (workers[from % ranks] == workers[to % ranks]) return;
    for (const Tensor& t : ts) {
      auto it = sent->find(remote_value(t, "pipeline").id);
      KILN_CHECK(it != sent->end(), Runtime, "pipeline: a transfer received before it was sent");
      transfer_receive(t, it->second);
      sent->erase(it);
    }
  };
  return c;
}

dist::pipelining::Controller gang_controller(int ranks) {
  KILN_CHECK(ranks >= 1, Value, "gang_controller: ", ranks, " workers");
  std::vector<std::vector<int>> workers;
  for (int r = 0; r < ranks; ++r) workers.push_back({r});
  return gang_controller(std::move(workers));
}

}  // namespace kiln::client
