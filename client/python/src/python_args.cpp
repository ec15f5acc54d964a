// Argument parsing for the generated op bindings (Note [Python argument parsing]) and the
// conversions every binding shares.
#include "python_args.h"

#include <cstdlib>
#include <unordered_map>

namespace kiln::python {

PyTypeObject* g_tensor_type = nullptr;

namespace {

const char* type_label(ArgType t) {
  static const char* const kLabels[] = {"Tensor", "Tensor?", "Tensor[]",   "Scalar",      "Scalar?",
                                        "int",    "int?",    "int[]",      "int[]?",      "float",
                                        "float?", "bool",    "ScalarType", "ScalarType?", "Device?",
                                        "str",    "str?",    "Generator?"};
  return kLabels[static_cast<int>(t)];
}

bool is_optional(ArgType t) {
  switch (t) {
    case ArgType::OptTensor:
    case ArgType::OptScalar:
    case ArgType::OptInt:
    case ArgType::OptIntList:
    case ArgType::OptFloat:
    case ArgType::OptDtype:
    case ArgType::OptDevice:
    case ArgType::OptStr:
    case ArgType::OptGenerator:
      return true;
    default:
      return false;
  }
}

// A Python int (not a bool) or an object with __index__ (numpy integers), not a tensor.
bool as_int(PyObject* o, int64_t& out) {
  if (PyBool_Check(o)) return false;
  if (is_tensor(o)) {
    const Tensor& t = unwrap(o);
    if (t.numel() != 1 || !is_integral(t.dtype())) return false;
    out = t.item().to_int();
    return true;
  }
  if (!PyLong_Check(o) && !PyIndex_Check(o)) return false;
  int overflow = 0;
  PyObject* idx = PyNumber_Index(o);
  if (!idx) {
    PyErr_Clear();
    return false;
  }
  out = PyLong_AsLongLongAndOverflow(idx, &overflow);
  Py_DECREF(idx);
  return overflow == 0;
}

// A number that is not a sequence (Python and numpy scalars, not numpy arrays).
bool is_number_like(PyObject* o) {
  if (PyBool_Check(o) || PyLong_Check(o) || PyFloat_Check(o)) return true;
  PyNumberMethods* nm = Py_TYPE(o)->tp_as_number;
  return nm && (nm->nb_float || nm->nb_index) && !PySequence_Check(o) && !is_tensor(o);
}

bool as_scalar(PyObject* o, Scalar& out) {
  if (PyBool_Check(o)) {
    out = Scalar(o == Py_True);
    return true;
  }
  if (is_tensor(o)) {
    const Tensor& t = unwrap(o);
    if (t.numel() != 1) return false;
    out = t.item();
    return true;
  }
  int64_t i;
  if (as_int(o, i)) {
    out = Scalar(i);
    return true;
  }
  if (!is_number_like(o)) return false;
  double d = PyFloat_AsDouble(o);
  if (d == -1.0 && PyErr_Occurred()) {
    PyErr_Clear();
    return false;
  }
  out = Scalar(d);
  return true;
}

bool as_double(PyObject* o, double& out) {
  Scalar s;
  if (!as_scalar(o, s)) return false;
  out = s.to_double();
  return true;
}

bool as_int_list(PyObject* o, int fixed, std::vector<int64_t>& out) {
  out.clear();
  int64_t v;
  if (as_int(o, v) && !is_tensor(o)) {
    out.assign(fixed > 0 ? fixed : 1, v);
    return true;
  }
  if (!PyList_Check(o) && !PyTuple_Check(o)) return false;
  Py_ssize_t n = PySequence_Fast_GET_SIZE(o);
  PyObject** items = PySequence_Fast_ITEMS(o);
  out.reserve(n);
  for (Py_ssize_t k = 0; k < n; ++k) {
    if (!as_int(items[k], v)) return false;
    out.push_back(v);
  }
  return true;
}

std::string default_text(const ParamSpec& p) {
  return p.default_value ? std::string("=") + p.default_value : std::string();
}

// A Value holding the schema's default `text` for a parameter of type `t`.
Value parse_default(const ParamSpec& p) {
  Value v;
  std::string text = p.default_value;
  if (text == "None") {
    v.none = true;
    return v;
  }
  switch (p.type) {
    case ArgType::Scalar:
    case ArgType::OptScalar:
      if (text.find_first_of(".eE") != std::string::npos)
        v.s = Scalar(std::strtod(text.c_str(), nullptr));
      else if (text == "True" || text == "False")
        v.s = Scalar(text == "True");
      else
        v.s = Scalar(static_cast<int64_t>(std::strtoll(text.c_str(), nullptr, 10)));
      break;
    case ArgType::Int:
    case ArgType::OptInt:
      v.i = std::strtoll(text.c_str(), nullptr, 10);
      break;
    case ArgType::Float:
    case ArgType::OptFloat:
      v.d = std::strtod(text.c_str(), nullptr);
      break;
    case ArgType::Bool:
      v.b = text == "True";
      break;
    case ArgType::IntList:
    case ArgType::OptIntList: {
      const char* c = text.c_str() + 1;  // "[1, 1]"
      while (*c && *c != ']') {
        char* end;
        long long x = std::strtoll(c, &end, 10);
        if (end == c) break;
        v.il.push_back(x);
        c = end;
        while (*c == ',' || *c == ' ') ++c;
      }
      break;
    }
    case ArgType::Str:
    case ArgType::OptStr:
      v.str = text.substr(1, text.size() - 2);  // 'mean'
      break;
    case ArgType::Dtype:
    case ArgType::OptDtype:
      v.st = scalar_type_from_name(text.c_str());
      break;
    default:
      KILN_ASSERT(false, "no default of type ", type_label(p.type), " for ", p.name);
  }
  return v;
}

}  // namespace

Signature::Signature(const char* name, std::initializer_list<ParamSpec> params)
    : name_(name), params_(params) {
  defaults_.resize(params_.size());
  std::vector<int> positional;
  for (size_t k = 0; k < params_.size(); ++k) {
    const ParamSpec& p = params_[k];
    if (p.default_value) defaults_[k] = parse_default(p);
    bool leading_tensor = k == 0 && p.type == ArgType::Tensor;
    if (!p.kwarg_only && !leading_tensor) positional.push_back(static_cast<int>(k));
  }
  if (positional.size() == 1 && (params_[positional[0]].type == ArgType::IntList ||
                                 params_[positional[0]].type == ArgType::OptIntList))
    varargs_ = positional[0];
}

std::string Signature::str() const {
  std::string s = name_ + "(";
  bool kw = false;
  for (size_t k = 0; k < params_.size(); ++k) {
    const ParamSpec& p = params_[k];
    if (k) s += ", ";
    if (p.kwarg_only && !kw) {
      s += "*, ";
      kw = true;
    }
    s += std::string(type_label(p.type)) + " " + p.name + default_text(p);
  }
  return s + ")";
}

bool Signature::convert(const ParamSpec& p, PyObject* o, Value& v, bool exact,
                        std::string& why) const {
  v.obj = o;
  v.none = false;
  if (o == Py_None) {
    if (is_optional(p.type)) {
      v.none = true;
      return true;
    }
  } else if (exact && p.strict &&
             is_tensor(o) != (p.type == ArgType::Tensor || p.type == ArgType::OptTensor)) {
    // The other overload takes this kind of argument
    // (See Note [Scalar and Tensor overloads] in python_args.h).
  } else {
    switch (p.type) {
      case ArgType::Tensor:
      case ArgType::OptTensor:
        if (is_tensor(o)) {
          v.t = unwrap(o);
          return true;
        }
        if (is_number_like(o) && as_scalar(o, v.s)) {
          v.t = scalar_to_tensor(v.s);  // a wrapped number (Note [Type promotion])
          return true;
        }
        break;
      case ArgType::TensorList: {
        if (!PyList_Check(o) && !PyTuple_Check(o)) break;
        Py_ssize_t n = PySequence_Fast_GET_SIZE(o);
        PyObject** items = PySequence_Fast_ITEMS(o);
        v.tl.clear();
        v.tl.reserve(n);
        for (Py_ssize_t k = 0; k < n; ++k) {
          if (!is_tensor(items[k])) {
            why = "argument '" + std::string(p.name) +
                  "' must be a list of Tensors, got an element of type " +
                  Py_TYPE(items[k])->tp_name;
            return false;
          }
          v.tl.push_back(unwrap(items[k]));
        }
        return true;
      }
      case ArgType::Scalar:
      case ArgType::OptScalar:
        if (as_scalar(o, v.s)) return true;
        break;
      case ArgType::Int:
      case ArgType::OptInt:
        if (as_int(o, v.i)) return true;
        break;
      case ArgType::IntList:
      case ArgType::OptIntList:
        if (as_int_list(o, p.fixed_size, v.il)) return true;
        break;
      case ArgType::Float:
      case ArgType::OptFloat:
        if (as_double(o, v.d)) return true;
        break;
      case ArgType::Bool:
        if (PyBool_Check(o)) {
          v.b = o == Py_True;
          return true;
        }
        break;
      case ArgType::Dtype:
      case ArgType::OptDtype:
        if (dtype_from_object(o, v.st)) return true;
        break;
      case ArgType::OptDevice:
        if (device_from_object(o, v.dev)) return true;
        break;
      case ArgType::Str:
      case ArgType::OptStr:
        if (PyUnicode_Check(o)) {
          Py_ssize_t n;
          const char* c = PyUnicode_AsUTF8AndSize(o, &n);
          if (!c) {
            PyErr_Clear();
            break;
          }
          v.str.assign(c, n);
          return true;
        }
        break;
      case ArgType::OptGenerator:
        if (nb::isinstance<Generator>(nb::handle(o))) {
          v.gen = *nb::inst_ptr<Generator>(o);
          return true;
        }
        break;
    }
  }
  why = "argument '" + std::string(p.name) + "' must be " + type_label(p.type) + ", not " +
        Py_TYPE(o)->tp_name;
  return false;
}

bool Signature::parse(PyObject* self, PyObject* const* args, Py_ssize_t nargs, PyObject* kwnames,
                      Value* out, std::string& why, bool exact) const {
  const size_t n = params_.size();
  bool filled[64] = {};
  KILN_ASSERT(n <= 64);
  size_t pos = 0;
  if (self) {
    out[0].obj = self;
    out[0].none = false;
    out[0].t = unwrap(self);
    filled[0] = true;
    pos = 1;
  }
  for (Py_ssize_t k = 0; k < nargs; ++k, ++pos) {
    if (pos >= n || params_[pos].kwarg_only) {
      size_t max_pos = 0;
      for (const ParamSpec& p : params_) max_pos += !p.kwarg_only;
      why = "takes " + std::to_string(max_pos - (self ? 1 : 0)) + " positional arguments but " +
            std::to_string(nargs) + " were given";
      return false;
    }
    int64_t first;
    if (static_cast<int>(pos) == varargs_ && nargs - k > 1 && as_int(args[k], first)) {
      Value& v = out[pos];  // x.view(2, 3): the rest of the positional arguments are the list
      v.obj = args[k];
      v.none = false;
      v.il.clear();
      for (; k < nargs; ++k) {
        int64_t x;
        if (!as_int(args[k], x)) {
          why = std::string("argument '") + params_[pos].name + "' must be a sequence of ints";
          return false;
        }
        v.il.push_back(x);
      }
      filled[pos] = true;
      break;
    }
    if (!convert(params_[pos], args[k], out[pos], exact, why)) return false;
    filled[pos] = true;
  }
  Py_ssize_t nkw = kwnames ? PyTuple_GET_SIZE(kwnames) : 0;
  for (Py_ssize_t j = 0; j < nkw; ++j) {
    PyObject* key = PyTuple_GET_ITEM(kwnames, j);
    size_t idx = 0;
    while (idx < n && PyUnicode_CompareWithASCIIString(key, params_[idx].name) != 0) ++idx;
    if (idx == n) {
      why = "got an unexpected keyword argument '" + std::string(PyUnicode_AsUTF8(key)) + "'";
      return false;
    }
    if (filled[idx]) {
      why = std::string("got multiple values for argument '") + params_[idx].name + "'";
      return false;
    }
    if (!convert(params_[idx], args[nargs + j], out[idx], exact, why)) return false;
    filled[idx] = true;
  }
  for (size_t k = 0; k < n; ++k) {
    if (filled[k]) continue;
    if (!params_[k].default_value) {
      why = std::string("missing required argument '") + params_[k].name + "'";
      return false;
    }
    out[k] = defaults_[k];
  }
  return true;
}

PyObject* no_match(PyObject* self, const Signature* const* sigs, const std::string* why, int n) {
  std::string msg;
  int tried = 0;
  for (int k = 0; k < n; ++k) tried += !why[k].empty();
  for (int k = 0; k < n; ++k) {
    if (why[k].empty()) continue;  // an overload a method call does not try
    std::string sig = sigs[k]->str();
    if (tried == 1) {
      msg = sig.substr(0, sig.find('(')) + "(): " + why[k] + " (expected " + sig + ")";
      break;
    }
    msg += (msg.empty() ? sig.substr(0, sig.find('(')) + "(): no overload matches the arguments:"
                        : "");
    msg += "\n  " + sig + ": " + why[k];
  }
  (void)self;
  PyErr_SetString(PyExc_TypeError, msg.c_str());
  return nullptr;
}

// Allocates the instance directly (nanobind's pooled instances, Note [Python dispatch speed]):
// no type lookup, no check for an existing Python object of the temporary's address.
PyObject* wrap(Tensor t) {
  if (!t.defined()) Py_RETURN_NONE;
  try {
    nb::object o = nb::inst_alloc(nb::handle(reinterpret_cast<PyObject*>(g_tensor_type)));
    new (nb::inst_ptr<Tensor>(o)) Tensor(std::move(t));
    nb::inst_mark_ready(o);
    return o.release().ptr();
  } catch (nb::python_error& e) {
    e.restore();
    return nullptr;
  }
}

PyObject* wrap_list(const std::vector<Tensor>& ts) {
  PyObject* list = PyList_New(static_cast<Py_ssize_t>(ts.size()));
  if (!list) return nullptr;
  for (size_t k = 0; k < ts.size(); ++k) PyList_SET_ITEM(list, k, wrap(ts[k]));
  return list;
}

PyObject* wrap_tuple(const char* name, const char* fields, std::initializer_list<Tensor> ts) {
  // Leaked on purpose: the types live as long as the interpreter.
  static auto* types = new std::unordered_map<std::string, nb::object>();
  auto it = types->find(name);
  if (it == types->end()) {
    nb::object nt = nb::module_::import_("collections").attr("namedtuple");
    nb::object type = nt(name, fields, nb::arg("module") = "kiln.return_types");
    it = types->emplace(name, type).first;
  }
  nb::list items;
  for (const Tensor& t : ts) items.append(nb::steal(wrap(t)));
  return it->second(*items).release().ptr();
}

void set_python_error() {
  try {
    throw;
  } catch (const Error& e) {
    PyObject* type = PyExc_RuntimeError;
    switch (e.kind()) {
      case ErrorKind::Value:
        type = PyExc_ValueError;
        break;
      case ErrorKind::Type:
        type = PyExc_TypeError;
        break;
      case ErrorKind::Index:
        type = PyExc_IndexError;
        break;
      case ErrorKind::NotImplemented:
        type = PyExc_NotImplementedError;
        break;
      case ErrorKind::Runtime:
        type = PyExc_RuntimeError;
        break;
    }
    // The message may quote bytes of user data that are not UTF-8 (a safetensors header, a
    // name): PyErr_SetString would raise UnicodeDecodeError instead. Escape them.
    const std::string_view msg = e.what();
    PyObject* text = PyUnicode_DecodeUTF8(msg.data(), static_cast<Py_ssize_t>(msg.size()),
                                          "backslashreplace");
    if (!text) return;  // MemoryError is set
    PyErr_SetObject(type, text);
    Py_DECREF(text);
  } catch (nb::python_error& e) {
    e.restore();
  } catch (const nb::cast_error& e) {
    PyErr_SetString(PyExc_TypeError, "an argument has the wrong type");
  } catch (const std::bad_alloc&) {
    PyErr_NoMemory();
  } catch (const std::exception& e) {
    PyErr_SetString(PyExc_RuntimeError, e.what());
  } catch (...) {
    PyErr_SetString(PyExc_RuntimeError, "unknown C++ exception");
  }
}

PyRef hold(nb::handle o) {
  return PyRef(new nb::object(nb::borrow(o)), [](nb::object* p) {
    if (PyGILState_Check()) {  // includes interpreter shutdown, when Py_IsInitialized() is false
      delete p;
      return;
    }
    if (!Py_IsInitialized()) return;  // interpreter gone: leak rather than crash
    nb::gil_scoped_acquire gil;
    delete p;
  });
}

}  // namespace kiln::python
