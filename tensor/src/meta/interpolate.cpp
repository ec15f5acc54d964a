// Meta functions of the resampling ops (tensor/ops/interpolate.toml): self is (N, C, *spatial).
#include <cmath>

#include "kiln/generated/meta/interpolate.h"
#include "kiln/generated/meta/unary.h"
#include "kiln/meta.h"

namespace kiln::meta {

// (N, C) of `input_size` followed by output_size, after checking that they fit together.
static DimVector resampled(const char* op, IntArrayRef input_size, IntArrayRef output_size,
                           int64_t min_spatial, int64_t max_spatial, std::optional<double> scale) {
  const int64_t spatial = static_cast<int64_t>(input_size.size()) - 2;
  KILN_CHECK(spatial >= min_spatial && spatial <= max_spatial, Value, op, ": expected an input of ",
             min_spatial + 2, " to ", max_spatial + 2, " dimensions (N, C, spatial...), got shape ",
             input_size);
  KILN_CHECK(static_cast<int64_t>(output_size.size()) == spatial, Value, op, ": output_size ",
             output_size, " must have one size per spatial dimension of the input of shape ",
             input_size);
  KILN_CHECK(!scale || *scale > 0, Value, op, ": scale must be positive, got ", *scale);
  DimVector sizes{input_size[0], input_size[1]};
  for (int64_t k = 0; k < spatial; ++k) {
    KILN_CHECK(input_size[k + 2] > 0 && output_size[k] > 0, Value, op,
               ": input and output sizes should be greater than 0, got input of shape ", input_size,
               " and output_size ", output_size);
    sizes.push_back(output_size[k]);
  }
  return sizes;
}

TensorSpec upsample_nearest(const Tensor& self, IntArrayRef output_size,
                            std::optional<double> scale) {
  DimVector sizes = resampled("upsample_nearest", self.sizes(), output_size, 1, 3, scale);
  return contiguous_spec(sizes, self.dtype(), self.device());
}

static TensorSpec resample_backward(const char* op, const Tensor& grad_output,
                                    IntArrayRef output_size, IntArrayRef input_size,
                                    int64_t min_spatial, int64_t max_spatial,
                                    std::optional<double> scale) {
  DimVector want = resampled(op, input_size, output_size, min_spatial, max_spatial, scale);
  KILN_CHECK(grad_output.sizes() == IntArrayRef(want), Value, op, ": expected grad_output of shape ",
             want, " (input of shape ", input_size, ", output_size ", output_size, "), got ",
             grad_output.sizes());
  return contiguous_spec(input_size, grad_output.dtype(), grad_output.device());
}

TensorSpec upsample_nearest_backward(const Tensor& grad_output, IntArrayRef output_size,
                                     IntArrayRef input_size, std::optional<double> scale) {
  return resample_backward("upsample_nearest_backward", grad_output, output_size, input_size, 1, 3,
                           scale);
}

TensorSpec upsample_bilinear(const Tensor& self, IntArrayRef output_size, bool,
                             std::optional<double> scale) {
  DimVector sizes = resampled("upsample_bilinear", self.sizes(), output_size, 2, 2, scale);
  return contiguous_spec(sizes, self.dtype(), self.device());
}

TensorSpec upsample_bilinear_backward(const Tensor& grad_output, IntArrayRef output_size,
                                      IntArrayRef input_size, bool, std::optional<double> scale) {
  return resample_backward("upsample_bilinear_backward", grad_output, output_size, input_size, 2, 2,
                           scale);
}

TensorSpec interpolate(const Tensor& self, OptionalIntArrayRef size,
                       std::optional<double> scale_factor, std::string_view mode,
                       bool align_corners) {
  KILN_CHECK(mode == "nearest" || mode == "bilinear", NotImplemented,
             "interpolate: mode '", mode, "' is not supported (use 'nearest' or 'bilinear')");
  KILN_CHECK(size.has_value() != scale_factor.has_value(), Value,
             "interpolate: exactly one of size and scale_factor must be given");
  KILN_CHECK(!align_corners || mode == "bilinear", Value,
             "interpolate: align_corners can only be set with the interpolating mode 'bilinear'");
  KILN_CHECK(self.dim() >= 3, Value, "interpolate: expected an input of 3 to 5 dimensions ",
             "(N, C, spatial...), got shape ", self.sizes());
  DimVector out;
  if (size) {
    out = DimVector(*size);
  } else {
    KILN_CHECK(*scale_factor > 0, Value, "interpolate: scale_factor must be positive, got ",
               *scale_factor);
    for (int64_t k = 2; k < self.dim(); ++k)
      out.push_back(static_cast<int64_t>(std::floor(static_cast<double>(self.size(k)) * *scale_factor)));
  }
  if (mode == "nearest") return upsample_nearest(self, out, scale_factor);
  return upsample_bilinear(self, out, align_corners, scale_factor);
}

}  // namespace kiln::meta
