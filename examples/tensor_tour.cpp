// A short tour of Kiln's eager tensor API (the embedded worker: everything runs in-process).
#include <iostream>

#include "kiln/kiln.h"

int main() {
  using namespace kiln;
  Tensor a = ones({2, 3});
  Tensor b = arange(0, 3).to(kFloat32);
  std::cout << "a + 2*b =\n" << add(a, b, 2) << "\n";
  Tensor m = empty({128, 64}, std::nullopt, Device("meta"));
  std::cout << "meta tensor: " << m << "\n";
  return 0;
}
