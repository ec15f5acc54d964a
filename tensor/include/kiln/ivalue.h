// kiln/ivalue.h: boxed values (IValue) and the Stack that boxed kernels take.
//
//   kiln::Stack s{kiln::IValue(a), kiln::IValue(b), kiln::IValue(kiln::Scalar(1))};
//   op.call_boxed(s);                       // s now holds the results
//   kiln::Tensor out = s[0].to_tensor();
//
// Every argument type of the op table's schemas has an IValue form; optionals box to None.
#pragma once

#include <string>
#include <variant>
#include <vector>

#include "kiln/generator.h"
#include "kiln/tensor.h"

namespace kiln {

class IValue {
 public:
  using Variant = std::variant<std::monostate, Tensor, std::vector<Tensor>, Scalar, int64_t, double,
                               bool, std::vector<int64_t>, ScalarType, Device, std::string,
                               Generator>;
  IValue() = default;
  IValue(std::nullopt_t) {}                                // NOLINT
  IValue(Tensor v) : v_(std::move(v)) {}                   // NOLINT
  IValue(std::vector<Tensor> v) : v_(std::move(v)) {}      // NOLINT
  IValue(TensorList v) : v_(v.vec()) {}                    // NOLINT
  IValue(Scalar v) : v_(v) {}                              // NOLINT
  IValue(int64_t v) : v_(v) {}                             // NOLINT
  IValue(int v) : v_(int64_t{v}) {}                        // NOLINT
  IValue(double v) : v_(v) {}                              // NOLINT
  IValue(bool v) : v_(v) {}                                // NOLINT
  IValue(std::vector<int64_t> v) : v_(std::move(v)) {}     // NOLINT
  IValue(IntArrayRef v) : v_(v.vec()) {}                   // NOLINT
  IValue(OptionalIntArrayRef v) {                          // NOLINT
    if (v) v_ = v->vec();
  }
  IValue(ScalarType v) : v_(v) {}                          // NOLINT
  IValue(Device v) : v_(v) {}                              // NOLINT
  IValue(std::string v) : v_(std::move(v)) {}              // NOLINT
  IValue(const char* v) : v_(std::string(v)) {}            // NOLINT
  IValue(std::string_view v) : v_(std::string(v)) {}       // NOLINT (str arguments of ops)
  IValue(Generator v) : v_(std::move(v)) {}                // NOLINT
  template <typename T>
  IValue(const std::optional<T>& o) {  // NOLINT
    if (o) *this = IValue(*o);
  }

  bool is_none() const { return std::holds_alternative<std::monostate>(v_); }
  bool is_tensor() const { return std::holds_alternative<Tensor>(v_); }
  bool is_tensor_list() const { return std::holds_alternative<std::vector<Tensor>>(v_); }
  template <typename T>
  bool is() const { return std::holds_alternative<T>(v_); }
  template <typename T>
  const T& get(const char* what = "value") const {
    const T* p = std::get_if<T>(&v_);
    KILN_CHECK(p != nullptr, Type, "expected ", what, " of another type, got ", type_name());
    return *p;
  }
  const Tensor& to_tensor() const { return get<Tensor>("a Tensor"); }
  const std::vector<Tensor>& to_tensor_list() const { return get<std::vector<Tensor>>("a Tensor[]"); }
  Scalar to_scalar() const;  // accepts Scalar, int, float, bool
  int64_t to_int() const;
  double to_double() const;
  const char* type_name() const;
  const Variant& variant() const { return v_; }
  std::string repr() const;

 private:
  Variant v_;
};

using Stack = std::vector<IValue>;

}  // namespace kiln
