#include <gtest/gtest.h>

#include "kiln/kiln.h"

namespace kiln {

TEST(Core, AddBroadcastsAndPromotes) {
  Tensor a = ones({2, 3});
  Tensor b = arange(0, 3).to(kFloat32);
  Tensor c = add(a, b, 2);
  EXPECT_EQ(c.sizes(), IntArrayRef({2, 3}));
  EXPECT_FLOAT_EQ(c.select(0, 1).select(0, 2).item<float>(), 5.0f);
}

TEST(Core, MetaAdd) {
  Tensor a = empty({4, 1}, std::nullopt, Device("meta"));
  Tensor b = empty({3}, std::nullopt, Device("meta"));
  Tensor c = add(a, b);
  EXPECT_TRUE(c.is_meta());
  EXPECT_EQ(c.sizes(), IntArrayRef({4, 3}));
}

}  // namespace kiln
