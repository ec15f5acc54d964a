// A short tour of Kiln's eager tensor API on the embedded worker: everything runs in-process.
// Run it with the README's first command (scripts/demo) or build/bin/tensor_tour.
#include <iostream>

#include "kiln/kiln.h"

using namespace kiln;

int main() {
  manual_seed(0);

  std::cout << "== creation, dtypes and printing\n";
  Tensor a = arange(0, 6).to(kFloat32).view({2, 3});
  std::cout << "a = " << a << "\n";
  std::cout << "eye(2, 3, int64) = " << eye(2, 3, kInt64) << "\n";

  std::cout << "\n== broadcasting and type promotion (scalars are wrapped numbers)\n";
  Tensor b = a * 2 + ones({3});
  std::cout << "a * 2 + ones(3) = " << b << "\n";
  std::cout << "int32 tensor + 0.5 -> " << (zeros({2}, kInt32) + 0.5).dtype() << "\n";

  std::cout << "\n== views share storage (and a version counter)\n";
  Tensor row = a.select(0, 1);
  row.fill_(-1);
  std::cout << "after a.select(0, 1).fill_(-1): a = " << a << "\n";
  std::cout << "a.t() is contiguous? " << (a.t().is_contiguous() ? "yes" : "no")
            << "; a.version() = " << a.version() << "\n";

  std::cout << "\n== math, reductions, matmul\n";
  Tensor x = randn({4, 3});
  Tensor w = randn({3, 2});
  Tensor y = gelu(matmul(x, w));
  std::cout << "gelu(x @ w) = " << y << "\n";
  std::cout << "softmax(y, -1).sum(-1) = " << softmax(y, -1).sum(std::vector<int64_t>{-1}) << "\n";
  auto [values, indices] = max(x, 1);
  std::cout << "max over dim 1: values " << values << ", indices " << indices << "\n";
  std::cout << "x.std() = " << x.std().item<float>() << "\n";

  std::cout << "\n== the Meta device: shapes without data\n";
  Tensor big = empty({4096, 4096}, std::nullopt, Device("meta"));
  Tensor prod = mm(big, big.t());
  std::cout << "mm on meta -> " << prod << "\n";

  std::cout << "\n== errors name the op and the shapes\n";
  try {
    mm(ones({2, 3}), ones({4, 5}));
  } catch (const Error& e) {
    std::cout << error_kind_name(e.kind()) << ": " << e.what() << "\n";
  }
  return 0;
}
