// kiln/operators.h: C++ operators on tensors (+, -, *, /, unary -, comparisons).
//
//   kiln::Tensor c = a + b * 2.0;     // scalars become wrapped numbers
//   kiln::Tensor m = a > 0;           // bool tensor
//   a += 1;                           // in place (add_)
#pragma once

#include "kiln/generated/ops.h"

namespace kiln {

inline Tensor operator+(const Tensor& a, const Tensor& b) { return add(a, b); }
inline Tensor operator+(const Tensor& a, const Scalar& b) { return add(a, scalar_to_tensor(b)); }
inline Tensor operator+(const Scalar& a, const Tensor& b) { return add(scalar_to_tensor(a), b); }
inline const Tensor& operator+=(const Tensor& a, const Tensor& b) { a.add_(b); return a; }
inline const Tensor& operator+=(const Tensor& a, const Scalar& b) { a.add_(scalar_to_tensor(b)); return a; }

}  // namespace kiln
