// kiln._C's autograd bindings: Tensor.backward/.grad/hooks, grad modes, autograd.grad, graph
// nodes and custom Functions written in Python (kiln.autograd.Function).
#include "kiln/autograd/autograd.h"

#include <nanobind/stl/optional.h>
#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <memory>

#include "python_args.h"

namespace kiln::python {

using autograd::variable_list;

namespace {

nb::object to_py(const Tensor& t) { return nb::steal(wrap(t)); }

Tensor tensor_or_undefined(nb::handle o, const char* what) {
  if (o.is_none()) return Tensor();
  KILN_CHECK(is_tensor(o.ptr()), Type, what, ": expected a Tensor or None, got ",
             Py_TYPE(o.ptr())->tp_name);
  return unwrap(o.ptr());
}

variable_list tensor_list(nb::handle seq, const char* what) {
  variable_list out;
  for (nb::handle o : seq) out.push_back(tensor_or_undefined(o, what));
  return out;
}

nb::tuple tensor_tuple(const variable_list& ts) {
  nb::list l;
  for (const Tensor& t : ts) l.append(to_py(t));
  return nb::tuple(l);
}

// ctx of a Python custom Function: a weak handle on its node (the node owns the backward
// callable, which owns this ctx) plus whatever attributes forward stores on it.
struct FunctionCtx {
  std::weak_ptr<autograd::CustomFunctionNode> node;
  size_t nargs = 0;
  std::vector<size_t> tensor_pos;  // which of forward's arguments are tensors
  // Asked of the node each time, so that a backward which computes only some gradients (a
  // split backward, See Note [Split backward] in engine.h) shows the others as not needed.
  nb::tuple needs_input_grad() const {
    auto n = node.lock();
    nb::list needs;
    for (size_t k = 0; k < nargs; ++k) needs.append(false);
    for (size_t j = 0; n && j < tensor_pos.size(); ++j)
      needs[tensor_pos[j]] = n->ctx().needs_input_grad(j);
    return nb::tuple(needs);
  }
  autograd::CustomFunctionNode& live() const {
    auto n = node.lock();
    KILN_CHECK(n != nullptr, Runtime, "this Function's context is no longer valid");
    return *n;  // the caller (forward or backward) keeps the node alive meanwhile
  }
};

// Python custom Function.apply (Note [Custom functions] in kiln/autograd/function.h): forward
// runs with grad mode off, outputs get a CustomFunctionNode whose backward calls cls.backward.
nb::object function_apply(nb::handle cls, nb::args args) {
  variable_list inputs;
  std::vector<size_t> tensor_pos;  // positions of the Tensor arguments (the edges)
  for (size_t k = 0; k < args.size(); ++k) {
    if (is_tensor(args[k].ptr())) {
      inputs.push_back(unwrap(args[k].ptr()));
      tensor_pos.push_back(k);
    }
  }
  const bool is_executable =
      autograd::GradMode::is_enabled() && autograd::detail::any_requires_grad(inputs);
  nb::object ctx = nb::module_::import_("kiln._C").attr("FunctionCtx")();
  PyRef cls_ref = hold(cls), ctx_ref = hold(ctx);
  const size_t nargs = args.size();
  std::string name = nb::cast<std::string>(cls.attr("__name__")) + "Backward";
  auto node = std::make_shared<autograd::CustomFunctionNode>(
      name,
      [cls_ref, ctx_ref, tensor_pos, nargs, name](autograd::AutogradContext*, variable_list grads) {
        nb::gil_scoped_acquire gil;
        nb::object r = cls_ref->attr("backward")(*ctx_ref, *tensor_tuple(grads));
        if (!nb::isinstance<nb::tuple>(r)) r = nb::make_tuple(r);
        KILN_CHECK(nb::len(r) == nargs, Runtime, "function ", name,
                   " returned an incorrect number of gradients (expected ", nargs, ", got ",
                   nb::len(r), ")");
        variable_list out;
        for (size_t k : tensor_pos) out.push_back(tensor_or_undefined(r[k], name.c_str()));
        return out;
      });
  node->collect_inputs(inputs, is_executable);
  FunctionCtx* c = nb::inst_ptr<FunctionCtx>(ctx);
  c->node = node;
  c->nargs = nargs;
  c->tensor_pos = tensor_pos;

  nb::object raw;
  {
    autograd::AutoGradMode no_grad(false);
    raw = cls.attr("forward")(ctx, *args);
  }
  const bool single = !nb::isinstance<nb::tuple>(raw);
  nb::tuple outs = single ? nb::make_tuple(raw) : nb::borrow<nb::tuple>(raw);
  variable_list out_tensors;
  std::vector<size_t> out_pos;
  for (size_t k = 0; k < outs.size(); ++k) {
    if (!is_tensor(outs[k].ptr())) continue;
    out_tensors.push_back(unwrap(outs[k].ptr()));
    out_pos.push_back(k);
  }
  // An output kept as an attribute of ctx (ctx.y = y, not save_for_backward) makes a cycle
  // ctx -> y -> its node -> ctx through C++, which Python's collector cannot see: that output
  // and its graph would never be freed. Say so (once per call site, as warnings do).
  if (is_executable) {
    for (auto [key, value] : nb::borrow<nb::dict>(ctx.attr("__dict__"))) {  // dynamic_attr
      if (!is_tensor(value.ptr())) continue;
      const TensorImpl* held = unwrap(value.ptr()).impl();
      for (const Tensor& t : out_tensors)
        if (t.impl() == held) {
          const std::string msg =
              nb::cast<std::string>(cls.attr("__name__")) + ".forward keeps its output as ctx." +
              nb::cast<std::string>(nb::str(key)) +
              ", which is never freed (a reference cycle through the autograd graph); "
              "use ctx.save_for_backward for outputs";
          if (PyErr_WarnEx(PyExc_UserWarning, msg.c_str(), 1) < 0) throw nb::python_error();
        }
    }
  }
  variable_list wrapped = node->wrap_outputs(inputs, std::move(out_tensors), is_executable);
  nb::list result;
  for (size_t k = 0; k < outs.size(); ++k) result.append(outs[k]);
  for (size_t j = 0; j < out_pos.size(); ++j) result[out_pos[j]] = to_py(wrapped[j]);
  return single ? result[0] : nb::object(nb::tuple(result));
}

struct InferenceMode {
  std::unique_ptr<autograd::InferenceModeGuard> guard;
};

}  // namespace

void bind_autograd(nb::module_& m, nb::class_<Tensor>& cls) {
  nb::class_<autograd::Node>(m, "Node")
      .def("name", [](const autograd::Node& n) { return std::string(n.name()); })
      .def_prop_ro("next_functions",
                   [](const autograd::Node& n) {
                     nb::list l;
                     for (const autograd::Edge& e : n.next_edges())
                       l.append(nb::make_tuple(e.fn ? nb::cast(e.fn) : nb::none(), e.input_nr));
                     return nb::tuple(l);
                   })
      .def("__repr__", [](const autograd::Node& n) { return std::string("<") + n.name() + ">"; });
  nb::class_<autograd::RemovableHandle>(m, "RemovableHandle")
      .def("remove", &autograd::RemovableHandle::remove);

  cls.def_prop_rw("requires_grad", &Tensor::requires_grad,
                  [](const Tensor& t, bool v) { t.requires_grad_(v); })
      .def_prop_rw(
          "grad", [](const Tensor& t) { return to_py(t.grad()); },
          [](const Tensor& t, nb::handle g) { t.set_grad(tensor_or_undefined(g, "grad")); },
          nb::for_setter(nb::arg("grad").none()))
      .def_prop_ro("grad_fn", &Tensor::grad_fn)
      .def_prop_ro("retains_grad", &Tensor::retains_grad)
      .def(
          "requires_grad_",
          [](nb::handle self, bool v) {
            unwrap(self.ptr()).requires_grad_(v);
            return nb::borrow(self);
          },
          nb::arg("requires_grad") = true)
      .def(
          "backward",
          [](const Tensor& t, nb::handle gradient, std::optional<bool> retain_graph,
             bool create_graph) {
            t.backward(tensor_or_undefined(gradient, "backward"), retain_graph, create_graph);
          },
          nb::arg("gradient").none() = nb::none(), nb::arg("retain_graph") = nb::none(),
          nb::arg("create_graph") = false)
      .def("detach", &Tensor::detach)
      .def("retain_grad", &Tensor::retain_grad)
      .def(
          "register_hook",
          [](const Tensor& t, nb::handle fn) {
            PyRef f = hold(fn);
            return autograd::register_hook(t, [f](const Tensor& g) {
              nb::gil_scoped_acquire gil;
              nb::object r = (*f)(to_py(g));
              return tensor_or_undefined(r, "a tensor hook's result");
            });
          },
          nb::arg("hook"));

  m.def("_set_grad_enabled", &autograd::GradMode::set_enabled, nb::arg("mode"));
  m.def("is_grad_enabled", &autograd::GradMode::is_enabled);
  m.def("is_inference_mode_enabled", &autograd::InferenceModeGuard::is_enabled);
  nb::class_<InferenceMode>(m, "_InferenceMode")
      .def("__init__",
           [](InferenceMode* self, bool mode) {
             new (self) InferenceMode{std::make_unique<autograd::InferenceModeGuard>(mode)};
           })
      .def("exit", [](InferenceMode& self) { self.guard.reset(); });

  m.def("_autograd_grad", [](nb::handle outputs, nb::handle inputs, nb::handle grad_outputs,
                             std::optional<bool> retain_graph, bool create_graph,
                             bool allow_unused) {
    return tensor_tuple(autograd::grad(tensor_list(outputs, "grad"), tensor_list(inputs, "grad"),
                                       tensor_list(grad_outputs, "grad"), retain_graph,
                                       create_graph, allow_unused));
  });
  m.def("_autograd_backward", [](nb::handle tensors, nb::handle grad_tensors,
                                 std::optional<bool> retain_graph, bool create_graph) {
    autograd::backward(tensor_list(tensors, "backward"), tensor_list(grad_tensors, "backward"),
                       retain_graph, create_graph);
  });

  nb::class_<FunctionCtx>(m, "FunctionCtx", nb::dynamic_attr())
      .def(nb::init<>())
      .def("save_for_backward",
           [](FunctionCtx& c, nb::args ts) {
             c.live().ctx().save_for_backward(tensor_list(ts, "save_for_backward"));
           })
      .def_prop_ro(
          "saved_tensors",
          [](const FunctionCtx& c) { return tensor_tuple(c.live().ctx().get_saved_variables()); })
      .def("mark_dirty",
           [](FunctionCtx& c, nb::args ts) {
             c.live().ctx().mark_dirty(tensor_list(ts, "mark_dirty"));
           })
      .def("mark_non_differentiable",
           [](FunctionCtx& c, nb::args ts) {
             c.live().ctx().mark_non_differentiable(tensor_list(ts, "mark_non_differentiable"));
           })
      .def_prop_ro("needs_input_grad", &FunctionCtx::needs_input_grad);
  m.def("_function_apply", &function_apply);
}

}  // namespace kiln::python
