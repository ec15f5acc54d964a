// The dispatcher: key order, thread-local include/exclude sets, boxed fallbacks, redispatch,
// boxed calls, errors; and the CPU allocator and version counters it relies on.
#include <gtest/gtest.h>

#include <thread>

#include "kiln/generated/dtype_sets.h"
#include "test_util.h"

namespace kiln {
namespace {

using testing::expect_error;

TEST(DispatchKeySet, OrderAndOps) {
  DispatchKeySet ks{DispatchKey::CPU, DispatchKey::Autograd, DispatchKey::Tracing};
  EXPECT_EQ(ks.highest(), DispatchKey::Autograd);
  EXPECT_EQ((ks & DispatchKeySet::below(DispatchKey::Autograd)).highest(), DispatchKey::Tracing);
  EXPECT_EQ(ks.remove(DispatchKey::Autograd).remove(DispatchKey::Tracing).highest(), DispatchKey::CPU);
  // DESIGN.md order, highest first.
  const DispatchKey order[] = {DispatchKey::Batched, DispatchKey::Autocast, DispatchKey::Autograd,
                               DispatchKey::Functionalize, DispatchKey::DTensor, DispatchKey::Tracing};
  for (size_t i = 0; i + 1 < std::size(order); ++i) EXPECT_GT(order[i], order[i + 1]);
  for (DispatchKey b : {DispatchKey::CPU, DispatchKey::CUDA, DispatchKey::Metal, DispatchKey::Meta, DispatchKey::Remote})
    EXPECT_LT(b, DispatchKey::Tracing);
}

TEST(DispatchKeySet, TensorsCarryTheirBackendKey) {
  EXPECT_EQ(zeros({1}).key_set(), DispatchKeySet(DispatchKey::CPU));
  EXPECT_EQ(empty({1}, std::nullopt, Device("meta")).key_set(), DispatchKeySet(DispatchKey::Meta));
}

// A boxed fallback on the Tracing key that records op names and redispatches below itself:
// the pattern the compiler's tracer and the Remote backend use.
std::vector<std::string>& traced() {
  static std::vector<std::string> v;
  return v;
}
void tracing_fallback(const OperatorHandle& op, DispatchKeySet ks, Stack& stack) {
  traced().push_back(op.name());
  op.redispatch_boxed(ks & DispatchKeySet::below(DispatchKey::Tracing), stack);
}

// Installs tracing_fallback for one test and puts back whatever was there (the compiler's
// tracer registers the key's fallback at load).
struct TestTracingFallback {
  BoxedKernel before = Dispatcher::get().fallback(DispatchKey::Tracing);
  TestTracingFallback() { Dispatcher::get().register_fallback(DispatchKey::Tracing, &tracing_fallback); }
  ~TestTracingFallback() { Dispatcher::get().register_fallback(DispatchKey::Tracing, before); }
};

TEST(Dispatcher, BoxedFallbackSeesEveryOpAndRedispatches) {
  TestTracingFallback install;
  traced().clear();
  Tensor a = ones({2, 2}), b = ones({2});
  Tensor c = add(a, b);  // Tracing not in the key set: fallthrough, nothing recorded
  EXPECT_TRUE(traced().empty());
  Tensor d;
  {
    IncludeDispatchKeyGuard g(DispatchKey::Tracing);
    d = add(a, b, 3).t();
  }
  EXPECT_EQ(testing::to_doubles(d), (std::vector<double>{4, 4, 4, 4}));
  EXPECT_EQ(traced(), (std::vector<std::string>{"add", "t"}));
  {
    IncludeDispatchKeyGuard g(DispatchKey::Tracing);
    ExcludeDispatchKeyGuard ex(DispatchKey::Tracing);  // exclusion wins
    add(a, b);
  }
  EXPECT_EQ(traced().size(), 2u);
}

TEST(Dispatcher, ThreadLocalState) {
  IncludeDispatchKeyGuard g(DispatchKey::Tracing);
  EXPECT_TRUE(tls_local_dispatch_key_set().included.has(DispatchKey::Tracing));
  bool other = true;
  std::thread([&] { other = tls_local_dispatch_key_set().included.has(DispatchKey::Tracing); }).join();
  EXPECT_FALSE(other);
}

TEST(Dispatcher, BoxedCallAndLookup) {
  OperatorHandle& op = Dispatcher::get().find_or_throw("add");
  EXPECT_STREQ(op.info().schema, "add(Tensor self, Tensor other, *, Scalar alpha=1) -> Tensor");
  EXPECT_EQ(op.info().kind, OpKind::Structured);
  Stack s{ones({3}), full({3}, 2.0), Scalar(10)};
  op.call_boxed(s);
  ASSERT_EQ(s.size(), 1u);
  EXPECT_EQ(testing::to_doubles(s[0].to_tensor()), (std::vector<double>{21, 21, 21}));
  EXPECT_NE(Dispatcher::get().find("add_"), nullptr);
  EXPECT_NE(Dispatcher::get().find("add.out"), nullptr);
  EXPECT_EQ(Dispatcher::get().find("no_such_op"), nullptr);
  expect_error(ErrorKind::Value, "unknown op 'no_such_op'", [] { Dispatcher::get().find_or_throw("no_such_op"); });
  Stack short_stack{ones({3})};
  expect_error(ErrorKind::Value, "expected 3 arguments", [&] { op.call_boxed(short_stack); });
}

TEST(Dispatcher, MissingKernelNamesOpAndKeys) {
  auto storage = Storage::create_dataless(16, Device(DeviceType::Metal));
  Tensor m(TensorImpl::make(storage, kFloat32, {4}));
  expect_error(ErrorKind::NotImplemented, "add: no kernel for dispatch keys {Metal}", [&] { add(m, m); });
  Tensor v = m.view({2, 2});  // views work on every backend
  EXPECT_TRUE(v.is_alias_of(m));
}

TEST(Dispatcher, UndefinedArgument) {
  expect_error(ErrorKind::Value, "add: argument 'other' is an undefined tensor", [] { add(ones({1}), Tensor()); });
  Tensor t;
  expect_error(ErrorKind::Value, "undefined", [&] { t.sizes(); });
  expect_error(ErrorKind::Value, "argument 'self' is an undefined tensor", [&] { t.exp(); });
  EXPECT_EQ(t.repr(), "tensor(undefined)");
}

TEST(Dispatcher, OpInfoCarriesTheTableFields) {
  const OpInfo& info = Dispatcher::get().find_or_throw("add_").info();
  EXPECT_TRUE(info.is_inplace);
  EXPECT_NE(std::string(info.derivative).find("sum_to(grad"), std::string::npos);
  EXPECT_EQ(info.batching, BatchingRule::Pointwise);
  EXPECT_EQ(info.sharding, ShardingRule::Pointwise);
  // ordinary type promotion; cat and stack are "promote"
  EXPECT_EQ(info.autocast, AutocastPolicy::None);
  EXPECT_EQ(Dispatcher::get().find_or_throw("cat").info().autocast, AutocastPolicy::Promote);
  EXPECT_STREQ(to_string(info.batching), "pointwise");
  EXPECT_TRUE(info.tags.has(OpTag::Pointwise));
  EXPECT_TRUE(info.tags.has(OpTag::Inplace));  // added by the in-place variant
  EXPECT_FALSE(Dispatcher::get().find_or_throw("add").info().tags.has(OpTag::Inplace));
  EXPECT_TRUE(info.args[0].is_mutable);
  EXPECT_EQ(info.args[0].arg_type, ArgType::Tensor);
  EXPECT_EQ(info.args[2].arg_type, ArgType::Scalar);
  // add's row claims "all" on cpu (rules.toml's named set)
  EXPECT_EQ(info.dtypes.cpu, dtype_sets::all);
  EXPECT_TRUE(info.dtypes.of(TableBackend::Cpu).has(kBool));
  const OpInfo& sum = Dispatcher::get().find_or_throw("sum").info();
  EXPECT_EQ(sum.args[1].role, ArgRole::Dim);
  EXPECT_EQ(sum.args[2].role, ArgRole::Keepdim);
  EXPECT_EQ(sum.args[3].role, ArgRole::Dtype);
  EXPECT_TRUE(Dispatcher::get().find_or_throw("view").info().is_view);
  EXPECT_TRUE(Dispatcher::get().find_or_throw("add.out").info().is_out);
  EXPECT_GT(Dispatcher::get().ops().size(), 30u);
}

TEST(Versions, InPlaceAndOutBumpTheSharedCounter) {
  Tensor a = zeros({2, 2});
  Tensor v = a.select(0, 0);
  uint32_t v0 = a.version();
  v.add_(ones({2}));
  EXPECT_EQ(a.version(), v0 + 1);
  add_out(a, ones({2, 2}), ones({2, 2}));
  EXPECT_GT(v.version(), v0 + 1);
  Tensor fresh = add(a, a);
  EXPECT_EQ(fresh.version(), 0u);
}

TEST(InPlaceAndOut, Semantics) {
  Tensor out = zeros({0});
  add_out(out, ones({2, 3}), ones({3}));  // out= resizes
  EXPECT_EQ(out.sizes(), IntArrayRef({2, 3}));
  Tensor d = zeros({3}, kFloat64);
  add_out(d, ones({3}), ones({3}));      // float32 result cast into a float64 out
  EXPECT_EQ(testing::to_doubles(d), (std::vector<double>{2, 2, 2}));
  expect_error(ErrorKind::Type, "can't be cast to the desired output type int64",
               [] { zeros({2}, kInt64).add_(ones({2})); });
  expect_error(ErrorKind::Value, "doesn't match the broadcast shape", [] { zeros({3}).add_(ones({2, 3})); });
  expect_error(ErrorKind::Value, "not broadcastable", [] { add(ones({2}), ones({3})); });
  expect_error(ErrorKind::Type, "alpha must not be a floating point number",
               [] { add(zeros({2}, kInt32), zeros({2}, kInt32), 0.5); });
}

TEST(Allocator, CachesBlocksAndReportsStats) {
  Allocator* a = cpu_allocator();
  AllocatorStats s0 = a->stats();
  void* first;
  {
    DataPtr p = a->allocate(1000);
    first = p.get();
    EXPECT_EQ(reinterpret_cast<uintptr_t>(p.get()) % 64, 0u);
    EXPECT_EQ(a->stats().in_use_bytes, s0.in_use_bytes + 1024);
  }
  EXPECT_EQ(a->stats().in_use_bytes, s0.in_use_bytes);
  EXPECT_GE(a->stats().cached_bytes, 1024u);
  DataPtr q = a->allocate(900);  // same size class: the cached block comes back
  EXPECT_EQ(q.get(), first);
  EXPECT_GT(a->stats().num_cache_hits, s0.num_cache_hits);
  DataPtr big = a->allocate((size_t{3} << 20) + 1);  // large blocks round to 2 MiB granules
  EXPECT_GE(a->stats().in_use_bytes, s0.in_use_bytes + (size_t{4} << 20));
}

}  // namespace
}  // namespace kiln

namespace kiln {
namespace {

TEST(Parallel, SetNumThreads) {
  int before = get_num_threads();
  set_num_threads(1);
  EXPECT_EQ(get_num_threads(), 1);
  Tensor x = testing::random({1 << 17});
  Tensor one = x.sum();  // results never depend on the thread count
  set_num_threads(2);
  EXPECT_EQ(testing::to_doubles(x.sum()), testing::to_doubles(one));
  testing::expect_error(ErrorKind::Value, "positive number of threads", [] { set_num_threads(0); });
  set_num_threads(before);
}

}  // namespace
}  // namespace kiln
