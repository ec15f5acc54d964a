#include "kiln/scalar_type.h"

#include <string>

#include "kiln/error.h"

namespace kiln {

const char* scalar_type_name(ScalarType t) {
  static const char* const names[] = {"bool",    "uint8",   "int8",     "int16",   "int32",
                                      "int64",   "float16", "bfloat16", "float32", "float64"};
  return names[static_cast<int>(t)];
}

ScalarType scalar_type_from_name(const char* name) {
  std::string n(name);
  if (n.rfind("kiln.", 0) == 0 || n.rfind("torch.", 0) == 0) n = n.substr(n.find('.') + 1);
  for (int i = 0; i < kNumScalarTypes; ++i)
    if (n == scalar_type_name(static_cast<ScalarType>(i))) return static_cast<ScalarType>(i);
  if (n == "float") return kFloat32;
  if (n == "double") return kFloat64;
  if (n == "half") return kFloat16;
  if (n == "long") return kInt64;
  if (n == "int") return kInt32;
  if (n == "short") return kInt16;
  KILN_FAIL(Value, "unknown dtype name '", name, "'");
}

std::ostream& operator<<(std::ostream& os, ScalarType t) { return os << scalar_type_name(t); }

ScalarType promote_types(ScalarType a, ScalarType b) {
  if (a == b) return a;
  if (a == kBool) return b;
  if (b == kBool) return a;
  bool fa = is_floating(a), fb = is_floating(b);
  if (fa != fb) return fa ? a : b;
  if (fa) {  // both floating; float16 with bfloat16 meets at float32
    if ((a == kFloat16 && b == kBFloat16) || (a == kBFloat16 && b == kFloat16)) return kFloat32;
    return a > b ? a : b;
  }
  // Both integers. uint8 with a signed type needs a signed type that holds 0..255.
  if (a == kUInt8 || b == kUInt8) {
    ScalarType other = a == kUInt8 ? b : a;
    return other == kInt8 ? kInt16 : other;
  }
  return a > b ? a : b;
}

void unsupported_dtype(const char* op, ScalarType t) {
  KILN_FAIL(Type, op, ": dtype ", scalar_type_name(t), " is not supported");
}

}  // namespace kiln
