// kernels/cpu/random_dist.h: the device-agnostic transforms from Philox blocks to random values
// (uniform, normal, bounded integers). KILN_HD, so kernels/cuda can include this header and
// produce the same values per (seed, offset, i) as the CPU (Note [Counter-based RNG]).
//
//   using Tr = kiln::kernels::RandomTraits<float>;         // width k32: 4 elements per block
//   auto r = kiln::philox4x32(seed, offset + i / Tr::kPer);
//   float v[Tr::kPer];
//   kiln::kernels::uniform_block<float>(r, 0.f, 1.f, v);   // v[i % 4] is element i
//
// Note [Random transforms]: a block is the 4 x 32-bit output of one counter.
//  - uniform [0, 1): k32 keeps the top `kDigits` bits of a word (24 for float32, 11 for
//    float16, 8 for bfloat16), so u * 2^digits is an integer and u is exact in T and < 1;
//    k64 (float64) keeps the top 53 bits of the 64-bit word. uniform_(from, to) computes
//    from + u * (to - from) in the accumulation type; a result that rounds up to `to` in T is
//    replaced by `from`, so the range stays [from, to).
//  - normal: Box-Muller on the uniforms of elements (2m, 2m + 1) of a block:
//    r = sqrt(-2 log(1 - u0)), t = 2 pi u1; element 2m gets r cos t, element 2m + 1 r sin t.
//    float16/bfloat16/float32 compute in float with 24-bit uniforms, float64 in double.
//    Transcendentals may differ in the last ulp between CPU libm and CUDA, so normal values
//    are reproducible bit for bit on one backend and to ~1 ulp across backends.
//  - integers: randint maps a 64-bit word w to [0, range) as floor(w * range / 2^64)
//    (Lemire's multiply-shift; bias below range / 2^64); randperm is a Fisher-Yates shuffle
//    that swaps position i (n - 1 down to 1) with bounded(word of element i, i + 1).
#pragma once

#include <array>
#include <cmath>
#include <cstdint>

#include "kiln/generator.h"
#include "kiln/scalar_type.h"

namespace kiln::kernels {

using PhiloxBlock = std::array<uint32_t, 4>;

template <typename T>
struct RandomTraits {
  using acc = float;
  static constexpr RandomWidth kWidth = RandomWidth::k32;
  static constexpr int kPer = 4;  // elements per block
  static constexpr int kDigits = 24;
};
template <>
struct RandomTraits<Half> : RandomTraits<float> {
  static constexpr int kDigits = 11;
};
template <>
struct RandomTraits<BFloat16> : RandomTraits<float> {
  static constexpr int kDigits = 8;
};
template <>
struct RandomTraits<double> {
  using acc = double;
  static constexpr RandomWidth kWidth = RandomWidth::k64;
  static constexpr int kPer = 2;
  static constexpr int kDigits = 53;
};

// The 64-bit word of element j (0 or 1) of a k64 block.
KILN_HD inline uint64_t block_word64(const PhiloxBlock& r, int j) {
  return (uint64_t(r[2 * j]) << 32) | r[2 * j + 1];
}

// floor(w * range / 2^64): a value in [0, range).
KILN_HD inline uint64_t bounded64(uint64_t w, uint64_t range) {
#if defined(__CUDA_ARCH__)
  return __umul64hi(w, range);
#else
  return static_cast<uint64_t>((static_cast<unsigned __int128>(w) * range) >> 64);
#endif
}

// The block's uniforms in [0, 1) with `digits` bits (k32: 4 floats).
KILN_HD inline void unit_block32(const PhiloxBlock& r, int digits, float u[4]) {
  const float scale = 1.0f / float(1u << digits);
  for (int j = 0; j < 4; ++j) u[j] = float(r[j] >> (32 - digits)) * scale;
}
// k64: 2 doubles with 53 bits.
KILN_HD inline void unit_block64(const PhiloxBlock& r, double u[2]) {
  for (int j = 0; j < 2; ++j) u[j] = double(block_word64(r, j) >> 11) * (1.0 / 9007199254740992.0);
}

// The uniforms of a block for T, in T's accumulation type.
template <typename T>
KILN_HD inline void unit_block(const PhiloxBlock& r, typename RandomTraits<T>::acc* u) {
  if constexpr (RandomTraits<T>::kWidth == RandomWidth::k64) {
    unit_block64(r, u);
  } else {
    unit_block32(r, RandomTraits<T>::kDigits, u);
  }
}

// As unit_block, but always at the accumulation type's resolution (24 bits for the k32
// types): normal and bernoulli compute in float whatever T's precision.
template <typename T>
KILN_HD inline void fine_unit_block(const PhiloxBlock& r, typename RandomTraits<T>::acc* u) {
  if constexpr (RandomTraits<T>::kWidth == RandomWidth::k64) {
    unit_block64(r, u);
  } else {
    unit_block32(r, 24, u);
  }
}

// uniform_(from, to): v[j] in [from, to).
template <typename T, typename A = typename RandomTraits<T>::acc>
KILN_HD inline void uniform_block(const PhiloxBlock& r, A from, A to, T* v) {
  A u[RandomTraits<T>::kPer];
  unit_block<T>(r, u);
  for (int j = 0; j < RandomTraits<T>::kPer; ++j) {
    T x = static_cast<T>(from + u[j] * (to - from));
    v[j] = static_cast<A>(x) < to ? x : static_cast<T>(from);
  }
}

// (z0, z1) = Box-Muller of (u0, u1), u0, u1 in [0, 1).
template <typename A>
KILN_HD inline void box_muller(A u0, A u1, A& z0, A& z1) {
  const A two_pi = A(6.283185307179586476925286766559);
  A radius = std::sqrt(A(-2) * std::log(A(1) - u0));
  A theta = two_pi * u1;
  z0 = radius * std::cos(theta);
  z1 = radius * std::sin(theta);
}

// normal_(mean, std): v[j] ~ N(mean, std^2), elements paired as (0, 1), (2, 3).
template <typename T, typename A = typename RandomTraits<T>::acc>
KILN_HD inline void normal_block(const PhiloxBlock& r, A mean, A stddev, T* v) {
  A u[RandomTraits<T>::kPer];
  fine_unit_block<T>(r, u);
  for (int j = 0; j < RandomTraits<T>::kPer; j += 2) {
    A z0, z1;
    box_muller(u[j], u[j + 1], z0, z1);
    v[j] = static_cast<T>(mean + stddev * z0);
    v[j + 1] = static_cast<T>(mean + stddev * z1);
  }
}

}  // namespace kiln::kernels
