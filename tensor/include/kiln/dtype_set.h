// kiln/dtype_set.h: a set of ScalarTypes as a bitset, the type of the op table's dtype claims.
//
//   kiln::DTypeSet s{kiln::kFloat32, kiln::kFloat64};
//   s.has(kiln::kFloat32);                      // true
//   for (kiln::ScalarType t : s.to_vector()) ...
//
// The named sets of tensor/ops/rules.toml are generated as constants in kiln::dtype_sets
// (kiln/generated/dtype_sets.h); OpInfo::dtypes holds a row's set per backend. DTypeSet is a
// structural type, so it can be a template argument (the CUDA loops' dtype dispatch).
#pragma once

#include <cstdint>
#include <initializer_list>
#include <vector>

#include "kiln/scalar_type.h"

namespace kiln {

struct DTypeSet {
  uint32_t bits = 0;  // bit i: ScalarType i (public: a structural type)

  constexpr DTypeSet() = default;
  constexpr DTypeSet(std::initializer_list<ScalarType> types) {
    for (ScalarType t : types) bits |= bit(t);
  }
  constexpr bool has(ScalarType t) const { return (bits & bit(t)) != 0; }
  constexpr bool empty() const { return bits == 0; }
  constexpr DTypeSet operator|(DTypeSet o) const { return from_bits(bits | o.bits); }
  constexpr DTypeSet operator&(DTypeSet o) const { return from_bits(bits & o.bits); }
  bool operator==(const DTypeSet&) const = default;
  // The members in ScalarType order.
  std::vector<ScalarType> to_vector() const {
    std::vector<ScalarType> out;
    for (int i = 0; i < kNumScalarTypes; ++i)
      if (has(static_cast<ScalarType>(i))) out.push_back(static_cast<ScalarType>(i));
    return out;
  }

 private:
  static constexpr uint32_t bit(ScalarType t) { return 1u << static_cast<int>(t); }
  static constexpr DTypeSet from_bits(uint32_t b) {
    DTypeSet s;
    s.bits = b;
    return s;
  }
};

}  // namespace kiln
