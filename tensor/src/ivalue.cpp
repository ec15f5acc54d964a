#include "kiln/ivalue.h"

#include <sstream>

namespace kiln {

Scalar IValue::to_scalar() const {
  if (auto* s = std::get_if<Scalar>(&v_)) return *s;
  if (auto* i = std::get_if<int64_t>(&v_)) return Scalar(*i);
  if (auto* d = std::get_if<double>(&v_)) return Scalar(*d);
  if (auto* b = std::get_if<bool>(&v_)) return Scalar(*b);
  KILN_FAIL(Type, "expected a number, got ", type_name());
}

int64_t IValue::to_int() const {
  if (auto* i = std::get_if<int64_t>(&v_)) return *i;
  if (auto* s = std::get_if<Scalar>(&v_); s && s->is_integral()) return s->to_int();
  if (auto* b = std::get_if<bool>(&v_)) return *b;
  KILN_FAIL(Type, "expected an int, got ", type_name());
}

double IValue::to_double() const {
  if (auto* d = std::get_if<double>(&v_)) return *d;
  if (auto* i = std::get_if<int64_t>(&v_)) return static_cast<double>(*i);
  if (auto* s = std::get_if<Scalar>(&v_)) return s->to_double();
  KILN_FAIL(Type, "expected a float, got ", type_name());
}

const char* IValue::type_name() const {
  static const char* const names[] = {"None", "Tensor", "Tensor[]", "Scalar", "int", "float",
                                      "bool", "int[]",  "dtype",    "Device", "str", "Generator"};
  return names[v_.index()];
}

std::string IValue::repr() const {
  std::ostringstream os;
  std::visit(
      [&](const auto& x) {
        using T = std::decay_t<decltype(x)>;
        if constexpr (std::is_same_v<T, std::monostate>) os << "None";
        else if constexpr (std::is_same_v<T, Tensor>)
          os << "Tensor(" << x.dtype() << x.sizes() << ")";
        else if constexpr (std::is_same_v<T, std::vector<Tensor>>)
          os << "Tensor[" << x.size() << "]";
        else if constexpr (std::is_same_v<T, std::vector<int64_t>>) os << IntArrayRef(x);
        else if constexpr (std::is_same_v<T, bool>) os << (x ? "True" : "False");
        else if constexpr (std::is_same_v<T, std::string>) os << "'" << x << "'";
        else if constexpr (std::is_same_v<T, Generator>) os << "Generator";
        else os << x;
      },
      v_);
  return os.str();
}

std::ostream& operator<<(std::ostream& os, const Scalar& s) {
  if (s.is_floating()) return os << s.to_double();
  if (s.is_bool()) return os << (s.to_bool() ? "True" : "False");
  return os << s.to_int();
}

void Scalar::fail_overflow(ScalarType t) const {
  KILN_FAIL(Runtime, "value cannot be converted to type ", t, " without overflow: ", *this);
}

}  // namespace kiln
