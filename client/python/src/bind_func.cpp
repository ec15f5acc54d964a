// kiln._C's bindings of the function transforms (kiln/autograd/functional.h), activation
// checkpointing (kiln/autograd/checkpoint.h) and autocast (kiln/autocast.h). The transforms take
// Python callables over flat lists of tensors; kiln/func.py flattens pytrees onto them.
//
//   grads, value = _C._func_grad_and_value(lambda xs: (xs[0] * xs[1]).sum(), [x, y], [0, 1])
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <memory>

#include "kiln/autocast.h"
#include "kiln/autograd/checkpoint.h"
#include "kiln/autograd/functional.h"
#include "python_args.h"

namespace kiln::python {
namespace {

using TensorVec = std::vector<Tensor>;

nb::list to_list(const TensorVec& ts) {
  nb::list l;
  for (const Tensor& t : ts) l.append(nb::steal(wrap(t)));
  return l;
}

// fn(list of tensors) -> Tensor, as the C++ transforms' function type.
func::Fn as_fn(nb::handle fn, const char* what) {
  PyRef f = hold(fn);
  return [f, what](const TensorVec& xs) -> Tensor {
    nb::gil_scoped_acquire gil;
    nb::object r = (*f)(to_list(xs));
    KILN_CHECK(is_tensor(r.ptr()), Type, what, ": the function must return a Tensor, got ",
               Py_TYPE(r.ptr())->tp_name);
    return unwrap(r.ptr());
  };
}

// fn(list of tensors) -> list of tensors.
func::MultiFn as_multi_fn(nb::handle fn, const char* what) {
  PyRef f = hold(fn);
  return [f, what](const TensorVec& xs) -> TensorVec {
    nb::gil_scoped_acquire gil;
    return tensors_of((*f)(to_list(xs)), what);
  };
}

struct Autocast {
  std::unique_ptr<AutocastGuard> guard;
};

DeviceType device_type_of(const std::string& s) { return Device(s).type(); }

}  // namespace

void bind_func(nb::module_& m) {
  m.def("_func_transform_depth", &func::transform_depth);
  m.def("_func_vjp", [](nb::handle fn, nb::handle primals) {
    auto [out, vjp_fn] = func::vjp(as_fn(fn, "vjp"), tensors_of(primals, "vjp"));
    nb::object call = nb::cpp_function(
        [vjp_fn](nb::handle cotangent) {
          KILN_CHECK(is_tensor(cotangent.ptr()), Type, "vjp_fn: expected a Tensor cotangent");
          return to_list(vjp_fn(unwrap(cotangent.ptr())));
        },
        nb::arg("cotangent"));
    return nb::make_tuple(nb::steal(wrap(out)), call);
  });
  m.def("_func_jvp", [](nb::handle fn, nb::handle primals, nb::handle tangents) {
    auto [out, tangent] =
        func::jvp(as_fn(fn, "jvp"), tensors_of(primals, "jvp"), tensors_of(tangents, "jvp"));
    return nb::make_tuple(nb::steal(wrap(out)), nb::steal(wrap(tangent)));
  });
  m.def("_func_grad_and_value",
        [](nb::handle fn, nb::handle primals, const std::vector<int64_t>& argnums) {
          auto [grads, value] =
              func::grad_and_value(as_fn(fn, "grad"), argnums)(tensors_of(primals, "grad"));
          return nb::make_tuple(to_list(grads), nb::steal(wrap(value)));
        });
  m.def("_func_jacrev", [](nb::handle fn, nb::handle primals, const std::vector<int64_t>& argnums) {
    return to_list(func::jacrev(as_fn(fn, "jacrev"), argnums)(tensors_of(primals, "jacrev")));
  });
  m.def("_func_jacfwd", [](nb::handle fn, nb::handle primals, const std::vector<int64_t>& argnums) {
    return to_list(func::jacfwd(as_fn(fn, "jacfwd"), argnums)(tensors_of(primals, "jacfwd")));
  });
  m.def("_func_vmap",
        [](nb::handle fn, nb::handle primals, std::vector<std::optional<int64_t>> in_dims,
           std::optional<int64_t> chunk_size) {
          return to_list(func::vmap(as_multi_fn(fn, "vmap"), std::move(in_dims), {},
                                    chunk_size)(tensors_of(primals, "vmap")));
        });

  m.def("_checkpoint", [](nb::handle fn, nb::handle inputs, bool preserve_rng_state) {
    PyRef f = hold(fn);
    autograd::CheckpointFn cf = [f](const autograd::variable_list& xs) {
      nb::gil_scoped_acquire gil;
      return tensors_of((*f)(to_list(xs)), "checkpoint");
    };
    return to_list(autograd::checkpoint(cf, tensors_of(inputs, "checkpoint"), preserve_rng_state));
  });

  nb::class_<Autocast>(m, "_Autocast")
      .def(
          "__init__",
          [](Autocast* self, const std::string& device_type, nb::handle dtype, bool enabled) {
            ScalarType st = get_autocast_dtype(device_type_of(device_type));
            KILN_CHECK(dtype.is_none() || dtype_from_object(dtype.ptr(), st), Type,
                       "autocast: dtype must be a kiln dtype");
            new (self)
                Autocast{std::make_unique<AutocastGuard>(device_type_of(device_type), st, enabled)};
          },
          nb::arg("device_type"), nb::arg("dtype").none(), nb::arg("enabled"))
      .def("exit", [](Autocast& self) { self.guard.reset(); });
  m.def(
      "is_autocast_enabled",
      [](const std::string& device_type) {
        return is_autocast_enabled(device_type_of(device_type));
      },
      nb::arg("device_type") = "cpu");
  m.def(
      "get_autocast_dtype",
      [](const std::string& device_type) {
        return nb::borrow(dtype_object(get_autocast_dtype(device_type_of(device_type))));
      },
      nb::arg("device_type") = "cpu");
}

}  // namespace kiln::python
