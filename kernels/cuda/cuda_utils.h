// kernels/cuda/cuda_utils.h: allocation and host-side helpers shared by the CUDA kernels.
//
//   Tensor t = empty_cuda({4, 4}, kFloat32, out.device());   // on that device (guarded)
//   Tensor h = host_contiguous(cpu_view);                      // gather without CPU kernels
//   host_strided_copy(cpu_dst_view, cpu_src);                  // same dtype, src broadcasts
//
// The host helpers exist because the GPU machine builds without kernels/cpu (KILN_GPU_ONLY), so
// the CUDA backend cannot rely on CPU kernels to reorder host memory.
#pragma once

#include "kiln/tensor.h"

namespace kiln::cuda {

// A contiguous tensor on CUDA `device`, allocated with that device current. With no CUDA
// device this raises get_allocator's "no allocator for device type 'cuda'" error.
Tensor empty_cuda(IntArrayRef sizes, ScalarType dtype, Device device);
Tensor empty_strided_cuda(IntArrayRef sizes, IntArrayRef strides, ScalarType dtype, Device device);

// dst <- src for CPU tensors of one dtype; src broadcasts to dst; any layouts.
void host_strided_copy(const Tensor& dst, const Tensor& src);
// A contiguous CPU copy of CPU tensor `t` (t itself when already contiguous).
Tensor host_contiguous(const Tensor& t);

}  // namespace kiln::cuda
