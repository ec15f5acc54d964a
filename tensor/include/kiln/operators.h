// kiln/operators.h: C++ operators on tensors (+, -, *, /, unary -, comparisons).
//
//   kiln::Tensor c = a + b * 2.0;     // scalars become wrapped numbers
//   kiln::Tensor m = a > 0;           // bool tensor
//   kiln::Tensor r = 1.0 / a;         // Scalar op Tensor
//   a += 1;                           // in place (add_)
#pragma once

#include "kiln/generated/ops.h"

namespace kiln {

// Tensor op Tensor, Tensor op Scalar and Scalar op Tensor for one binary op FN.
#define KILN_TENSOR_BINARY_OPERATOR(OP, FN)                                                      \
  inline Tensor operator OP(const Tensor& a, const Tensor& b) { return FN(a, b); }              \
  inline Tensor operator OP(const Tensor& a, const Scalar& b) { return FN(a, scalar_to_tensor(b)); } \
  inline Tensor operator OP(const Scalar& a, const Tensor& b) { return FN(scalar_to_tensor(a), b); }

KILN_TENSOR_BINARY_OPERATOR(+, add)
KILN_TENSOR_BINARY_OPERATOR(-, sub)
KILN_TENSOR_BINARY_OPERATOR(*, mul)
KILN_TENSOR_BINARY_OPERATOR(/, div)
KILN_TENSOR_BINARY_OPERATOR(==, eq)
KILN_TENSOR_BINARY_OPERATOR(!=, ne)
KILN_TENSOR_BINARY_OPERATOR(<, lt)
KILN_TENSOR_BINARY_OPERATOR(<=, le)
KILN_TENSOR_BINARY_OPERATOR(>, gt)
KILN_TENSOR_BINARY_OPERATOR(>=, ge)
#undef KILN_TENSOR_BINARY_OPERATOR

inline Tensor operator-(const Tensor& a) { return neg(a); }

// In place: the result must keep a's shape and dtype (int_tensor += 1.5 is a TypeError).
#define KILN_TENSOR_INPLACE_OPERATOR(OP, METHOD)                                                  \
  inline const Tensor& operator OP(const Tensor& a, const Tensor& b) { a.METHOD(b); return a; } \
  inline const Tensor& operator OP(const Tensor& a, const Scalar& b) {                          \
    a.METHOD(scalar_to_tensor(b));                                                              \
    return a;                                                                                   \
  }

KILN_TENSOR_INPLACE_OPERATOR(+=, add_)
KILN_TENSOR_INPLACE_OPERATOR(-=, sub_)
KILN_TENSOR_INPLACE_OPERATOR(*=, mul_)
KILN_TENSOR_INPLACE_OPERATOR(/=, div_)
#undef KILN_TENSOR_INPLACE_OPERATOR

}  // namespace kiln
