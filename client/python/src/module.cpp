// kiln._C: the extension module behind the `kiln` package. It links the same libkiln*.so as C++
// programs (one dispatcher per process, DESIGN.md "Layers"). Every op of the table is bound by
// the generated ops_bindings.cpp (kiln._C.<op>, kiln.Tensor.<op>); this file binds the Tensor
// type itself, dtypes, devices, generators, NumPy/DLPack interop and the runtime settings;
// autograd.cpp binds autograd.
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include "kiln/autograd/node.h"
#include "kiln/default_device.h"
#include "kiln/generated/ops/pointwise.h"
#include "kiln/qparams.h"
#include "python_args.h"

namespace kiln::python {

void bind_autograd(nb::module_& m, nb::class_<Tensor>& cls);  // autograd.cpp
void bind_nn(nb::module_& m);                                 // bind_nn.cpp
void bind_func(nb::module_& m);                               // bind_func.cpp
void bind_io(nb::module_& m);                                 // bind_io.cpp
void bind_dist(nb::module_& m);                               // bind_dist.cpp
void bind_pipelining(nb::module_& m);                         // bind_pipelining.cpp
void bind_remote(nb::module_& m);                             // bind_remote.cpp
void bind_profiler(nb::module_& m);                           // bind_profiler.cpp
void bind_batch(nb::module_& m);                              // bind_batch.cpp
void bind_export(nb::module_& m);                             // bind_export.cpp
void bind_onnx(nb::module_& m);                               // bind_onnx.cpp
void bind_compile(nb::module_& m);                            // bind_compile.cpp

namespace {

// kiln.float32, ...: one object per dtype, so `x.dtype is kiln.float32` holds.
struct DType {
  ScalarType st;
};
nb::object g_dtypes[kNumScalarTypes];
constexpr int kDLCPU = 1;  // DLPack's device type of host memory

nb::dlpack::dtype dl_dtype(ScalarType t) {
  using nb::dlpack::dtype_code;
  uint8_t bits = static_cast<uint8_t>(element_size(t) * 8);
  dtype_code code = t == kBool       ? dtype_code::Bool
                    : t == kBFloat16 ? dtype_code::Bfloat
                    : is_floating(t) ? dtype_code::Float
                    : t == kUInt8    ? dtype_code::UInt
                                     : dtype_code::Int;
  return {static_cast<uint8_t>(code), bits, 1};
}

ScalarType from_dl_dtype(nb::dlpack::dtype d) {
  for (int k = 0; k < kNumScalarTypes; ++k) {
    auto t = static_cast<ScalarType>(k);
    if (dl_dtype(t) == d) return t;
  }
  KILN_FAIL(Type, "from_numpy/from_dlpack: unsupported array dtype (code ", int(d.code), ", ",
            int(d.bits), " bits, ", int(d.lanes),
            " lanes); Kiln supports bool, uint8, int8, int16, "
            "int32, int64, float16, bfloat16, float32 and float64");
}

// A view of `t`'s memory that keeps `t`'s storage alive (NumPy export, DLPack export).
template <class... Framework>
nb::ndarray<Framework...> as_ndarray(const Tensor& t, const char* what) {
  KILN_CHECK(t.device().is_cpu(), Type, what, ": expected a CPU tensor, got one on ", t.device(),
             " (copy it with .cpu() first)");
  std::vector<size_t> shape(t.sizes().begin(), t.sizes().end());
  std::vector<int64_t> strides(t.strides().begin(), t.strides().end());
  nb::capsule owner(new Tensor(t), [](void* p) noexcept { delete static_cast<Tensor*>(p); });
  return nb::ndarray<Framework...>(t.data_ptr(), shape.size(), shape.data(), owner, strides.data(),
                                   dl_dtype(t.dtype()), kDLCPU);
}

// Owns the array a tensor made by from_numpy/from_dlpack borrows (freed with the GIL held).
void release_array(void* ctx, void*) {
  auto* a = static_cast<nb::ndarray<>*>(ctx);
  if (!Py_IsInitialized()) return;  // interpreter gone: leak rather than crash
  nb::gil_scoped_acquire gil;
  delete a;
}

Tensor from_array(nb::ndarray<> a, const char* what) {
  KILN_CHECK(a.device_type() == kDLCPU, Type, what,
             ": only CPU arrays can be shared, got device type ", a.device_type());
  ScalarType dt = from_dl_dtype(a.dtype());
  DimVector sizes, strides;
  int64_t extent = 1;
  bool empty = false;
  for (size_t d = 0; d < a.ndim(); ++d) {
    int64_t n = static_cast<int64_t>(a.shape(d)), s = a.stride(d);
    KILN_CHECK(s >= 0, Value, what, ": arrays with negative strides are not supported (stride ", s,
               " in dim ", d, "); make a copy first (numpy.ascontiguousarray)");
    sizes.push_back(n);
    strides.push_back(s);
    empty = empty || n == 0;
    extent += (n - 1) * s;
  }
  size_t nbytes = empty ? 0 : static_cast<size_t>(extent) * element_size(dt);
  void* data = a.data();
  DataPtr ptr(data, new nb::ndarray<>(std::move(a)), &release_array, kCPU);
  return Tensor(TensorImpl::make(Storage::wrap(std::move(ptr), nbytes), dt, sizes, strides, 0));
}

nb::tuple int_tuple(IntArrayRef v) {
  PyObject* t = PyTuple_New(static_cast<Py_ssize_t>(v.size()));
  for (size_t k = 0; k < v.size(); ++k) PyTuple_SET_ITEM(t, k, PyLong_FromLongLong(v[k]));
  return nb::steal<nb::tuple>(t);
}

// PyTorch's repr, with requires_grad / grad_fn as it prints them.
std::string tensor_repr(const Tensor& t) {
  std::string s = t.repr();
  std::string extra;
  if (auto fn = t.grad_fn())
    extra = std::string(", grad_fn=<") + fn->name() + ">";
  else if (t.requires_grad())
    extra = ", requires_grad=True";
  if (!extra.empty() && !s.empty() && s.back() == ')') s.insert(s.size() - 1, extra);
  return s;
}

void python_warning(const std::string& msg) {
  if (!Py_IsInitialized() || !PyGILState_Check()) {  // a kernel thread: never wait for the GIL
    fprintf(stderr, "kiln warning: %s\n", msg.c_str());
    return;
  }
  if (PyErr_WarnEx(PyExc_UserWarning, msg.c_str(), 1) < 0) PyErr_WriteUnraisable(nullptr);
}

// Note [Python dispatch speed]: the arithmetic operators are the Tensor type's own number slots
// (nb_add, ...), so `a + b` reaches C++ without a Python-level method lookup or argument parsing.
// A Python number operand becomes the wrapped number it would be through the op's schema (Note
// [Type promotion]); an int or float next to a floating tensor is made in that tensor's dtype,
// since the kernel would cast it to the result dtype (the tensor's) anyway, which saves a cast op
// per call. Any other operand goes through the op's generated binding (its overloads and errors).
// Results are allocated straight from nanobind's instance pool (wrap()), which keeps as many dead
// Tensor objects for reuse as the C++ free lists keep TensorImpls (Note [Pooled objects]): a
// recycled object skips the allocation and nanobind's registration of a new instance, which
// matter once many results are alive at a time. Large operands release the GIL around the op.
enum class BinOp { Add, Sub, Mul, Div };

// `o` as the operand of a binary operator whose other operand is the tensor `t`.
bool operand(PyObject* o, const Tensor& t, Tensor& out) {
  if (is_tensor(o)) {
    out = unwrap(o);
    return true;
  }
  Scalar s;
  if (PyFloat_CheckExact(o)) {
    s = Scalar(PyFloat_AS_DOUBLE(o));
  } else if (PyBool_Check(o)) {
    s = Scalar(o == Py_True);
  } else if (PyLong_CheckExact(o)) {
    int overflow = 0;
    long long v = PyLong_AsLongLongAndOverflow(o, &overflow);
    if (overflow) return false;
    s = Scalar(static_cast<int64_t>(v));
  } else {
    return false;
  }
  const bool as_t = is_floating(t.dtype()) && !s.is_bool();  // bool keeps its checks (sub)
  out = scalar_tensor_of(s, as_t ? t.dtype() : s.dtype());
  out.impl()->set_wrapped_number(true);
  return true;
}

Tensor binary(BinOp op, const Tensor& a, const Tensor& b) {
  switch (op) {
    case BinOp::Add:
      return ops::add::call(a, b, Scalar(int64_t{1}));
    case BinOp::Sub:
      return ops::sub::call(a, b, Scalar(int64_t{1}));
    case BinOp::Mul:
      return ops::mul::call(a, b);
    case BinOp::Div:
      return ops::div::call(a, b, std::nullopt);
  }
  KILN_ASSERT(false);
}

// Operands at least this large run with the GIL released (other Python threads go on meanwhile);
// the tiny-op path never pays for the release.
constexpr int64_t kReleaseGilNumel = 1 << 16;

const char* const kBinOpNames[] = {"add", "sub", "mul", "div"};

// The generic path: kiln._C.<op>(a, b), NotImplemented if it does not take the operands.
PyObject* binary_fallback(BinOp op, PyObject* a, PyObject* b, bool inplace) {
  std::string name = kBinOpNames[static_cast<int>(op)];
  PyObject* self = is_tensor(a) ? a : nullptr;
  nb::object fn = self ? nb::borrow(reinterpret_cast<PyObject*>(Py_TYPE(a)))
                             .attr((name + (inplace ? "_" : "")).c_str())
                       : nb::module_::import_("kiln._C").attr(name.c_str());
  PyObject* args[2] = {a, b};
  PyObject* r = PyObject_Vectorcall(fn.ptr(), args, 2, nullptr);
  if (!r && PyErr_ExceptionMatches(PyExc_TypeError) && !inplace) {
    PyErr_Clear();
    Py_RETURN_NOTIMPLEMENTED;
  }
  return r;
}

template <BinOp op>
PyObject* binary_slot(PyObject* a, PyObject* b) {
  return guarded([&]() -> PyObject* {
    Tensor x, y;
    const Tensor& t = is_tensor(a) ? unwrap(a) : unwrap(b);
    if (!operand(a, t, x) || !operand(b, t, y)) return binary_fallback(op, a, b, false);
    if (x.numel() + y.numel() < kReleaseGilNumel) return wrap(binary(op, x, y));
    Tensor r;
    {
      nb::gil_scoped_release no_gil;
      r = binary(op, x, y);
    }
    return wrap(std::move(r));
  });
}

void inplace(BinOp op, const Tensor& x, const Tensor& y) {
  switch (op) {
    case BinOp::Add:
      ops::add_::call(x, y, Scalar(int64_t{1}));
      return;
    case BinOp::Sub:
      ops::sub_::call(x, y, Scalar(int64_t{1}));
      return;
    case BinOp::Mul:
      ops::mul_::call(x, y);
      return;
    case BinOp::Div:
      ops::div_::call(x, y, std::nullopt);
      return;
  }
}

template <BinOp op>
PyObject* inplace_slot(PyObject* a, PyObject* b) {
  return guarded([&]() -> PyObject* {
    Tensor y;
    if (!is_tensor(a) || !operand(b, unwrap(a), y)) return binary_fallback(op, a, b, true);
    const Tensor& x = unwrap(a);
    if (x.numel() + y.numel() < kReleaseGilNumel) {
      inplace(op, x, y);
    } else {
      nb::gil_scoped_release no_gil;
      inplace(op, x, y);
    }
    return incref(a);
  });
}

PyType_Slot kTensorSlots[] = {
    {Py_nb_add, reinterpret_cast<void*>(&binary_slot<BinOp::Add>)},
    {Py_nb_subtract, reinterpret_cast<void*>(&binary_slot<BinOp::Sub>)},
    {Py_nb_multiply, reinterpret_cast<void*>(&binary_slot<BinOp::Mul>)},
    {Py_nb_true_divide, reinterpret_cast<void*>(&binary_slot<BinOp::Div>)},
    {Py_nb_inplace_add, reinterpret_cast<void*>(&inplace_slot<BinOp::Add>)},
    {Py_nb_inplace_subtract, reinterpret_cast<void*>(&inplace_slot<BinOp::Sub>)},
    {Py_nb_inplace_multiply, reinterpret_cast<void*>(&inplace_slot<BinOp::Mul>)},
    {Py_nb_inplace_true_divide, reinterpret_cast<void*>(&inplace_slot<BinOp::Div>)},
    {0, nullptr}};

void bind_tensor(nb::module_& m) {
  nb::class_<Tensor> cls(m, "Tensor", nb::dynamic_attr(), nb::pooled(kiln::detail::kMaxPooled),
                         nb::type_slots(kTensorSlots));
  g_tensor_type = reinterpret_cast<PyTypeObject*>(cls.ptr());
  cls.def_prop_ro("shape", [](const Tensor& t) { return int_tuple(t.sizes()); })
      .def_prop_ro("dtype", [](const Tensor& t) { return nb::borrow(dtype_object(t.dtype())); })
      .def_prop_ro("device", [](const Tensor& t) { return t.device(); })
      .def_prop_ro("ndim", &Tensor::dim)
      .def_prop_ro("is_cuda", [](const Tensor& t) { return t.device().is_cuda(); })
      .def_prop_ro("is_meta", &Tensor::is_meta)
      .def_prop_ro("is_leaf", &Tensor::is_leaf)
      .def_prop_ro("_version", &Tensor::version)
      .def_prop_ro("nbytes", &Tensor::nbytes)
      .def_prop_ro("itemsize", &Tensor::element_size)
      .def("dim", &Tensor::dim)
      .def("ndimension", &Tensor::dim)
      .def("numel", &Tensor::numel)
      .def("nelement", &Tensor::numel)
      .def("element_size", &Tensor::element_size)
      .def(
          "size",
          [](const Tensor& t, std::optional<int64_t> d) -> nb::object {
            if (d) return nb::int_(t.size(*d));
            return int_tuple(t.sizes());
          },
          nb::arg("dim") = nb::none())
      .def(
          "stride",
          [](const Tensor& t, std::optional<int64_t> d) -> nb::object {
            if (d) return nb::int_(t.stride(*d));
            return int_tuple(t.strides());
          },
          nb::arg("dim") = nb::none())
      .def("storage_offset", &Tensor::storage_offset)
      .def("is_contiguous", &Tensor::is_contiguous)
      .def("is_floating_point", [](const Tensor& t) { return is_floating(t.dtype()); })
      .def("is_inference", &Tensor::is_inference)
      .def("data_ptr", [](const Tensor& t) { return reinterpret_cast<uintptr_t>(t.data_ptr()); })
      .def("item",
           [](const Tensor& t) -> nb::object {
             KILN_CHECK(t.numel() == 1, Value, "item(): a Tensor with ", t.numel(),
                        " elements cannot be converted to a Python number");
             Scalar s = t.item();
             if (s.is_bool()) return nb::bool_(s.to_bool());
             if (s.is_integral()) return nb::int_(s.to_int());
             return nb::float_(s.to_double());
           })
      .def("__repr__", &tensor_repr)
      .def("_cpp_numpy", [](const Tensor& t) { return as_ndarray<nb::numpy>(t, "numpy()"); })
      // nanobind's array object speaks both DLPack versions (a versioned, writable capsule
      // when the consumer passes max_version).
      .def("__dlpack__",
           [](const Tensor& t, nb::kwargs kw) {
             return nb::cast(as_ndarray<nb::array_api>(t, "__dlpack__")).attr("__dlpack__")(**kw);
           })
      .def("__dlpack_device__", [](const Tensor& t) {
        KILN_CHECK(t.device().is_cpu(), Type, "__dlpack__: expected a CPU tensor");
        return nb::make_tuple(kDLCPU, 0);
      });
  // Every op of the table that the C++ Tensor has as a method (generated).
  for (PyMethodDef* d = kOpMethods; d->ml_name; ++d) {
    nb::object descr = nb::steal(PyDescr_NewMethod(g_tensor_type, d));
    if (!descr.is_valid() || PyObject_SetAttrString(cls.ptr(), d->ml_name, descr.ptr()) < 0)
      throw nb::python_error();
  }
  bind_autograd(m, cls);
}

void bind_dtype_device(nb::module_& m) {
  nb::class_<DType>(m, "dtype")
      .def_prop_ro("is_floating_point", [](const DType& d) { return is_floating(d.st); })
      .def_prop_ro("is_signed", [](const DType& d) { return d.st != kBool && d.st != kUInt8; })
      .def_prop_ro("itemsize", [](const DType& d) { return element_size(d.st); })
      .def("__repr__", [](const DType& d) { return std::string("kiln.") + scalar_type_name(d.st); })
      .def("__reduce__", [](const DType& d) { return std::string(scalar_type_name(d.st)); });
  for (int k = 0; k < kNumScalarTypes; ++k) {
    auto st = static_cast<ScalarType>(k);
    g_dtypes[k] = nb::cast(DType{st});
    m.attr(scalar_type_name(st)) = g_dtypes[k];
  }
  const std::pair<const char*, ScalarType> aliases[] = {{"float", kFloat32}, {"double", kFloat64},
                                                        {"half", kFloat16},  {"long", kInt64},
                                                        {"int", kInt32},     {"short", kInt16}};
  for (auto [name, st] : aliases) m.attr(name) = g_dtypes[static_cast<int>(st)];

  nb::class_<Device>(m, "device")
      .def(nb::init<const std::string&>(), nb::arg("type"))
      .def(
          "__init__",
          [](Device* d, const std::string& type, int index) {
            new (d) Device(Device(type).type(), static_cast<int16_t>(index));
          },
          nb::arg("type"), nb::arg("index"))
      .def_prop_ro("type", [](const Device& d) { return std::string(device_type_name(d.type())); })
      .def_prop_ro("index",
                   [](const Device& d) -> nb::object {
                     return d.index() < 0 ? nb::object(nb::none())
                                          : nb::object(nb::int_(d.index()));
                   })
      .def("__str__", &Device::str)
      .def("__repr__",
           [](const Device& d) {
             std::string s = "device(type='" + std::string(device_type_name(d.type())) + "'";
             if (d.index() >= 0) s += ", index=" + std::to_string(d.index());
             return s + ")";
           })
      .def("__eq__",
           [](const Device& d, nb::handle o) {
             Device other;
             return device_from_object(o.ptr(), other) && other == d;
           })
      .def("__hash__", [](const Device& d) { return std::hash<std::string>()(d.str()); });
  // torch.set_default_device / get_default_device (kiln/default_device.h): per thread.
  m.def("set_default_device", [](nb::handle d) {
    Device dev;
    KILN_CHECK(d.is_none() || device_from_object(d.ptr(), dev), Type,
               "set_default_device: expected a device or a string such as 'cpu', got ",
               nb::type_name(d.type()).c_str());
    set_default_device(d.is_none() ? Device(kCPU) : dev);
  });
  m.def("get_default_device", [] { return default_device(); });
  m.def("_choose_qparams_u8", [](float lo, float hi) {  // kiln/qparams.h
    const QParams p = choose_qparams_u8(lo, hi);
    return std::make_pair(static_cast<double>(p.scale), p.zero_point);
  });

  nb::class_<Generator>(m, "Generator")
      .def(nb::init<>())
      .def("manual_seed",
           [](nb::handle self, uint64_t seed) {
             nb::inst_ptr<Generator>(self)->manual_seed(seed);
             return nb::borrow(self);
           })
      .def("initial_seed", &Generator::initial_seed)
      .def("get_state",
           [](const Generator& g) {
             GeneratorState s = g.get_state();
             return std::make_pair(s.seed, s.offset);
           })
      .def("set_state", [](Generator& g, std::pair<uint64_t, uint64_t> s) {
        g.set_state(GeneratorState{s.first, s.second});
      });
  m.def("default_generator", [] { return default_generator(); });
}

}  // namespace

PyObject* dtype_object(ScalarType t) { return g_dtypes[static_cast<int>(t)].ptr(); }

bool dtype_from_object(PyObject* o, ScalarType& out) {
  if (nb::isinstance<DType>(nb::handle(o))) {
    out = nb::inst_ptr<DType>(o)->st;
    return true;
  }
  // dtype=float / int / bool, as PyTorch accepts the Python types.
  if (o == reinterpret_cast<PyObject*>(&PyFloat_Type))
    out = kFloat64;
  else if (o == reinterpret_cast<PyObject*>(&PyLong_Type))
    out = kInt64;
  else if (o == reinterpret_cast<PyObject*>(&PyBool_Type))
    out = kBool;
  else
    return false;
  return true;
}

bool device_from_object(PyObject* o, Device& out) {
  if (nb::isinstance<Device>(nb::handle(o))) {
    out = *nb::inst_ptr<Device>(o);
    return true;
  }
  if (!PyUnicode_Check(o)) return false;
  const char* s = PyUnicode_AsUTF8(o);
  if (!s) {
    PyErr_Clear();
    return false;
  }
  out = Device(std::string(s));  // ValueError for a bad device string
  return true;
}

}  // namespace kiln::python

using namespace kiln;
using namespace kiln::python;

NB_MODULE(_C, m) {
  m.attr("__version__") = KILN_VERSION;
  bind_dtype_device(m);
  bind_tensor(m);
  bind_nn(m);
  bind_func(m);
  bind_io(m);
  bind_remote(m);
  bind_profiler(m);
#ifdef KILN_CLIENT_ONLY
  m.attr("_client_only") = true;  // no compiler, kiln::dist, exported programs or ONNX
#else
  m.attr("_client_only") = false;
  bind_compile(m);
  bind_dist(m);
  bind_pipelining(m);
  bind_batch(m);
  bind_export(m);
  bind_onnx(m);
#endif
  if (PyModule_AddFunctions(m.ptr(), kOpFunctions) < 0) throw nb::python_error();
  set_warning_handler(&python_warning);
  // The dtype objects go before nanobind's leak check at exit.
  nb::module_::import_("atexit").attr("register")(nb::cpp_function([] {
    for (nb::object& d : g_dtypes) d.reset();
  }));

  m.def(
      "from_numpy", [](nb::ndarray<> a) { return from_array(std::move(a), "from_numpy"); },
      nb::arg("ndarray"));
  m.def(
      "from_dlpack", [](nb::ndarray<> a) { return from_array(std::move(a), "from_dlpack"); },
      nb::arg("ext_tensor"));
  m.def(
      "manual_seed", [](uint64_t seed) { manual_seed(seed); }, nb::arg("seed"));
  m.def("initial_seed", [] { return default_generator().initial_seed(); });
  m.def("set_num_threads", &set_num_threads, nb::arg("n"));
  m.def("get_num_threads", &get_num_threads);
  // result_type(tensor, other): either may be a Python number, which counts as a wrapped number
  // (PyTorch's (Tensor, Scalar), (Scalar, Tensor) and (Scalar, Scalar) overloads).
  m.def(
      "result_type",
      [](nb::handle tensor, nb::handle other) {
        static const Signature sig("result_type",
                                   {{"tensor", python::ArgType::Tensor, nullptr, false, 0},
                                    {"other", python::ArgType::Tensor, nullptr, false, 0}});
        PyObject* args[2] = {tensor.ptr(), other.ptr()};
        Value v[2];
        std::string why;
        KILN_CHECK(sig.parse(nullptr, args, 2, nullptr, v, why), Type, "result_type(): ", why,
                   " (expected tensors or numbers)");
        return nb::borrow(dtype_object(result_type(v[0].t, v[1].t)));
      },
      nb::arg("tensor"), nb::arg("other"));
  m.def("promote_types", [](nb::handle a, nb::handle b) {
    ScalarType x, y;
    KILN_CHECK(dtype_from_object(a.ptr(), x) && dtype_from_object(b.ptr(), y), Type,
               "promote_types: expected two dtypes");
    return nb::borrow(dtype_object(promote_types(x, y)));
  });
  // Kiln errors raised by nanobind-bound functions map to Python exceptions as in the op
  // bindings (Note [Error kinds]).
  nb::register_exception_translator([](const std::exception_ptr& p, void*) {
    try {
      std::rethrow_exception(p);
    } catch (const Error&) {
      set_python_error();
    }
  });
}
