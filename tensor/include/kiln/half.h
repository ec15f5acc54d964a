// kiln/half.h: 16-bit floating types stored as bits and computed in float.
//
//   kiln::BFloat16 b = 1.5f;      // round-to-nearest-even
//   float f = b;                  // exact
//   kiln::Half h = 65504.0f;      // IEEE binary16
//
// Both are trivially copyable 2-byte structs, usable from CUDA device code.
#pragma once

#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define KILN_HD __host__ __device__
#else
#define KILN_HD
#endif

namespace kiln {

namespace detail {
KILN_HD inline uint32_t f32_bits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
#endif
}
KILN_HD inline float bits_f32(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, 4);
  return f;
#endif
}
}  // namespace detail

struct BFloat16 {
  uint16_t x = 0;
  BFloat16() = default;
  KILN_HD BFloat16(float f) : x(from_float(f)) {}
  KILN_HD operator float() const { return detail::bits_f32(uint32_t(x) << 16); }
  KILN_HD static uint16_t from_float(float f) {
    uint32_t u = detail::f32_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fc0;  // NaN
    u += 0x7fffu + ((u >> 16) & 1u);                      // round to nearest even
    return uint16_t(u >> 16);
  }
};

struct Half {
  uint16_t x = 0;
  Half() = default;
  KILN_HD Half(float f) : x(from_float(f)) {}
  KILN_HD operator float() const { return to_float(x); }
  KILN_HD static float to_float(uint16_t h) {
    uint32_t sign = uint32_t(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1f, man = h & 0x3ffu;
    if (exp == 0x1f) return detail::bits_f32(sign | 0x7f800000u | (man << 13));
    if (exp == 0) {
      if (man == 0) return detail::bits_f32(sign);
      float f = float(man) * (1.0f / 16777216.0f);  // subnormal: man * 2^-24
      return sign ? -f : f;
    }
    return detail::bits_f32(sign | ((exp + 112) << 23) | (man << 13));
  }
  KILN_HD static uint16_t from_float(float f) {
    uint32_t u = detail::f32_bits(f);
    uint32_t sign = (u >> 16) & 0x8000u;
    uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return uint16_t(sign | 0x7e00u);     // NaN
    if (a >= 0x477ff000u) return uint16_t(sign | 0x7c00u);    // overflow -> inf
    if (a < 0x38800000u) {                                    // subnormal or zero
      if (a < 0x33000000u) return uint16_t(sign);             // below half the min subnormal
      uint32_t e = a >> 23, m = (a & 0x7fffffu) | 0x800000u;
      uint32_t shift = 126 - e;                               // 14..24
      uint32_t r = m >> shift, rem = m & ((1u << shift) - 1), half = 1u << (shift - 1);
      if (rem > half || (rem == half && (r & 1u))) ++r;
      return uint16_t(sign | r);
    }
    uint32_t r = a - 0x38000000u;                             // rebias exponent 127 -> 15
    r += 0xfffu + ((r >> 13) & 1u);                           // round to nearest even
    return uint16_t(sign | (r >> 13));
  }
};

}  // namespace kiln
