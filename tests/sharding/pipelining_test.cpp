// Pipeline parallelism (kiln/dist/pipelining.h): the schedules' action lists (every microbatch
// once per stage, in order, messages paired, no deadlock), their simulated bubbles against the
// closed forms, timelines, the errors; then training through every schedule on 1, 2 and 4
// ranks against single-process training, a stage that cannot take its input, and a dead rank.
#include "kiln/dist/pipelining.h"

#include <cstdlib>
#include <map>
#include <set>

#include "harness.h"
#include "kiln/kiln.h"
#include "kiln/nn/nn.h"
#include "test_util.h"

namespace kiln {
namespace {

namespace pp = dist::pipelining;
using pp::Op;
using pp::ScheduleKind;
using testing::expect_all_pass;
using testing::expect_error;
using testing::rank;
using testing::run_ranks;
using testing::world;

const ScheduleKind kKinds[] = {ScheduleKind::GPipe, ScheduleKind::OneFOneB,
                               ScheduleKind::Interleaved1F1B, ScheduleKind::ZBH1};

// Every stage runs F, and B (or I then W), once per microbatch, each kind in microbatch order;
// every SEND has its RECV on the peer's list, in the same order.
void check_well_formed(const std::vector<pp::ActionList>& lists, int p, int v, int m, bool split) {
  std::map<std::pair<int, Op>, std::vector<int>> order;  // (stage, op) -> microbatches
  std::map<std::pair<int, int>, std::vector<std::pair<int, int>>> sent,
      received;  // link -> (stage, mb)
  for (int r = 0; r < p; ++r)
    for (const pp::Action& a : lists[r]) {
      EXPECT_EQ(a.stage % p, r) << pp::to_string(a) << " on rank " << r;
      order[{a.stage, a.op}].push_back(a.microbatch);
      if (a.op == Op::SendF) sent[{r, (a.stage + 1) % p}].push_back({a.stage + 1, a.microbatch});
      if (a.op == Op::RecvF) received[{(a.stage - 1) % p, r}].push_back({a.stage, a.microbatch});
      if (a.op == Op::SendB) sent[{r, (a.stage - 1) % p}].push_back({-a.stage, a.microbatch});
      if (a.op == Op::RecvB)
        received[{(a.stage + 1) % p, r}].push_back({-a.stage - 1, a.microbatch});
    }
  std::vector<int> all(m);
  for (int i = 0; i < m; ++i) all[i] = i;
  for (int s = 0; s < p * v; ++s) {
    EXPECT_EQ(order[std::make_pair(s, Op::F)], all) << "stage " << s;
    for (Op op : split ? std::vector<Op>{Op::I, Op::W} : std::vector<Op>{Op::B})
      EXPECT_EQ(order[std::make_pair(s, op)], all) << "stage " << s;
  }
  // A link's sends and receives, per tag (stage and direction), match in order.
  for (auto& [link, msgs] : sent) {
    std::map<int, std::vector<int>> a, b;
    for (auto [tag, mb] : msgs) a[tag].push_back(mb);
    for (auto [tag, mb] : received[link]) b[tag].push_back(mb);
    EXPECT_EQ(a, b) << "link " << link.first << " -> " << link.second;
  }
}

TEST(PipelineSchedules, WellFormedAndDeadlockFree) {
  for (ScheduleKind kind : kKinds)
    for (int p : {1, 2, 3, 4})
      for (int m : {1, 2, 4, 5, 8, 12}) {
        const int v = kind == ScheduleKind::Interleaved1F1B ? 2 : 1;
        if (kind == ScheduleKind::Interleaved1F1B && m % p != 0) continue;
        SCOPED_TRACE(std::string(pp::schedule_kind_name(kind)) + " p=" + std::to_string(p) +
                     " m=" + std::to_string(m));
        auto lists = pp::make_schedule({kind, p, m, v});
        ASSERT_EQ(lists.size(), static_cast<size_t>(p));
        check_well_formed(lists, p, v, m, kind == ScheduleKind::ZBH1);
        EXPECT_NO_THROW(pp::simulate(lists));
      }
  auto lists = pp::make_schedule({ScheduleKind::Interleaved1F1B, 4, 8, 3});
  check_well_formed(lists, 4, 3, 8, false);
  EXPECT_NO_THROW(pp::simulate(lists));
}

TEST(PipelineSchedules, BubblesMatchTheClosedForm) {
  for (int p : {2, 4})
    for (int m : {4, 8, 16}) {
      const double want = double(p - 1) / (m + p - 1);
      for (ScheduleKind kind : {ScheduleKind::GPipe, ScheduleKind::OneFOneB}) {
        auto t = pp::simulate(pp::make_schedule({kind, p, m}));
        EXPECT_NEAR(pp::bubble_fraction(t, p), want, 1e-12) << pp::schedule_kind_name(kind);
      }
      const double one_f =
          pp::bubble_fraction(pp::simulate(pp::make_schedule({ScheduleKind::OneFOneB, p, m})), p);
      const double zb =
          pp::bubble_fraction(pp::simulate(pp::make_schedule({ScheduleKind::ZBH1, p, m})), p);
      EXPECT_LT(zb, one_f) << "p=" << p << " m=" << m;
      if (m % p == 0) {
        const double il = pp::bubble_fraction(
            pp::simulate(pp::make_schedule({ScheduleKind::Interleaved1F1B, p, m, 2})), p);
        EXPECT_LT(il, one_f) << "p=" << p << " m=" << m;
      }
    }
}

TEST(PipelineSchedules, PrintsAndRendersTimelines) {
  auto lists = pp::make_schedule({ScheduleKind::OneFOneB, 2, 2});
  EXPECT_EQ(pp::format_schedule(lists),
            "rank 0: 0F0 0SEND_F0 0F1 0SEND_F1 0RECV_B0 0B0 0RECV_B1 0B1\n"
            "rank 1: 1RECV_F0 1F0 1B0 1SEND_B0 1RECV_F1 1F1 1B1 1SEND_B1\n");
  auto fsdp = pp::make_schedule({ScheduleKind::GPipe, 2, 1, 1, /*fsdp=*/true});
  EXPECT_EQ(pp::format_schedule(fsdp),
            "rank 0: 0UNSHARD 0F0 0SEND_F0 0RECV_B0 0B0 0RESHARD\n"
            "rank 1: 1UNSHARD 1RECV_F0 1F0 1B0 1SEND_B0 1RESHARD\n");
  std::string json = pp::chrome_trace(pp::simulate(lists));
  EXPECT_NE(json.find("\"traceEvents\""), std::string::npos);
  EXPECT_NE(json.find("\"name\": \"1B0\""), std::string::npos);
  EXPECT_NE(json.find("\"name\": \"rank 1\""), std::string::npos);
}

TEST(PipelineSchedules, Errors) {
  expect_error(ErrorKind::Value,
               "needs a multiple of 4 microbatches (at least 4), got n_microbatches=6", [] {
                 pp::make_schedule({ScheduleKind::Interleaved1F1B, 4, 6, 2});
               });
  expect_error(ErrorKind::Value,
               "needs a multiple of 4 microbatches (at least 4), got n_microbatches=2", [] {
                 pp::make_schedule({ScheduleKind::Interleaved1F1B, 4, 2, 2});
               });
  expect_error(ErrorKind::Value, "needs at least 2 stages per rank", [] {
    pp::make_schedule({ScheduleKind::Interleaved1F1B, 2, 4, 1});
  });
  expect_error(ErrorKind::Value, "runs one stage per rank, got 2", [] {
    pp::make_schedule({ScheduleKind::OneFOneB, 2, 4, 2});
  });
  expect_error(ErrorKind::Value, "n_microbatches must be positive, got 0", [] {
    pp::make_schedule({ScheduleKind::GPipe, 2, 0});
  });
  expect_error(ErrorKind::Value, "the schedules are gpipe, 1f1b, interleaved_1f1b, zbh1",
               [] { pp::parse_schedule_kind("pipedream"); });
  // A backward before its forward, on both ranks: a deadlock, found before anything runs.
  std::vector<pp::ActionList> bad = {{{Op::B, 0, 0}, {Op::F, 0, 0}},
                                     {{Op::F, 1, 0}, {Op::B, 1, 0}}};
  expect_error(ErrorKind::Runtime, "deadlocks: rank 0 at 0B0 rank 1 at 1F0",
               [&] { pp::simulate(bad); });
}

// ---- Training ----------------------------------------------------------------------------

// The reference model, and a pipeline's view of the same weights: `layers` Linear+Tanh pairs.
std::vector<nn::ModulePtr> make_layers(int layers) {
  manual_seed(7);
  std::vector<nn::ModulePtr> out;
  for (int i = 0; i < layers; ++i) {
    out.push_back(std::make_shared<nn::Linear>(6, 6));
    out.push_back(std::make_shared<nn::Tanh>());
  }
  return out;
}

nn::ModulePtr slice(const std::vector<nn::ModulePtr>& layers, int stage, int n_stages) {
  const size_t per = layers.size() / n_stages;
  return std::make_shared<nn::Sequential>(
      std::vector<nn::ModulePtr>(layers.begin() + stage * per, layers.begin() + (stage + 1) * per));
}

Tensor mse(const std::vector<Tensor>& out, const Tensor& target) {
  return mse_loss(out[0], target);
}

// Trains 2 steps through `kind` on this process's pipeline group and checks every loss and
// every local parameter's gradient against single-process training on the whole batch.
void check_parity(ScheduleKind kind, int v, int m, const dist::ProcessGroupPtr& group) {
  SCOPED_TRACE(pp::schedule_kind_name(kind));
  const int p = group->size(), n_stages = p * v;
  auto ref_layers = make_layers(n_stages), layers = make_layers(n_stages);
  nn::Sequential ref(ref_layers);
  std::vector<std::unique_ptr<pp::PipelineStage>> stages;
  std::vector<pp::PipelineStage*> mine;
  for (int c = 0; c < v; ++c) {
    const int s = c * p + group->rank();
    stages.push_back(
        std::make_unique<pp::PipelineStage>(slice(layers, s, n_stages), s, n_stages, group));
    mine.push_back(stages.back().get());
  }
  pp::Schedule schedule(mine, kind, m, mse);
  for (int step = 0; step < 2; ++step) {
    manual_seed(100 + step);
    Tensor x = randn({4 * m, 6}), y = randn({4 * m, 6});
    ref.zero_grad();
    for (auto& l : layers) l->zero_grad();
    Tensor ref_loss = mse_loss(ref.forward(x), y);
    autograd::backward({ref_loss});
    std::vector<Tensor> losses;
    auto out = schedule.step({x}, y, &losses);
    if (group->rank() == (n_stages - 1) % p) {
      ASSERT_EQ(losses.size(), static_cast<size_t>(m));
      Tensor mean = stack(losses).mean();
      testing::expect_close(mean, ref_loss, 1e-5, 1e-6);
      ASSERT_EQ(out.size(), 1u);
      testing::expect_close(out[0], ref.forward(x).detach(), 1e-5, 1e-6);
    } else {
      EXPECT_TRUE(out.empty());
    }
    for (int c = 0; c < v; ++c) {
      const int s = c * p + group->rank();
      auto got = slice(layers, s, n_stages)->parameters();
      auto want = slice(ref_layers, s, n_stages)->parameters();
      for (size_t i = 0; i < got.size(); ++i)
        testing::expect_close(got[i].grad(), want[i].grad(), 1e-5, 1e-6);
    }
  }
}

TEST(PipelineTraining, OneRank) {
  auto group = dist::new_local_group("pp_one_rank");
  for (ScheduleKind kind : {ScheduleKind::GPipe, ScheduleKind::OneFOneB, ScheduleKind::ZBH1})
    check_parity(kind, 1, 3, group);
  check_parity(ScheduleKind::Interleaved1F1B, 3, 2, group);  // three stages on one rank
}

// One process runs every stage, without a group (See Note [Pipeline controller]). The log of
// what it records shows the halves of each hand-over where they belong: a stage's output is sent
// right after the F that made it and received just before the F that needs it (so a worker never
// waits on a send recorded at the consumer's turn), gradients likewise after B or I. Training
// equals one process.
TEST(PipelineTraining, ControllerSendsEarlyAndReceivesLate) {
  for (ScheduleKind kind : {ScheduleKind::OneFOneB, ScheduleKind::ZBH1}) {
    SCOPED_TRACE(pp::schedule_kind_name(kind));
    const int n_stages = 2, m = 3;
    auto ref_layers = make_layers(n_stages), layers = make_layers(n_stages);
    nn::Sequential ref(ref_layers);
    std::vector<std::string> log;
    int current = -1;
    pp::Controller c;
    c.ranks = 2;
    c.enter = [&](int s) { current = s; };
    c.leave = [&] {
      log.push_back("run " + std::to_string(current));
      current = -1;
    };
    c.send = [&](const std::vector<Tensor>& ts, int from, int to) {
      EXPECT_EQ(current, from);  // inside the producing action, at its end
      log.push_back("send " + std::to_string(from) + ">" + std::to_string(to));
      return ts;
    };
    c.receive = [&](const std::vector<Tensor>&, int from, int to) {
      EXPECT_EQ(current, to);  // inside the consuming action, before its work
      log.push_back("recv " + std::to_string(from) + ">" + std::to_string(to));
    };
    pp::PipelineStage s0(slice(layers, 0, 2), 0, 2, nullptr),
        s1(slice(layers, 1, 2), 1, 2, nullptr);
    pp::Schedule schedule({&s0, &s1}, kind, m, mse, false, c);
    manual_seed(3);
    Tensor x = randn({4 * m, 6}), y = randn({4 * m, 6});
    Tensor ref_loss = mse_loss(ref.forward(x), y);
    autograd::backward({ref_loss});
    std::vector<Tensor> losses;
    schedule.step({x}, y, &losses);
    testing::expect_close(stack(losses).mean(), ref_loss, 1e-5, 1e-6);
    auto got = layers[0]->parameters(), want = ref_layers[0]->parameters();
    for (size_t i = 0; i < got.size(); ++i)
      testing::expect_close(got[i].grad(), want[i].grad(), 1e-5, 1e-6);
    // Every send is logged before its action's "run", every receive inside the next one's.
    int sends = 0, recvs = 0;
    for (size_t i = 0; i < log.size(); ++i) {
      if (log[i].rfind("send", 0) == 0) {
        ++sends;
        ASSERT_LT(i + 1, log.size());
        EXPECT_EQ(log[i + 1], "run " + log[i].substr(5, 1)) << i;
      }
      if (log[i].rfind("recv", 0) == 0) ++recvs;
    }
    EXPECT_EQ(sends, 2 * m);  // m activations forward, m gradients back
    EXPECT_EQ(recvs, 2 * m);
    // Stage 0's output of microbatch 0 is sent before stage 0 starts microbatch 1.
    EXPECT_EQ(log[0], "send 0>1");
    EXPECT_EQ(log[1], "run 0");
  }
}

KILN_RANK_SCENARIO(pp_parity) {
  auto group = dist::default_group();
  for (ScheduleKind kind : kKinds)
    check_parity(kind, kind == ScheduleKind::Interleaved1F1B ? 2 : 1,
                 kind == ScheduleKind::Interleaved1F1B ? 2 * world() : 5, group);
}
TEST(PipelineTraining, EverySchedule2Ranks) { expect_all_pass(run_ranks("pp_parity", 2)); }
TEST(PipelineTraining, EverySchedule4Ranks) { expect_all_pass(run_ranks("pp_parity", 4)); }

// Stage 0 makes [n, 6], stage 1 wants 5 features: every rank raises, nothing hangs.
KILN_RANK_SCENARIO(pp_mismatch) {
  auto group = dist::default_group();
  nn::ModulePtr mod = rank() == 0 ? nn::ModulePtr(std::make_shared<nn::Linear>(6, 6))
                                  : nn::ModulePtr(std::make_shared<nn::Linear>(5, 2));
  pp::PipelineStage stage(mod, rank(), 2, group);
  pp::Schedule schedule({&stage}, ScheduleKind::OneFOneB, 2, mse);
  const char* want = rank() == 1 ? "pipeline: stage 1 cannot take stage 0's output ([2, 6] float32)"
                                 : "pipeline: stage 1 (rank 1) cannot take its input";
  expect_error(ErrorKind::Value, want, [&] {
    if (rank() == 0)
      schedule.step({randn({4, 6})});
    else
      schedule.step({}, randn({4, 2}));
  });
}
TEST(PipelineTraining, StageThatCannotTakeItsInput) {
  expect_all_pass(run_ranks("pp_mismatch", 2));
}

// Rank 1 dies after shape inference; rank 0 raises within the group's timeout.
KILN_RANK_SCENARIO(pp_dead_rank) {
  auto group = dist::default_group();
  auto layers = make_layers(2);
  pp::PipelineStage stage(slice(layers, rank(), 2), rank(), 2, group);
  pp::Schedule schedule({&stage}, ScheduleKind::OneFOneB, 2, mse);
  Tensor x = randn({4, 6}), y = randn({4, 6});
  if (rank() == 0)
    schedule.step({x});
  else
    schedule.step({}, y);
  if (rank() == 1) std::_Exit(0);  // the next step never comes
  expect_error(ErrorKind::Runtime, "rank 1", [&] { schedule.step({x}); });
}
TEST(PipelineTraining, DeadRankMakesTheOthersRaise) {
  auto results =
      run_ranks("pp_dead_rank", 2, std::chrono::seconds(60), {{"KILN_COMM_TIMEOUT_S", "3"}});
  expect_all_pass(results);
}

}  // namespace
}  // namespace kiln
