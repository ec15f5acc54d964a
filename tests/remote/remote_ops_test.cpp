// The Remote backend on an embedded worker (kiln::client::connect_in_process): ops recorded on
// a remote device equal eager CPU (pointwise, matmul, reductions, views, in-place, random ops
// bit for bit), transfers, device mismatches, freeing, and remote errors raised at the read.
#include <gtest/gtest.h>

#include "kiln/client/embedded.h"
#include "kiln/client/session.h"
#include "test_util.h"

namespace kiln::testing {
namespace {

using client::Session;

class RemoteOps : public ::testing::Test {
 protected:
  Session s = client::connect_in_process(1, {.worker_id = "embedded"});
  Device dev = s.device();
  Tensor up(const Tensor& t) { return t.to(std::nullopt, dev); }
  static Tensor down(const Tensor& t) { return t.to(std::nullopt, Device(kCPU)); }
  int64_t worker_values() {
    return dynamic_cast<client::InProcessTransport&>(s.connection().transport()).session().num_values();
  }
};

TEST_F(RemoteOps, DeviceAndRoundTrip) {
  EXPECT_EQ(dev.type(), DeviceType::Remote);
  Tensor a = random({3, 5});
  Tensor r = up(a);
  EXPECT_EQ(r.device(), dev);
  EXPECT_EQ(r.sizes(), a.sizes());
  expect_close(down(r), a, 0, 0);
  EXPECT_EQ(down(up(from_vector<int64_t>({7}, {}))).item<int64_t>(), 7);
  EXPECT_EQ(up(from_vector<float>({2.5f}, {1})).item<float>(), 2.5f);
}

TEST_F(RemoteOps, LargeTensorsTravelInPieces) {
  Tensor a = random({3 << 18});  // 3 MiB of float32: several kChunkBytes pieces each way
  expect_close(down(up(a) * 2.0), a * 2.0, 0, 0);
}

TEST_F(RemoteOps, PointwiseMatmulReductionsEqualCpu) {
  Tensor a = random({4, 6}), b = random({4, 6}), w = random({6, 3});
  Tensor ra = up(a), rb = up(b), rw = up(w);
  expect_close(down((ra + rb).mul(rb).exp()), (a + b).mul(b).exp());
  expect_close(down(ra.matmul(rw)), a.matmul(w));
  expect_close(down(ra.sum()), a.sum());
  expect_close(down(ra.mean(std::vector<int64_t>{1}, true)), a.mean(std::vector<int64_t>{1}, true));
  auto [mv, mi] = ra.max(1);
  auto [ev, ei] = a.max(1);
  expect_close(down(mv), ev);
  expect_close(down(mi), ei);
  expect_close(down(ra.relu() * 2.0), a.relu() * 2.0);
}

TEST_F(RemoteOps, ViewsAndInPlace) {
  Tensor a = random({4, 6});
  Tensor ra = up(a);
  Tensor rt = ra.transpose(0, 1);
  EXPECT_EQ(rt.sizes(), IntArrayRef({6, 4}));
  expect_close(down(rt), a.transpose(0, 1));
  expect_close(down(ra.slice(1, 1, 5, 2)), a.slice(1, 1, 5, 2));
  // An in-place op through a view changes the base, on the worker as on CPU.
  Tensor v = ra.slice(0, 1, 3);
  v.add_(scalar_to_tensor(1.0));
  a.slice(0, 1, 3).add_(scalar_to_tensor(1.0));
  expect_close(down(ra), a);
  uint32_t version = ra.version();
  ra.mul_(scalar_to_tensor(3.0));
  EXPECT_GT(ra.version(), version);
  expect_close(down(ra), a * 3.0);
}

TEST_F(RemoteOps, FactoriesOnTheRemoteDevice) {
  Tensor z = kiln::zeros({2, 3}, std::nullopt, dev);
  EXPECT_EQ(z.device(), dev);
  expect_close(down(z), kiln::zeros({2, 3}));
  Tensor o = kiln::ones_like(z);
  EXPECT_EQ(o.device(), dev);
  expect_close(down(o), kiln::ones({2, 3}));
  Tensor e = kiln::empty_like(o);
  EXPECT_EQ(e.device(), dev);
  expect_close(down(kiln::full({2}, 4.0, kFloat64, dev)), kiln::full({2}, 4.0, kFloat64));
}

TEST_F(RemoteOps, RandomOpsMatchEagerBitForBit) {
  manual_seed(123);
  Tensor want_n = kiln::randn({5, 7});
  Tensor want_u = kiln::empty({9}).uniform_(-1, 1);
  Tensor want_b = kiln::bernoulli(kiln::full({8}, 0.5));
  manual_seed(123);
  Tensor got_n = kiln::randn({5, 7}, std::nullopt, std::nullopt, dev);
  Tensor got_u = kiln::empty({9}, std::nullopt, dev).uniform_(-1, 1);
  Tensor got_b = kiln::bernoulli(kiln::full({8}, 0.5, std::nullopt, dev));
  expect_close(down(got_n), want_n, 0, 0);
  expect_close(down(got_u), want_u, 0, 0);
  expect_close(down(got_b), want_b, 0, 0);
}

TEST_F(RemoteOps, MixedDevicesRaiseNamingBoth) {
  Tensor r = up(random({3}));
  try {
    (void)(r + random({3}));
    FAIL() << "expected a ValueError";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::Value);
    EXPECT_NE(std::string(e.what()).find("remote:"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("cpu"), std::string::npos) << e.what();
  }
  // A 0-dim CPU tensor is uploaded, as PyTorch allows.
  expect_close(down(r + from_vector<float>({2}, {})), down(r) + 2.0);
}

TEST_F(RemoteOps, UploadChecksShapesAtOnce) {
  Tensor r = up(random({2, 3}));
  EXPECT_THROW(r.copy_(random({4})), Error);
  r.copy_(from_vector<float>({1, 2, 3}, {3}));  // broadcasts, as on CPU
  expect_close(down(r), from_vector<float>({1, 2, 3, 1, 2, 3}, {2, 3}));
}

TEST_F(RemoteOps, PrintingFetches) {
  Tensor r = up(from_vector<float>({1, 2}, {2}));
  EXPECT_EQ(r.repr(), "tensor([1., 2.], device='" + dev.str() + "')");
}

TEST_F(RemoteOps, DeadHandlesAreFreedOnTheWorker) {
  Tensor x = up(random({16}));
  s.sync();
  int64_t base = worker_values();
  for (int i = 0; i < 200; ++i) {
    Tensor y = (x * 2.0 + 1.0).relu();
    x = y.slice(0, 0, 16);
  }
  s.sync();
  EXPECT_LE(worker_values(), base + 4);
}

// The Free of a released value goes ahead of the next allocation, so a worker at its memory limit
// has room again at once (4 MiB: 3 MiB, released, then 2 MiB)
// (See Note [Remote values] in kiln/client/connection.h).
TEST(RemoteMemory, AReleasedValueIsFreedBeforeTheNextAllocation) {
  Session s = client::connect_in_process(1, {.worker_id = "small", .memory_limit_bytes = 4 << 20});
  Tensor x = kiln::ones({3 << 18}, std::nullopt, s.device());
  EXPECT_EQ(x.sum().item<float>(), float(3 << 18));
  x = Tensor();
  Tensor y = kiln::ones({2 << 18}, std::nullopt, s.device());
  EXPECT_EQ(y.sum().item<float>(), float(2 << 18));
}

TEST_F(RemoteOps, ErrorAtTheReadNamesTheOp) {
  // Recording succeeds (the client's meta check passes); the worker fails at run time.
  Tensor idx = up(from_vector<int64_t>({0, 7}, {2}));
  Tensor src = up(random({3}));
  Tensor bad = kiln::index_select(src, 0, idx);
  Tensor later = bad * 2.0;
  try {
    (void)later.sum().item<float>();
    FAIL() << "expected an error";
  } catch (const Error& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("'index_select'"), std::string::npos) << msg;
    EXPECT_NE(msg.find("seq"), std::string::npos) << msg;
  }
  // Independent work goes on; sync reports the failure once.
  EXPECT_THROW(s.sync(), Error);
  EXPECT_EQ(up(from_vector<float>({3}, {1})).item<float>(), 3.0f);
  s.sync();
}

TEST_F(RemoteOps, ErrorNamesTheCallSiteWhenAProviderIsSet) {
  client::set_call_site_provider([] { return std::string("train.py:42 in step"); });
  Tensor bad = kiln::index_select(up(random({3})), 0, up(from_vector<int64_t>({5}, {1})));
  client::set_call_site_provider(nullptr);
  try {
    s.sync();
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::Index) << e.what();
    EXPECT_NE(std::string(e.what()).find("recorded at train.py:42 in step"), std::string::npos)
        << e.what();
  }
}

TEST_F(RemoteOps, ClosedSessionRefusesOps) {
  Tensor r = up(random({2}));
  s.close();
  EXPECT_THROW((void)(r + r), Error);
}

}  // namespace
}  // namespace kiln::testing
