// kiln/default_device.h: factory ops given no device create on the default one (per thread, kCPU
// until set); an explicit device and tensors made from data are unaffected.
#include "kiln/default_device.h"

#include <gtest/gtest.h>

#include <thread>

#include "test_util.h"

namespace kiln::testing {
namespace {

TEST(DefaultDevice, FactoryOpsFollowItPerThread) {
  EXPECT_EQ(default_device(), Device(kCPU));
  {
    DefaultDeviceGuard meta(Device("meta"));
    for (const Tensor& t : {zeros({2, 3}), ones({4}), empty({1}), randn({2, 2}), rand({3}),
                            randint(0, 5, {3}), arange(0, 4), full({2}, 1.5)})
      EXPECT_EQ(t.device(), Device("meta")) << t.sizes();
    EXPECT_EQ(zeros({2}, kFloat32, Device(kCPU)).device(), Device(kCPU));  // explicit wins
    Device other_thread;
    std::thread([&] { other_thread = zeros({1}).device(); }).join();
    EXPECT_EQ(other_thread, Device(kCPU));
  }
  EXPECT_EQ(default_device(), Device(kCPU));
  EXPECT_TRUE(zeros({2}).device().is_cpu());
}

}  // namespace
}  // namespace kiln::testing
