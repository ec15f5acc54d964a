// Streams, the current stream, and events (kiln/cuda/stream.h).
#include <atomic>
#include <chrono>
#include <thread>

#include "cuda/gpu_util.h"
#include "cuda/harness.h"
#include "kiln/cuda/stream.h"

using namespace kiln;
using namespace kiln::gputest;

namespace {
void CUDART_CB hold(void* arg) {
  auto* flag = static_cast<std::atomic<bool>*>(arg);
  auto until = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (!flag->load() && std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(std::chrono::microseconds(100));
}
}  // namespace

GPU_TEST(Stream, CurrentStreamDefaultsAndGuardRestores) {
  REQUIRE_GPU();
  EXPECT_TRUE(cuda::getCurrentStream(0).is_default());
  EXPECT_TRUE(cuda::getCurrentStream(0) == cuda::getDefaultStream(0));
  cuda::Stream s = cuda::getStreamFromPool(0);
  EXPECT_FALSE(s.is_default());
  {
    cuda::StreamGuard g(s);
    EXPECT_TRUE(cuda::getCurrentStream(0) == s);
    EXPECT_TRUE(cuda::getCurrentStream() == s);
  }
  EXPECT_TRUE(cuda::getCurrentStream(0).is_default());
  cuda::setCurrentStream(s);
  EXPECT_TRUE(cuda::getCurrentStream(0) == s);
  cuda::setCurrentStream(cuda::getDefaultStream(0));
}

GPU_TEST(Stream, CurrentStreamIsThreadLocal) {
  REQUIRE_GPU();
  cuda::Stream s = cuda::getStreamFromPool(0);
  cuda::StreamGuard g(s);
  bool other_default = false;
  std::thread t([&] { other_default = cuda::getCurrentStream(0).is_default(); });
  t.join();
  EXPECT_TRUE(other_default);
}

GPU_TEST(Stream, OpsRunOnTheCurrentStream) {
  REQUIRE_GPU();
  cuda::Stream s = cuda::getStreamFromPool(0);
  std::atomic<bool> release{false};
  Tensor t = kiln::empty({1024}, kFloat32, Device("cuda"));
  KILN_CUDA_CHECK(cudaLaunchHostFunc(s, hold, &release));
  {
    cuda::StreamGuard g(s);
    t.fill_(3);  // queued behind the held host function
    EXPECT_FALSE(s.query());
  }
  release = true;
  s.synchronize();
  EXPECT_TRUE(s.query());
  EXPECT_EQ(values(t)[1023], 3.0);
}

GPU_TEST(Event, RecordQuerySynchronize) {
  REQUIRE_GPU();
  cuda::Stream s = cuda::getStreamFromPool(0);
  cuda::Event e;
  EXPECT_TRUE(e.query());  // never recorded
  std::atomic<bool> release{false};
  KILN_CUDA_CHECK(cudaLaunchHostFunc(s, hold, &release));
  e.record(s);
  EXPECT_FALSE(e.query());
  release = true;
  e.synchronize();
  EXPECT_TRUE(e.query());
}

GPU_TEST(Event, WaitOrdersAnotherStream) {
  REQUIRE_GPU();
  cuda::Stream a = cuda::getStreamFromPool(0), b = cuda::getStreamFromPool(0);
  std::atomic<bool> release{false};
  KILN_CUDA_CHECK(cudaLaunchHostFunc(a, hold, &release));
  cuda::Event e;
  e.record(a);
  e.wait(b);
  cuda::Event after_b;
  after_b.record(b);
  EXPECT_FALSE(after_b.query());  // b waits for a
  release = true;
  after_b.synchronize();
  EXPECT_TRUE(e.query());
}

GPU_TEST(Event, ElapsedTime) {
  REQUIRE_GPU();
  cuda::Stream s = cuda::getStreamFromPool(0);
  cuda::Event start(true), end(true);
  Tensor t = kiln::empty({1 << 22}, kFloat32, Device("cuda"));
  cuda::StreamGuard g(s);
  start.record();
  for (int i = 0; i < 10; ++i) t.fill_(i + 1);
  end.record();
  end.synchronize();
  float ms = start.elapsed_time(end);
  EXPECT_TRUE(ms > 0.0f);
  EXPECT_TRUE(ms < 10000.0f);
  cuda::Event untimed;
  untimed.record();
  EXPECT_ERROR(ErrorKind::Value, "enable_timing", { untimed.elapsed_time(end); });
}
