// copy_ (CPU <-> CUDA, CUDA <-> CUDA, every dtype pair, broadcasting, any layout) and fill_ on
// CUDA (tensor/ops/copy.toml, creation.toml).
//
// Note [CUDA copies]: a copy is split into steps that each need few kernel instantiations:
//  - same dtype, same device: cudaMemcpyAsync when both sides are contiguous, otherwise a
//    strided kernel keyed only by element size (1, 2, 4, 8 bytes);
//  - a dtype change runs a contiguous conversion kernel (one per dtype pair, contiguous only),
//    after making the source contiguous, then places the result with the strided copy;
//  - host <-> device: the host side is made contiguous on the host (a gather in the source's own
//    shape and dtype, so broadcasting never inflates a transfer), then one cudaMemcpyAsync on the
//    current stream, then any cast/broadcast/scatter happens on the device. D2H synchronizes the
//    stream unless non_blocking and the destination is pinned; H2D synchronizes unless
//    non_blocking. Pinned host blocks used asynchronously are marked with record_host_use.
#include <cstring>

#include "cuda_utils.h"
#include "kiln/cuda/allocator.h"
#include "kiln/cuda/pinned.h"
#include "kiln/dispatcher.h"
#include "kiln/generated/meta/copy.h"
#include "kiln/generated/ops/copy.h"
#include "kiln/generated/ops/creation.h"
#include "loops.cuh"

namespace kiln::cuda {
namespace {

struct Identity {
  template <typename C>
  KILN_HD C operator()(C v) const { return v; }
};

template <typename E>
struct Constant {
  E bits;
  KILN_HD E operator()() const { return bits; }
};

// Calls f.template operator()<E>() with E the unsigned integer type of `size` bytes.
template <typename F>
void dispatch_element_size(size_t size, F&& f) {
  switch (size) {
    case 1: return f.template operator()<uint8_t>();
    case 2: return f.template operator()<uint16_t>();
    case 4: return f.template operator()<uint32_t>();
    case 8: return f.template operator()<uint64_t>();
  }
  KILN_ASSERT(false, "element size ", size);
}

// dst <- src elementwise, both contiguous with n elements on one device, any dtype pair.
void convert_contiguous(const Tensor& dst, const Tensor& src) {
  int device = dst.device().index();
  dispatch<TypeSet::All>(dst.dtype(), "copy_", [&]<typename D>() {
    dispatch<TypeSet::All>(src.dtype(), "copy_", [&]<typename S>() {
      launch_contiguous<D, S, 1>(dst.numel(), device, static_cast<D*>(dst.impl()->raw_data()),
                                 {static_cast<const S*>(src.impl()->raw_data())}, Identity{});
    });
  });
}

// dst <- src on one CUDA device (Note [CUDA copies]); src broadcasts to dst.
void copy_same_device(const Tensor& dst, const Tensor& src) {
  int device = dst.device().index();
  DeviceGuard g(device);
  cudaStream_t stream = getCurrentStream(device).stream();
  bool dense = dst.is_contiguous() && src.is_contiguous() && dst.numel() == src.numel();
  if (dst.dtype() == src.dtype()) {
    if (dense) {
      void* d = dst.impl()->raw_data();
      const void* s = src.impl()->raw_data();
      if (d != s) KILN_CUDA_CHECK(cudaMemcpyAsync(d, s, dst.nbytes(), cudaMemcpyDeviceToDevice, stream));
      return;
    }
    dispatch_element_size(dst.element_size(), [&]<typename E>() {
      launch_elementwise<E, E, 1>(dst, {&src}, Identity{});
    });
    return;
  }
  if (dense) {
    convert_contiguous(dst, src);
    return;
  }
  Tensor s = src;
  if (!s.is_contiguous()) {
    s = empty_cuda(src.sizes(), src.dtype(), dst.device());
    copy_same_device(s, src);
  }
  Tensor converted = empty_cuda(src.sizes(), dst.dtype(), dst.device());
  convert_contiguous(converted, s);
  copy_same_device(dst, converted);
}

// Host -> device.
void copy_h2d(const Tensor& dst, const Tensor& src, bool non_blocking) {
  int device = dst.device().index();
  DeviceGuard g(device);
  Stream stream = getCurrentStream(device);
  bool direct = dst.dtype() == src.dtype() && dst.is_contiguous() && src.is_contiguous() &&
                dst.numel() == src.numel();
  Tensor host = src.is_contiguous() ? src : host_contiguous(src);
  Tensor staged = direct ? dst : empty_cuda(src.sizes(), src.dtype(), dst.device());
  KILN_CUDA_CHECK(cudaMemcpyAsync(staged.impl()->raw_data(), host.impl()->raw_data(), host.nbytes(),
                                  cudaMemcpyHostToDevice, stream));
  if (is_pinned(host)) record_host_use(host.impl()->raw_data(), stream);
  if (!direct) copy_same_device(dst, staged);
  if (!non_blocking) stream.synchronize();
}

// Device -> host.
void copy_d2h(const Tensor& dst, const Tensor& src, bool non_blocking) {
  int device = src.device().index();
  DeviceGuard g(device);
  Stream stream = getCurrentStream(device);
  Tensor dsrc = src;
  if (src.dtype() != dst.dtype() || !src.is_contiguous() || src.numel() != dst.numel()) {
    dsrc = empty_cuda(dst.sizes(), dst.dtype(), src.device());
    copy_same_device(dsrc, src);
  }
  if (!dst.is_contiguous()) {
    Tensor host = empty_on(dst.sizes(), dst.dtype(), kCPU);
    KILN_CUDA_CHECK(cudaMemcpyAsync(host.impl()->raw_data(), dsrc.impl()->raw_data(), dsrc.nbytes(),
                                    cudaMemcpyDeviceToHost, stream));
    stream.synchronize();
    host_strided_copy(dst, host);
    return;
  }
  KILN_CUDA_CHECK(cudaMemcpyAsync(dst.impl()->raw_data(), dsrc.impl()->raw_data(), dsrc.nbytes(),
                                  cudaMemcpyDeviceToHost, stream));
  if (non_blocking && is_pinned(dst)) {
    record_host_use(dst.impl()->raw_data(), stream);
    return;
  }
  stream.synchronize();
}

// Device i -> device j: the source is prepared (cast, broadcast, contiguous) on its device,
// then copied peer-to-peer; both streams are synchronized so temporaries die safely.
void copy_peer(const Tensor& dst, const Tensor& src) {
  int si = src.device().index(), di = dst.device().index();
  Tensor s = src;
  {
    DeviceGuard g(si);
    if (src.dtype() != dst.dtype() || !src.is_contiguous() || src.numel() != dst.numel()) {
      s = empty_cuda(dst.sizes(), dst.dtype(), src.device());
      copy_same_device(s, src);
    }
    getCurrentStream(si).synchronize();
  }
  DeviceGuard g(di);
  Stream stream = getCurrentStream(di);
  Tensor d = dst.is_contiguous() ? dst : empty_cuda(dst.sizes(), dst.dtype(), dst.device());
  KILN_CUDA_CHECK(cudaMemcpyPeerAsync(d.impl()->raw_data(), di, s.impl()->raw_data(), si, s.nbytes(),
                                      stream));
  if (!d.is_same(dst)) copy_same_device(dst, d);
  stream.synchronize();
}

Tensor copy_cuda(const Tensor& self, const Tensor& src, bool non_blocking) {
  meta::copy_(self, src, non_blocking);
  if (self.numel() == 0 || self.is_same(src)) return self;
  Device dd = self.device(), sd = src.device();
  if (dd.is_cuda() && sd.is_cuda()) {
    if (dd == sd) {
      copy_same_device(self, src);
    } else {
      copy_peer(self, src);
    }
  } else if (dd.is_cuda() && sd.is_cpu()) {
    copy_h2d(self, src, non_blocking);
  } else if (dd.is_cpu() && sd.is_cuda()) {
    copy_d2h(self, src, non_blocking);
  } else {
    KILN_FAIL(NotImplemented, "copy_: the CUDA kernel cannot copy from ", sd, " to ", dd);
  }
  return self;
}

// self: any layout -> every element = value (converted to self's dtype, then stored as bits).
Tensor fill_cuda(const Tensor& self, const Scalar& value) {
  if (self.numel() == 0) return self;
  uint64_t bits = 0;
  KILN_DISPATCH_ALL_TYPES(self.dtype(), "fill_", [&] {
    scalar_t v = value.to<scalar_t>();
    if constexpr (std::is_same_v<scalar_t, bool>) v = value.to_bool();
    std::memcpy(&bits, &v, sizeof v);
  });
  int device = self.device().index();
  DeviceGuard g(device);
  if (bits == 0 && self.is_contiguous()) {
    KILN_CUDA_CHECK(cudaMemsetAsync(self.impl()->raw_data(), 0, self.nbytes(),
                                    getCurrentStream(device).stream()));
    return self;
  }
  dispatch_element_size(self.element_size(), [&]<typename E>() {
    launch_elementwise<E, E, 0>(self, {}, Constant<E>{static_cast<E>(bits)});
  });
  return self;
}

KILN_LIBRARY(CUDA, m) {
  m.impl<ops::copy_>(copy_cuda);
  m.impl<ops::fill_>(fill_cuda);
}

}  // namespace
}  // namespace kiln::cuda
