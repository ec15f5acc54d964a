#include "loops.h"

namespace kiln::kernels {

std::vector<Tensor> cast_inputs(ScalarType dtype, std::initializer_list<Tensor> ins) {
  std::vector<Tensor> out;
  out.reserve(ins.size());
  for (const Tensor& t : ins) out.push_back(t.dtype() == dtype ? t : t.to(dtype));
  return out;
}

}  // namespace kiln::kernels
