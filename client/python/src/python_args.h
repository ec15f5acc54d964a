// python_args.h: what the generated op bindings (gen_bindings.py) and the hand-written module
// share: argument parsing from an op's schema, Tensor <-> Python conversion and the mapping of
// Kiln errors to Python exceptions.
//
//   static const Signature s0("add", {{"self", ArgType::Tensor, nullptr, false, 0}, ...});
//   Value v[3]; std::string why;
//   if (s0.parse(self, args, nargs, kwnames, v, why)) return wrap(ops::add::call(v[0].t, ...));
//
// Note [Python argument parsing]: a Signature is built once per overload from the schema's
// arguments. parse() fills one Value per argument from positional and keyword arguments and the
// schema's defaults, and returns false (with the reason) when they do not fit, so the next
// overload can try. Conversions follow PyTorch: a Python number is accepted for a Tensor argument
// (as a wrapped number, lowest in type promotion), a bare int for an int list (int[N]: N copies),
// a one-element tensor for a number, and a single int[] argument may be given as varargs
// (x.view(2, 3), kiln.zeros(2, 3)).
//
// Note [Scalar and Tensor overloads]: where two overloads of one name take a number (Scalar or
// int) and a Tensor at the same position (scatter(dim, index, Tensor src) and
// scatter.value(dim, index, Scalar value); clamp with Scalar or Tensor bounds; max(dim) and
// max(other)), that argument is `strict`. The generated binding then parses twice: first exactly,
// where a Python number fills only a number and a tensor only a Tensor, so x.scatter(1, i, 2.5)
// takes the value overload as in PyTorch; then, if no overload fit, with the conversions above.
#pragma once

#include <Python.h>
#include <nanobind/nanobind.h>

#include <initializer_list>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "kiln/kiln.h"

namespace kiln::python {
namespace nb = nanobind;

enum class ArgType : uint8_t {
  Tensor,
  OptTensor,
  TensorList,
  Scalar,
  OptScalar,
  Int,
  OptInt,
  IntList,
  OptIntList,
  Float,
  OptFloat,
  Bool,
  Dtype,
  OptDtype,
  OptDevice,
  Str,
  OptStr,
  OptGenerator,
};

struct ParamSpec {
  const char* name;
  ArgType type;
  const char* default_value;  // as written in the schema; nullptr when required
  bool kwarg_only;
  int fixed_size;  // N of int[N], else 0
  bool strict = false;  // Note [Scalar and Tensor overloads]
};

// One parsed argument. Only the member of its ArgType is meaningful; `none` marks None.
struct Value {
  PyObject* obj = nullptr;  // the Python object given (borrowed), nullptr for a default
  bool none = false;
  Tensor t;
  std::vector<Tensor> tl;
  std::vector<int64_t> il;
  Scalar s;
  int64_t i = 0;
  double d = 0;
  bool b = false;
  ScalarType st = kFloat32;
  Device dev;
  std::string str;
  std::optional<Generator> gen;
};

class Signature {
 public:
  Signature(const char* name, std::initializer_list<ParamSpec> params);
  // Note [Python argument parsing]. `self` is the bound Tensor of a method call (else nullptr).
  // `exact`: strict arguments take only their own kind (Note [Scalar and Tensor overloads]).
  bool parse(PyObject* self, PyObject* const* args, Py_ssize_t nargs, PyObject* kwnames, Value* out,
             std::string& why, bool exact = false) const;
  std::string str() const;  // "add(Tensor self, Tensor other, *, Scalar alpha=1)"

 private:
  bool convert(const ParamSpec& p, PyObject* o, Value& v, bool exact, std::string& why) const;
  std::string name_;
  std::vector<ParamSpec> params_;
  std::vector<Value> defaults_;
  int varargs_ = -1;  // the int[] parameter that may be given as varargs
};

inline std::optional<Tensor> opt_tensor(const Value& v) {
  return v.none ? std::nullopt : std::optional<Tensor>(v.t);
}
inline std::optional<Scalar> opt_scalar(const Value& v) {
  return v.none ? std::nullopt : std::optional<Scalar>(v.s);
}
inline std::optional<int64_t> opt_int(const Value& v) {
  return v.none ? std::nullopt : std::optional<int64_t>(v.i);
}
inline OptionalIntArrayRef opt_intlist(const Value& v) {
  return v.none ? OptionalIntArrayRef() : OptionalIntArrayRef(IntArrayRef(v.il));
}
inline std::optional<double> opt_float(const Value& v) {
  return v.none ? std::nullopt : std::optional<double>(v.d);
}
inline std::optional<ScalarType> opt_dtype(const Value& v) {
  return v.none ? std::nullopt : std::optional<ScalarType>(v.st);
}
inline std::optional<Device> opt_device(const Value& v) {
  return v.none ? std::nullopt : std::optional<Device>(v.dev);
}
inline std::optional<std::string_view> opt_str(const Value& v) {
  return v.none ? std::nullopt : std::optional<std::string_view>(v.str);
}

// ---- conversions (python_args.cpp) ----
// The Python type of kiln.Tensor (set once by the module).
extern PyTypeObject* g_tensor_type;
inline bool is_tensor(PyObject* o) { return PyObject_TypeCheck(o, g_tensor_type); }
inline Tensor& unwrap(PyObject* o) { return *nb::inst_ptr<Tensor>(o); }
PyObject* wrap(Tensor t);  // None for an undefined tensor
PyObject* wrap_list(const std::vector<Tensor>& ts);
// A Python object owned by C++ closures and nodes (hooks, custom backward, transforms; copied
// freely, possibly dropped on another thread): released with the GIL held, and leaked rather
// than released once the interpreter is gone.
using PyRef = std::shared_ptr<nb::object>;
PyRef hold(nb::handle o);
// fn(list of `args`) as a list of Tensors (TypeError naming `what` otherwise), for a function
// kiln::compiler captures (kiln.compile, kiln.batch.save_job, kiln.export): while it captures,
// Python's cycle collector runs after the call, so that only what the function really keeps
// counts as held (check_escapes in compiler/src/capture.cpp). Defined in bind_compile.cpp, which
// a client-only build (KILN_CLIENT_ONLY) leaves out with the compiler.
std::vector<Tensor> call_captured(nb::handle fn, const std::vector<Tensor>& args, const char* what);
// The Tensors of a Python sequence; TypeError naming `what` for anything else.
inline std::vector<Tensor> tensors_of(nb::handle seq, const char* what) {
  std::vector<Tensor> out;
  for (nb::handle o : seq) {
    KILN_CHECK(is_tensor(o.ptr()), Type, what, ": expected Tensors, got ",
               Py_TYPE(o.ptr())->tp_name);
    out.push_back(unwrap(o.ptr()));
  }
  return out;
}
// A named tuple `kiln.return_types.<name>` with the space-separated `fields`.
PyObject* wrap_tuple(const char* name, const char* fields, std::initializer_list<Tensor> ts);
inline PyObject* incref(PyObject* o) {
  Py_INCREF(o);
  return o;
}
// dtype and device objects (kiln.float32, kiln.device('cpu')); defined by the module.
PyObject* dtype_object(ScalarType t);
bool dtype_from_object(PyObject* o, ScalarType& out);
bool device_from_object(PyObject* o, Device& out);

// TypeError naming every overload and why each one did not fit.
PyObject* no_match(PyObject* self, const Signature* const* sigs, const std::string* why, int n);

// Runs f, turning C++ exceptions into the Python exception of their kind (Note [Error kinds]).
void set_python_error();
template <class F>
PyObject* guarded(F&& f) {
  try {
    return f();
  } catch (...) {
    set_python_error();
    return nullptr;
  }
}

extern PyMethodDef kOpFunctions[];  // generated: kiln._C.<op>
extern PyMethodDef kOpMethods[];    // generated: kiln.Tensor.<op>

}  // namespace kiln::python
