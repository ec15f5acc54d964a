// init_process_group, new_group, the registry and destroy, in one process (a one-rank world needs
// no store and no transport).
#include <cstdlib>

#include "kiln/dist/process_group.h"
#include "test_util.h"

namespace kiln::testing {
namespace {

dist::InitOptions explicit_world1() {
  dist::InitOptions o;
  o.init_method = "";
  o.rank = 0;
  o.world_size = 1;
  return o;
}

}  // namespace

TEST(DistInit, ExplicitWorldOfOneAndRegistry) {
  auto pg = dist::init_process_group(explicit_world1());
  EXPECT_TRUE(dist::is_initialized());
  EXPECT_EQ(pg->rank(), 0);
  EXPECT_EQ(pg->size(), 1);
  EXPECT_EQ(pg->name(), "world");
  EXPECT_EQ(dist::default_group(), pg);
  EXPECT_EQ(dist::find_group("world"), pg);
  expect_error(ErrorKind::Value, "the default group exists already",
               [] { dist::init_process_group(explicit_world1()); });
  auto sub = dist::new_group({0}, std::chrono::milliseconds(1500));
  ASSERT_TRUE(sub);
  EXPECT_EQ(sub->name(), "group1");
  EXPECT_EQ(sub->timeout().count(), 1500);
  expect_error(ErrorKind::Value, "ranks must be distinct world ranks in [0, 1)", [] {
    dist::new_group({0, 1});
  });
  for (int i = 2; i < 64; ++i) EXPECT_TRUE(dist::new_group({0}));
  expect_error(ErrorKind::Value, "at most 63 subgroups", [] { dist::new_group({0}); });
  Tensor t = ones({3});
  pg->all_reduce(t, dist::ReduceOp::Avg)->wait(std::chrono::milliseconds(5000));
  expect_close(t, ones({3}));
  EXPECT_NE(pg->dump_recent().find("#1 all_reduce float32[3]: completed"), std::string::npos)
      << pg->dump_recent();
  dist::destroy_process_group();
  EXPECT_FALSE(dist::is_initialized());
  expect_error(ErrorKind::Value, "no default process group", [] { dist::default_group(); });
  expect_error(ErrorKind::Value, "no process group named 'world'",
               [] { dist::find_group("world"); });
}

TEST(DistInit, BadArguments) {
  expect_error(ErrorKind::Value, "unknown backend 'mpi'", [] {
    auto o = explicit_world1();
    o.backend = "mpi";
    dist::init_process_group(o);
  });
  expect_error(ErrorKind::Value, "a store is needed for world_size 2", [] {
    auto o = explicit_world1();
    o.world_size = 2;
    dist::init_process_group(o);
  });
  expect_error(ErrorKind::Value, "unsupported init_method 'tcp://x'", [] {
    auto o = explicit_world1();
    o.init_method = "tcp://x";
    dist::init_process_group(o);
  });
  ::unsetenv("RANK");
  expect_error(ErrorKind::Value, "RANK and WORLD_SIZE must be set",
               [] { dist::init_process_group(); });
  ::setenv("KILN_COMM_TIMEOUT_S", "soon", 1);
  expect_error(ErrorKind::Value, "KILN_COMM_TIMEOUT_S must be a positive number of seconds",
               [] { dist::init_process_group(explicit_world1()); });
  ::unsetenv("KILN_COMM_TIMEOUT_S");
  EXPECT_FALSE(dist::is_initialized());
}

}  // namespace kiln::testing
