// Meta functions of the shape ops (tensor/ops/shape.toml): cat, stack, split, split_with_sizes,
// chunk, tril/triu.
#include <algorithm>

#include "kiln/generated/meta/creation.h"
#include "kiln/generated/meta/shape.h"
#include "kiln/generated/meta/views.h"
#include "kiln/meta.h"

namespace kiln::meta {

// Note [Legacy empty cat inputs]: like PyTorch, cat skips 1-D tensors of size 0 when it checks
// shapes and wraps `dim` (they may appear among N-D inputs), but they still take part in type
// promotion. When every input is such a tensor the result is one too.
static bool skipped_in_cat(const Tensor& t) { return t.dim() == 1 && t.size(0) == 0; }

TensorSpec cat(TensorList tensors, int64_t dim) {
  KILN_CHECK(!tensors.empty(), Value, "cat: expected a non-empty list of tensors");
  int64_t ref = -1;
  for (size_t i = 0; i < tensors.size(); ++i) {
    tensors[i].check_defined("cat");
    KILN_CHECK(tensors[i].dim() > 0, Value, "cat: zero-dimensional tensor (at position ", i,
               ") cannot be concatenated");
    if (ref < 0 && !skipped_in_cat(tensors[i])) ref = static_cast<int64_t>(i);
  }
  Device device = common_device("cat", tensors);
  ScalarType dtype = result_type(tensors);
  if (ref < 0) return contiguous_spec({0}, dtype, device);
  const Tensor& r = tensors[ref];
  int64_t d = wrap_dim("cat", dim, r.dim());
  DimVector sizes(r.sizes());
  sizes[d] = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const Tensor& t = tensors[i];
    if (skipped_in_cat(t)) continue;
    KILN_CHECK(t.dim() == r.dim(), Value,
               "cat: tensors must have the same number of dimensions: tensor ", ref, " has shape ",
               r.sizes(), " but tensor ", i, " has shape ", t.sizes());
    for (int64_t k = 0; k < r.dim(); ++k)
      KILN_CHECK(k == d || t.size(k) == r.size(k), Value,
                 "cat: sizes of tensors must match except in dimension ", d, ": tensor ", ref,
                 " has shape ", r.sizes(), " but tensor ", i, " has shape ", t.sizes(),
                 " (mismatch at dimension ", k, ")");
    sizes[d] += t.size(d);
  }
  return contiguous_spec(sizes, dtype, device);
}

TensorSpec stack(TensorList tensors, int64_t dim) {
  KILN_CHECK(!tensors.empty(), Value, "stack: expected a non-empty list of tensors");
  const Tensor& r = tensors[0].check_defined("stack");
  for (size_t i = 1; i < tensors.size(); ++i)
    KILN_CHECK(tensors[i].check_defined("stack").sizes() == r.sizes(), Value,
               "stack: expects each tensor to be equal size, but got ", r.sizes(),
               " at entry 0 and ", tensors[i].sizes(), " at entry ", i);
  int64_t d = wrap_dim("stack", dim, r.dim() + 1);
  DimVector sizes(r.sizes());
  sizes.insert(d, static_cast<int64_t>(tensors.size()));
  return contiguous_spec(sizes, result_type(tensors), common_device("stack", tensors));
}

// One op returns at most kMaxPieces views. A split into single rows of a huge dimension (of a
// zero-size tensor, so no memory bounds it), or chunk(x, 10**12) of an empty one, would
// otherwise allocate a view per piece until the process runs out of memory, and the worker runs
// such programs straight from the network. PyTorch has no such bound.
constexpr int64_t kMaxPieces = int64_t{1} << 20;

static void check_pieces(const char* op, int64_t num) {
  KILN_CHECK(num <= kMaxPieces, Value, op, ": would return ", num,
             " tensors, more than the ", kMaxPieces, " one op may return");
}

std::vector<TensorSpec> split(const Tensor& self, int64_t split_size, int64_t dim) {
  KILN_CHECK(self.dim() > 0, Value, "split: expects at least a 1-dimensional tensor");
  KILN_CHECK(split_size >= 0, Value, "split: split_size must be non-negative, got ", split_size);
  int64_t d = wrap_dim("split", dim, self.dim());
  int64_t n = self.size(d);
  KILN_CHECK(split_size > 0 || n == 0, Value,
             "split: split_size can only be 0 if dimension size is 0, but got dimension size of ",
             n);
  int64_t num = n == 0 ? 1 : (n - 1) / split_size + 1;  // split_size > 0 when n > 0
  check_pieces("split", num);
  std::vector<TensorSpec> out;
  out.reserve(num);
  for (int64_t i = 0; i < num; ++i) {
    int64_t start = i * split_size;
    out.push_back(slice(self, d, start, start + std::min(split_size, n - start), 1));
  }
  return out;
}

std::vector<TensorSpec> split_with_sizes(const Tensor& self, IntArrayRef split_sizes, int64_t dim) {
  const char* op = "split_with_sizes";
  KILN_CHECK(self.dim() > 0, Value, op, ": expects at least a 1-dimensional tensor");
  const int64_t d = wrap_dim(op, dim, self.dim()), n = self.size(d);
  int64_t total = 0;  // stops at n + 1: no overflow
  for (int64_t s : split_sizes) {
    KILN_CHECK(s >= 0, Value, op,
               ": expects split_sizes to have only non-negative entries, but got split_sizes=",
               split_sizes);
    total = std::min(total + std::min(s, n + 1), n + 1);
  }
  KILN_CHECK(total == n, Value, op, ": expects split_sizes to sum exactly to ", n,
             " (the size of dimension ", d, " of the input of shape ", self.sizes(),
             "), but got split_sizes=", split_sizes);
  check_pieces(op, static_cast<int64_t>(split_sizes.size()));
  std::vector<TensorSpec> out;
  out.reserve(split_sizes.size());
  int64_t start = 0;
  for (int64_t s : split_sizes) {
    out.push_back(slice(self, d, start, start + s, 1));
    start += s;
  }
  return out;
}

std::vector<TensorSpec> chunk(const Tensor& self, int64_t chunks, int64_t dim) {
  KILN_CHECK(self.dim() > 0, Value, "chunk: expects at least a 1-dimensional tensor");
  KILN_CHECK(chunks > 0, Value, "chunk: expects `chunks` to be greater than 0, got: ", chunks);
  int64_t d = wrap_dim("chunk", dim, self.dim());
  int64_t n = self.size(d);
  // As in PyTorch: an empty dim still yields `chunks` (empty) pieces.
  if (n == 0) {
    check_pieces("chunk", chunks);
    return std::vector<TensorSpec>(chunks, slice(self, d, 0, 0, 1));
  }
  return split(self, (n - 1) / chunks + 1, d);
}

static TensorSpec triangular(const char* op, const Tensor& self) {
  KILN_CHECK(self.dim() >= 2, Value, op,
             ": input tensor must have at least 2 dimensions, got shape ", self.sizes());
  return contiguous_spec(self.sizes(), self.dtype(), self.device());
}

TensorSpec tril(const Tensor& self, int64_t) { return triangular("tril", self); }
TensorSpec triu(const Tensor& self, int64_t) { return triangular("triu", self); }

}  // namespace kiln::meta

namespace kiln::meta {

// ---- flip, roll, repeat, padding

TensorSpec flip(const Tensor& self, IntArrayRef dims) {
  dim_mask("flip", dims, self.dim());  // wraps, rejects repeats
  return contiguous_spec(self.sizes(), self.dtype(), self.device());
}

TensorSpec roll(const Tensor& self, IntArrayRef shifts, IntArrayRef dims) {
  if (dims.empty()) {
    KILN_CHECK(shifts.size() == 1, Value, "roll: without dims the flattened tensor is rolled by ",
               "one shift, got shifts ", shifts);
  } else {
    KILN_CHECK(shifts.size() == dims.size(), Value, "roll: shifts and dims must have the same length, ",
               "got shifts ", shifts, " and dims ", dims);
    for (int64_t d : dims) wrap_dim("roll", d, self.dim());
  }
  return contiguous_spec(self.sizes(), self.dtype(), self.device());
}

TensorSpec repeat(const Tensor& self, IntArrayRef repeats) {
  KILN_CHECK(static_cast<int64_t>(repeats.size()) >= self.dim(), Value,
             "repeat: the number of repeats (", repeats.size(),
             ") can not be smaller than the number of dimensions of self of shape ", self.sizes());
  const size_t lead = repeats.size() - self.dim();
  DimVector sizes(repeats.size());
  for (size_t k = 0; k < repeats.size(); ++k) {
    KILN_CHECK(repeats[k] >= 0, Value, "repeat: repeats must be non-negative, got ", repeats);
    sizes[k] = repeats[k] * (k < lead ? 1 : self.size(k - lead));
  }
  return contiguous_spec(sizes, self.dtype(), self.device());
}

// pad = (left of the last dim, right of the last dim, left of the one before, ...), as PyTorch.
static DimVector padded_shape(const char* op, const Tensor& self, IntArrayRef pad) {
  KILN_CHECK(pad.size() % 2 == 0, Value, op, ": the padding length must be even, got ", pad);
  const int64_t n = static_cast<int64_t>(pad.size()) / 2;
  KILN_CHECK(n <= self.dim(), Value, op, ": padding ", pad, " covers ", n,
             " dimensions but self of shape ", self.sizes(), " has only ", self.dim());
  DimVector sizes(self.sizes());
  for (int64_t k = 0; k < n; ++k) {
    const int64_t d = self.dim() - 1 - k;
    sizes[d] += pad[2 * k] + pad[2 * k + 1];
    KILN_CHECK(sizes[d] >= 0, Value, op, ": padding ", pad, " makes dimension ", d,
               " of self of shape ", self.sizes(), " negative (", sizes[d], ")");
  }
  return sizes;
}

TensorSpec constant_pad_nd(const Tensor& self, IntArrayRef pad, const Scalar&) {
  return contiguous_spec(padded_shape("constant_pad_nd", self, pad), self.dtype(), self.device());
}

TensorSpec pad(const Tensor& self, IntArrayRef pad, std::string_view mode,
               std::optional<double> value) {
  KILN_CHECK(mode == "constant" || mode == "reflect" || mode == "replicate" || mode == "circular",
             Value, "pad: mode must be 'constant', 'reflect', 'replicate' or 'circular', got '",
             mode, "'");
  DimVector sizes = padded_shape("pad", self, pad);
  if (mode == "constant") return contiguous_spec(sizes, self.dtype(), self.device());
  KILN_CHECK(!value.has_value(), Value, "pad: mode '", mode, "' takes no value argument");
  for (size_t k = 0; k < pad.size(); ++k) {
    const int64_t d = self.dim() - 1 - static_cast<int64_t>(k / 2), n = self.size(d);
    KILN_CHECK(pad[k] >= 0, Value, "pad: mode '", mode, "' needs non-negative padding, got ", pad);
    if (mode == "reflect")
      KILN_CHECK(pad[k] < n, Value, "pad: reflect padding ", pad[k], " must be less than the size ",
                 n, " of dimension ", d, " of self of shape ", self.sizes());
    if (mode == "circular")
      KILN_CHECK(pad[k] <= n, Value, "pad: circular padding ", pad[k],
                 " must be at most the size ", n, " of dimension ", d, " of self of shape ",
                 self.sizes());
    if (mode == "replicate")
      KILN_CHECK(pad[k] == 0 || n > 0, Value, "pad: replicate padding of the empty dimension ", d,
                 " of self of shape ", self.sizes());
  }
  return contiguous_spec(sizes, self.dtype(), self.device());
}

}  // namespace kiln::meta
