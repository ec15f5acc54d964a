// kiln/autograd/formulas.h: the helper functions that the op table's derivative and jvp formulas
// call (the `formula_functions` lists in tensor/ops/rules.toml and at the top of each table), as
// PyTorch's FunctionsManual.cpp holds them. Every helper is written with kiln ops only, so the
// gradient it returns is itself differentiable: double backward runs through these functions.
//
// A generated autograd kernel pastes a row's formula verbatim, with the op's arguments bound to
// C++ variables of the op's parameter types, `grad` the incoming gradient and `result` the output:
//
//   using namespace kiln;  using namespace kiln::autograd;
//   // add: d[other] = "sum_to(scaled(grad, alpha), other.sizes())"
//   Tensor g_other = sum_to(scaled(grad, alpha), other.sizes());
//   // select: d[self] = "select_backward(grad, self.sizes(), dim, index)"
//   Tensor g_self = select_backward(grad, self.sizes(), dim, index);
//
// Conventions: `sizes` parameters are the input's shape; dims may be negative (wrapped against the
// input's rank); a gradient is returned in `grad`'s dtype and device unless the name says otherwise
// (cast_back converts to the input's dtype/device).
#pragma once

#include <cmath>  // M_SQRT1_2, M_2_SQRTPI, M_PI: formulas use them
#include <optional>
#include <string_view>
#include <vector>

#include "kiln/autograd/formulas_nn.h"  // norm rows: channel_sum
#include "kiln/kiln.h"

namespace kiln::autograd {

// ---- Broadcasting and casts (formulas_pointwise.cpp) -----------------------------------------
// Sums `grad` over the dims that broadcasting added or expanded so it has shape `sizes`.
Tensor sum_to(const Tensor& grad, IntArrayRef sizes);
Tensor grad_for_broadcast(const Tensor& grad, IntArrayRef sizes);  // = sum_to
Tensor reduce_grad(const Tensor& grad, const Tensor& input);        // = sum_to(grad, input.sizes())
// grad * s, or grad itself when s is 1 (alpha/beta of add and addmm: no copy for the usual 1).
Tensor scaled(const Tensor& grad, const Scalar& s);
// Converts a gradient to the dtype and device of `like` (no-op when they match).
Tensor cast_back(const Tensor& grad, const Tensor& like);
// The same from the dtype and device alone (what a node keeps when it needs no more of `like`).
Tensor cast_back(const Tensor& grad, ScalarType dtype, Device device);
// copy_(self, src): the gradient for src (broadcast-summed, cast back to src's dtype/device).
Tensor copy_backward(const Tensor& grad, const Tensor& src);
// where(mask, grad, 0).
Tensor mask_grad(const Tensor& grad, const Tensor& mask);
// grad * sign(self): abs's gradient.
Tensor sign_grad(const Tensor& grad, const Tensor& self);

// ---- Pointwise (formulas_pointwise.cpp) ---------------------------------------------------------
// pow(self, exponent): gradients for self and for exponent (summed to their shapes).
Tensor pow_backward_self(const Tensor& grad, const Tensor& self, const Tensor& exponent);
Tensor pow_backward_self(const Tensor& grad, const Tensor& self, const Scalar& exponent);
Tensor pow_backward_exponent(const Tensor& grad, const Tensor& self, const Tensor& exponent,
                             const Tensor& result);
Tensor pow_backward_exponent(const Tensor& grad, const Scalar& self, const Tensor& exponent,
                             const Tensor& result);
// fmod(self, other): the gradient for other, -grad * trunc(self / other), summed to other's shape.
Tensor fmod_backward(const Tensor& grad, const Tensor& self, const Tensor& other);
// clamp(self, min, max): grad where min <= self <= max, else 0 (a bound that is absent is open).
Tensor clamp_backward(const Tensor& grad, const Tensor& self, const std::optional<Scalar>& min,
                      const std::optional<Scalar>& max);
Tensor clamp_backward(const Tensor& grad, const Tensor& self, const std::optional<Tensor>& min,
                      const std::optional<Tensor>& max);
// where(condition, self, other): the gradient for self (is_self) or other, summed to `sizes`.
Tensor where_backward(const Tensor& grad, const Tensor& condition, bool is_self, IntArrayRef sizes);
// masked_fill(self, mask, value): grad with masked positions zeroed, summed to `sizes`.
Tensor masked_fill_backward(const Tensor& grad, const Tensor& mask, IntArrayRef sizes);

// ---- Linear algebra (formulas_pointwise.cpp) ----------------------------------------------------
// matmul(self, other) with 1-D operands and broadcast batch dims.
Tensor matmul_backward_self(const Tensor& grad, const Tensor& self, const Tensor& other);
Tensor matmul_backward_other(const Tensor& grad, const Tensor& self, const Tensor& other);
// mm(mat1, mat2)'s gradient for mat2, mat1.t().mm(grad), laid out like mat2 when mat2 is
// transposed (as PyTorch's mm_mat2_backward), so a linear layer's weight gradient is contiguous.
Tensor mm_mat2_backward(const Tensor& grad, const Tensor& mat1, const Tensor& mat2);

// ---- Reductions (formulas_reduction.cpp) --------------------------------------------------------
// Inserts the reduced dims of `dim` (all dims when absent or empty) back as size 1, for a result of
// a reduction over an `ndim`-D input with keepdim=false.
Tensor unsqueeze_dims(const Tensor& t, OptionalIntArrayRef dim, int64_t ndim);
// unsqueeze_dims unless keepdim.
Tensor restore_reduced(const Tensor& t, OptionalIntArrayRef dim, int64_t ndim, bool keepdim);
// Unsqueezes `t` (a reduction over `sizes` with keepdim=false along `dim`) back to sizes' rank.
Tensor unsqueeze_to(const Tensor& t, IntArrayRef sizes);
Tensor unsqueeze_to(const Tensor& t, int64_t dim, IntArrayRef sizes);
// sum(self, dim, keepdim): grad expanded back to `sizes`.
Tensor sum_backward(const Tensor& grad, IntArrayRef sizes, OptionalIntArrayRef dim, bool keepdim);
Tensor expand_grad(const Tensor& grad, IntArrayRef sizes, OptionalIntArrayRef dim, bool keepdim);
// mean(self, dim, keepdim): sum_backward / (number of reduced elements); numel is self.numel().
Tensor mean_backward(const Tensor& grad, IntArrayRef sizes, OptionalIntArrayRef dim, int64_t numel,
                     bool keepdim);
// prod(self, dim, keepdim); correct when self holds zeros.
Tensor prod_backward(const Tensor& grad, const Tensor& self, const Tensor& result,
                     OptionalIntArrayRef dim, bool keepdim);
// max(self)/min(self): grad shared evenly among the elements equal to result (NaN matches NaN).
Tensor evenly_distribute_backward(const Tensor& grad, const Tensor& self, const Tensor& result);
// amax/amin(self, dim, keepdim): grad shared evenly among the elements equal to their slice's
// result (NaN matches NaN), as PyTorch's scale_grad_by_count.
Tensor amax_amin_backward(const Tensor& grad, const Tensor& self, const Tensor& result,
                          IntArrayRef dim, bool keepdim);
// max.dim/min.dim: grad scattered to `indices` along dim in zeros of `sizes`.
Tensor value_selecting_reduction_backward(const Tensor& grad, int64_t dim, const Tensor& indices,
                                          IntArrayRef sizes, bool keepdim);
Tensor minmax_backward(const Tensor& grad, const Tensor& self, const Tensor& result);
Tensor minmax_backward(const Tensor& grad, int64_t dim, const Tensor& indices, IntArrayRef sizes,
                       bool keepdim);
// var/std(self, dim, correction, keepdim).
Tensor var_backward(const Tensor& grad, const Tensor& self, OptionalIntArrayRef dim,
                    double correction, bool keepdim);
Tensor std_backward(const Tensor& result, const Tensor& grad, const Tensor& self,
                    OptionalIntArrayRef dim, double correction, bool keepdim);
// norm(self, p, dim, keepdim) for p = 0, 1, 2, inf, -inf and any other p; 0 where result is 0.
Tensor norm_backward(const Tensor& grad, const Tensor& self, const Scalar& p, const Tensor& result,
                     OptionalIntArrayRef dim, bool keepdim);
// logsumexp(self, dim, keepdim): grad * exp(self - result).
Tensor logsumexp_backward(const Tensor& grad, const Tensor& self, const Tensor& result,
                          IntArrayRef dim, bool keepdim);
// softmax/log_softmax(self, dim): `result` is the op's output; `self` is the input (its dtype is
// what cast_back restores, the formulas do it).
Tensor softmax_backward(const Tensor& grad, const Tensor& result, int64_t dim, const Tensor& self);
Tensor log_softmax_backward(const Tensor& grad, const Tensor& result, int64_t dim,
                            const Tensor& self);

// ---- Views (formulas_views.cpp) -----------------------------------------------------------------
Tensor view_backward(const Tensor& grad, IntArrayRef sizes);  // grad.reshape(sizes)
Tensor permute_backward(const Tensor& grad, IntArrayRef dims);
// zeros of `sizes` with grad placed where the view took its elements.
Tensor select_backward(const Tensor& grad, IntArrayRef sizes, int64_t dim, int64_t index);
Tensor slice_backward(const Tensor& grad, IntArrayRef sizes, int64_t dim,
                      std::optional<int64_t> start, std::optional<int64_t> end, int64_t step);
Tensor diagonal_backward(const Tensor& grad, IntArrayRef sizes, int64_t offset, int64_t dim1,
                         int64_t dim2);
// as_strided(self, size, stride, storage_offset): grad accumulated into self's storage positions
// (overlapping output elements add up; an input whose elements overlap shares the sum evenly).
Tensor as_strided_backward(const Tensor& grad, const Tensor& self, IntArrayRef size,
                           IntArrayRef stride, std::optional<int64_t> storage_offset);
// The same from the input's geometry alone (storage offsets absolute): a view's grad_fn made
// again from its base's history (Note [CopySlices] in autograd/src/copy_slices.h).
Tensor as_strided_backward_geometry(const Tensor& grad, IntArrayRef in_sizes,
                                    IntArrayRef in_strides, int64_t in_offset, IntArrayRef size,
                                    IntArrayRef stride, int64_t offset);
Tensor tril_backward(const Tensor& grad, int64_t diagonal);
Tensor triu_backward(const Tensor& grad, int64_t diagonal);

// ---- Lists and indexing (formulas_indexing.cpp) -------------------------------------------------
// cat(tensors, dim): one gradient per input (a skipped 1-D empty input gets an empty gradient).
std::vector<Tensor> cat_backward(const Tensor& grad, TensorList tensors, int64_t dim);
// stack(tensors, dim): grad unbound along dim.
std::vector<Tensor> stack_backward(const Tensor& grad, TensorList tensors, int64_t dim);
// split(self, split_size, dim): the output gradients (undefined ones count as zeros) concatenated.
Tensor split_backward(TensorList grads, IntArrayRef sizes, int64_t split_size, int64_t dim);
// split_with_sizes(self, split_sizes, dim): the same, pieces of split_sizes.
Tensor split_with_sizes_backward(TensorList grads, IntArrayRef sizes, IntArrayRef split_sizes,
                                 int64_t dim);
// chunk(self, chunks, dim): split_backward with chunk's piece size.
Tensor chunk_backward(TensorList grads, IntArrayRef sizes, int64_t chunks, int64_t dim);
// index_select(self, dim, index): grad accumulated into zeros of `sizes` at `index` along dim.
Tensor index_select_backward(const Tensor& grad, IntArrayRef sizes, int64_t dim,
                             const Tensor& index);
// gather(self, dim, index): grad scatter-added into zeros shaped like self.
Tensor gather_backward(const Tensor& grad, const Tensor& self, int64_t dim, const Tensor& index);
// scatter(self, dim, index, src): the gradient for self (zero where src was written).
Tensor scatter_backward(const Tensor& grad, int64_t dim, const Tensor& index);
// scatter/scatter_add(self, dim, index, src): the gradient for src, grad.gather(dim, index); with
// src_sizes, zero-padded to src's shape (src may be larger than index: its extra elements are
// unused and get 0).
Tensor scatter_add_backward(const Tensor& grad, int64_t dim, const Tensor& index);
Tensor scatter_add_backward(const Tensor& grad, int64_t dim, const Tensor& index,
                            IntArrayRef src_sizes);
// self[indices[0], ..., indices[k-1]] (int64 index tensors that broadcast together, indexing the
// leading k dims): grad accumulated into zeros of `sizes`.
Tensor index_backward(const Tensor& grad, IntArrayRef sizes, TensorList indices);

}  // namespace kiln::autograd

#include "kiln/autograd/formulas_attention.h"  // attention.toml
#include "kiln/autograd/formulas_comm.h"       // comm.toml
#include "kiln/autograd/formulas_conv.h"       // conv.toml and pool.toml
#include "kiln/autograd/formulas_index.h"      // advanced indexing, sort/scan and padding
#include "kiln/autograd/formulas_quantized.h"  // quantized.toml
