// Allocation and host-side copy helpers (cuda_utils.h).
#include <cstring>

#include "cuda_utils.h"
#include "kiln/cuda/device.h"
#include "loops.cuh"

namespace kiln::cuda {
namespace {

void check_device(Device device) {
  KILN_CHECK(device.is_cuda(), Value, "expected a CUDA device, got ", device);
  KILN_CHECK(device_count() == 0 || device.index() < device_count(), Value, "cuda: device index ",
             device.index(), " out of range (", device_count(), " devices)");
}

template <size_t E>
void copy_elems(char* d, const char* s, int64_t n, int64_t ds, int64_t ss) {
  for (int64_t i = 0; i < n; ++i) std::memcpy(d + i * ds, s + i * ss, E);
}

}  // namespace

Tensor empty_cuda(IntArrayRef sizes, ScalarType dtype, Device device) {
  check_device(device);
  if (device_count() == 0) return empty_on(sizes, dtype, device);  // raises "no allocator"
  DeviceGuard g(device.index());
  return empty_on(sizes, dtype, device);
}

Tensor empty_strided_cuda(IntArrayRef sizes, IntArrayRef strides, ScalarType dtype, Device device) {
  check_device(device);
  if (device_count() == 0) return empty_strided_on(sizes, strides, dtype, device);
  DeviceGuard g(device.index());
  return empty_strided_on(sizes, strides, dtype, device);
}

// dst: (...) <- src: broadcastable to dst; walks the coalesced geometry one inner run at a time.
void host_strided_copy(const Tensor& dst, const Tensor& src) {
  KILN_ASSERT(dst.device().is_cpu() && src.device().is_cpu() && dst.dtype() == src.dtype());
  int64_t n = dst.numel();
  if (n == 0) return;
  OffsetCalc<2> calc = make_offset_calc<2>({&dst, &src});
  char* d = static_cast<char*>(dst.impl()->raw_data());
  const char* s = static_cast<const char*>(src.impl()->raw_data());
  int64_t inner = calc.ndim > 0 ? calc.sizes[0] : 1;
  int64_t ds = calc.ndim > 0 ? calc.strides[0][0] : 0, ss = calc.ndim > 0 ? calc.strides[0][1] : 0;
  size_t esize = dst.element_size();
  for (int64_t start = 0; start < n; start += inner) {
    Array<int64_t, 2> off = calc.get(start);
    char* dp = d + off[0];
    const char* sp = s + off[1];
    switch (esize) {
      case 1: copy_elems<1>(dp, sp, inner, ds, ss); break;
      case 2: copy_elems<2>(dp, sp, inner, ds, ss); break;
      case 4: copy_elems<4>(dp, sp, inner, ds, ss); break;
      default: copy_elems<8>(dp, sp, inner, ds, ss); break;
    }
  }
}

Tensor host_contiguous(const Tensor& t) {
  if (t.is_contiguous()) return t;
  Tensor out = empty_on(t.sizes(), t.dtype(), kCPU);
  host_strided_copy(out, t);
  return out;
}

}  // namespace kiln::cuda
