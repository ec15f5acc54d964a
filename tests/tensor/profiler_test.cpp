// The profiler (kiln/profiler.h): op events with shapes, bytes and FLOPs, nesting of composites
// and user ranges, memory events, the schedule, key_averages and the Chrome trace.
#include "kiln/profiler.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <thread>

#include "test_util.h"

namespace kiln {
namespace {

using profiler::Event;
using profiler::Profile;
using profiler::ProfilerAction;
using profiler::ProfilerOptions;
using profiler::RecordFunction;
using profiler::Schedule;
using testing::expect_error;

std::vector<const Event*> named(const profiler::Trace& t, const std::string& name) {
  std::vector<const Event*> out;
  for (const Event& e : t.events())
    if (e.name == name) out.push_back(&e);
  return out;
}

TEST(Profiler, OffByDefault) {
  EXPECT_FALSE(profiler::detail::ops_on());
  EXPECT_FALSE(profiler::detail::memory_on());
}

TEST(Profiler, MmEventHasShapesBytesAndFlops) {
  Tensor a = ones({4, 3}), b = ones({3, 5});
  ProfilerOptions o;
  o.record_shapes = true;
  o.with_flops = true;
  Profile prof(o);
  prof.start();
  EXPECT_TRUE(profiler::detail::ops_on());
  Tensor c = mm(a, b);
  prof.stop();
  EXPECT_FALSE(profiler::detail::ops_on());
  auto mms = named(prof.trace(), "mm");
  ASSERT_EQ(mms.size(), 1u);
  const Event& e = *mms[0];
  EXPECT_EQ(e.kind, Event::Kind::Op);
  EXPECT_EQ(e.dtype, "float32");
  EXPECT_EQ(e.device, kCPU);
  ASSERT_EQ(e.input_shapes.size(), 2u);
  EXPECT_EQ(e.input_shapes[0], (std::vector<std::vector<int64_t>>{{4, 3}}));
  EXPECT_EQ(e.input_shapes[1], (std::vector<std::vector<int64_t>>{{3, 5}}));
  EXPECT_EQ(e.input_types, (std::vector<std::string>{"float32", "float32"}));
  ASSERT_EQ(e.output_shapes.size(), 1u);
  EXPECT_EQ(e.output_shapes[0], (std::vector<int64_t>{4, 5}));
  EXPECT_EQ(e.flops, 2 * 4 * 3 * 5);
  EXPECT_EQ(e.bytes, (12 + 15 + 20) * 4);
  EXPECT_GE(e.end_ns, e.start_ns);
  EXPECT_GT(e.thread, 0u);
}

TEST(Profiler, NoShapesUnlessAsked) {
  Tensor a = ones({2, 2});
  Profile prof;
  prof.start();
  Tensor c = mm(a, a);
  prof.stop();
  auto mms = named(prof.trace(), "mm");
  ASSERT_EQ(mms.size(), 1u);
  EXPECT_TRUE(mms[0]->input_shapes.empty());
  EXPECT_EQ(mms[0]->flops, -1);
  EXPECT_EQ(mms[0]->bytes, 3 * 4 * 4);  // bytes are always counted
  // No schedule, no step(): one cycle covering step 0.
  EXPECT_EQ(prof.trace().first_step, 0);
  EXPECT_EQ(prof.trace().last_step, 0);
}

TEST(Profiler, LinearFlopsAndNesting) {
  Tensor x = ones({8, 16}), w = ones({32, 16}), bias = ones({32});
  ProfilerOptions o;
  o.with_flops = true;
  Profile prof(o);
  prof.start();
  {
    RecordFunction r("my_block");
    Tensor y = linear(x, w, bias);
  }
  prof.stop();
  const profiler::Trace& t = prof.trace();
  auto lin = named(t, "linear");
  auto blk = named(t, "my_block");
  ASSERT_EQ(lin.size(), 1u);
  ASSERT_EQ(blk.size(), 1u);
  EXPECT_EQ(blk[0]->kind, Event::Kind::UserRange);
  EXPECT_EQ(lin[0]->flops, 2 * 8 * 16 * 32);
  // linear is a composite: its inner ops are its children, and it is the range's child.
  ASSERT_GE(lin[0]->parent, 0);
  EXPECT_EQ(&t.events()[lin[0]->parent], blk[0]);
  int children = 0;
  int64_t child_ns = 0;
  for (const Event& e : t.events()) {
    if (e.parent < 0) continue;
    const Event& p = t.events()[e.parent];
    EXPECT_LE(p.start_ns, e.start_ns) << e.name << " in " << p.name;
    EXPECT_LE(e.end_ns, p.end_ns) << e.name << " in " << p.name;
    EXPECT_EQ(p.thread, e.thread);
    if (&p == lin[0]) {
      ++children;
      child_ns += e.end_ns - e.start_ns;
    }
  }
  EXPECT_GE(children, 1);
  EXPECT_EQ(lin[0]->self_ns, lin[0]->end_ns - lin[0]->start_ns - child_ns);
}

TEST(Profiler, MemoryEvents) {
  ProfilerOptions o;
  o.profile_memory = true;
  Profile prof(o);
  prof.start();
  {
    Tensor big = empty({1000, 100});  // 400000 bytes: rounded to the 512 KiB class
  }
  prof.stop();
  const auto& mem = prof.trace().memory_events();
  int64_t allocs = 0, frees = 0;
  for (const auto& m : mem) {
    if (m.bytes >= 400000) ++allocs;
    if (m.bytes <= -400000) ++frees;
    EXPECT_NE(m.addr, 0u);
    EXPECT_EQ(m.device, kCPU);
  }
  EXPECT_EQ(allocs, 1);
  EXPECT_EQ(frees, 1);
  // The allocation happened inside `empty`, so it is charged to that op.
  auto es = named(prof.trace(), "empty");
  ASSERT_EQ(es.size(), 1u);
  EXPECT_GE(es[0]->self_memory, 400000);
}

TEST(Profiler, NoMemoryEventsUnlessAsked) {
  Profile prof;
  prof.start();
  { Tensor t = empty({1000}); }
  prof.stop();
  EXPECT_TRUE(prof.trace().memory_events().empty());
}

TEST(Profiler, ScheduleRecordsOnlyActiveSteps) {
  Schedule s(/*wait=*/1, /*warmup=*/1, /*active=*/2, /*repeat=*/1);
  EXPECT_EQ(s(0), ProfilerAction::None);
  EXPECT_EQ(s(1), ProfilerAction::Warmup);
  EXPECT_EQ(s(2), ProfilerAction::Record);
  EXPECT_EQ(s(3), ProfilerAction::RecordAndSave);
  EXPECT_EQ(s(4), ProfilerAction::None);  // repeat=1: one cycle
  ProfilerOptions o;
  o.schedule = s;
  int ready = 0;
  o.on_trace_ready = [&](Profile&) { ++ready; };
  Profile prof(o);
  prof.start();
  Tensor a = ones({2, 2});
  for (int step = 0; step < 6; ++step) {
    for (int i = 0; i <= step; ++i) a = mm(a, a);  // step k runs k + 1 mms
    prof.step();
  }
  prof.stop();
  EXPECT_EQ(ready, 1);
  const profiler::Trace& t = prof.trace();
  EXPECT_EQ(named(t, "mm").size(), 3u + 4u);  // steps 2 and 3
  std::vector<std::string> steps;
  for (const Event& e : t.events())
    if (e.kind == Event::Kind::Step) steps.push_back(e.name);
  EXPECT_EQ(steps, (std::vector<std::string>{"ProfilerStep#2", "ProfilerStep#3"}));
  EXPECT_EQ(t.first_step, 2);
  EXPECT_EQ(t.last_step, 3);
  // Ops of a step are its children.
  for (const Event* e : named(t, "mm")) {
    ASSERT_GE(e->parent, 0);
    EXPECT_EQ(t.events()[e->parent].kind, Event::Kind::Step);
  }
}

TEST(Profiler, ScheduleRepeatsCycles) {
  ProfilerOptions o;
  o.schedule = Schedule(0, 0, 1, 2);
  std::vector<size_t> per_cycle;
  o.on_trace_ready = [&](Profile& p) { per_cycle.push_back(named(p.trace(), "add").size()); };
  Profile prof(o);
  prof.start();
  Tensor a = ones({2});
  for (int step = 0; step < 4; ++step) {
    a = a + a;
    prof.step();
  }
  prof.stop();
  EXPECT_EQ(per_cycle, (std::vector<size_t>{1, 1}));
}

TEST(Profiler, BadInput) {
  expect_error(ErrorKind::Value, "wait must be >= 0", [] { Schedule(-1, 0, 1); });
  expect_error(ErrorKind::Value, "warmup must be >= 0", [] { Schedule(0, -2, 1); });
  expect_error(ErrorKind::Value, "active must be >= 1", [] { Schedule(0, 0, 0); });
  expect_error(ErrorKind::Value, "repeat must be >= 0", [] { Schedule(0, 0, 1, -1); });
  Profile never;
  expect_error(ErrorKind::Runtime, "has not been started", [&] { never.trace(); });
  expect_error(ErrorKind::Runtime, "not running", [&] { never.step(); });
  ProfilerOptions o;
  o.schedule = Schedule(1, 0, 1);
  Profile prof(o);
  prof.start();
  expect_error(ErrorKind::Runtime, "no trace has been collected yet",
               [&] { prof.export_chrome_trace("/tmp/kiln_profiler_unused.json"); });
  Profile second;
  expect_error(ErrorKind::Runtime, "already running", [&] { second.start(); });
  prof.step();
  prof.step();  // the active step ends: a trace
  expect_error(ErrorKind::Runtime, "/nonexistent_dir_kiln/t.json",
               [&] { prof.export_chrome_trace("/nonexistent_dir_kiln/t.json"); });
  expect_error(ErrorKind::Value, "unknown sort_by 'bogus'",
               [&] { prof.key_averages().table("bogus"); });
  expect_error(ErrorKind::Value, "record_shapes", [&] { prof.key_averages(true); });
  prof.stop();
}

TEST(Profiler, KeyAveragesCounts) {
  ProfilerOptions o;
  o.record_shapes = true;
  Profile prof(o);
  Tensor a = ones({2, 3}), b = ones({3, 2}), c = ones({3, 3});
  prof.start();
  for (int i = 0; i < 3; ++i) mm(a, b);
  for (int i = 0; i < 2; ++i) mm(c, c);
  prof.stop();
  auto ka = prof.key_averages();
  std::map<std::string, int64_t> count;
  for (const auto& r : ka.rows) count[r.key] = r.count;
  EXPECT_EQ(count["mm"], 5);
  auto by_shape = prof.key_averages(true);
  std::map<std::string, int64_t> shaped;
  for (const auto& r : by_shape.rows)
    if (r.key == "mm") shaped[r.input_shapes] = r.count;
  EXPECT_EQ(shaped["[[2, 3], [3, 2]]"], 3);
  EXPECT_EQ(shaped["[[3, 3], [3, 3]]"], 2);
  std::string table = by_shape.table("count", 5);
  EXPECT_NE(table.find("Self CPU %"), std::string::npos) << table;
  EXPECT_NE(table.find("[[2, 3], [3, 2]]"), std::string::npos) << table;
  EXPECT_NE(table.find("Self CPU time total"), std::string::npos) << table;
  for (const auto& r : ka.rows) EXPECT_LE(r.self_cpu_time_total_ns, r.cpu_time_total_ns);
}

TEST(Profiler, ChromeTraceAndThreads) {
  ProfilerOptions o;
  o.record_shapes = true;
  o.profile_memory = true;
  Profile prof(o);
  prof.start();
  Tensor a = ones({4, 4});
  std::thread th([&] { Tensor b = mm(a, a); });
  th.join();
  Tensor c = mm(a, a);
  prof.stop();
  std::set<uint32_t> threads;
  for (const Event* e : named(prof.trace(), "mm")) threads.insert(e->thread);
  EXPECT_EQ(threads.size(), 2u);
  std::string path = ::testing::TempDir() + "kiln_profiler_trace.json";
  prof.export_chrome_trace(path);
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  std::string json = ss.str();
  EXPECT_EQ(json.rfind("{\"schemaVersion\": 1", 0), 0u);
  EXPECT_NE(json.find("\"traceEvents\""), std::string::npos);
  EXPECT_NE(json.find("\"ph\": \"X\", \"cat\": \"cpu_op\", \"name\": \"mm\""), std::string::npos);
  EXPECT_NE(json.find("\"Input Dims\": [[4, 4], [4, 4]]"), std::string::npos);
  EXPECT_NE(json.find("\"name\": \"[memory]\""), std::string::npos);
  EXPECT_NE(json.find("\"ph\": \"C\""), std::string::npos);
  std::remove(path.c_str());
}

TEST(Profiler, OpThatThrowsIsDropped) {
  Tensor a = ones({2, 3}), b = ones({2, 2});
  Profile prof;
  prof.start();
  EXPECT_THROW(mm(a, a), Error);  // (2, 3) @ (2, 3)
  Tensor c = mm(b, b);
  prof.stop();
  auto mms = named(prof.trace(), "mm");
  ASSERT_EQ(mms.size(), 1u);     // the failed call is not an event
  ASSERT_GE(mms[0]->parent, 0);  // the next one sits in the step range stop() closed
  EXPECT_EQ(prof.trace().events()[mms[0]->parent].kind, Event::Kind::Step);
}

TEST(Profiler, RecordFunctionOffIsFree) {
  RecordFunction r("nothing");  // no profiler: records nothing, no error
  Profile prof;
  prof.start();
  prof.stop();
  EXPECT_TRUE(named(prof.trace(), "nothing").empty());
}

}  // namespace
}  // namespace kiln
