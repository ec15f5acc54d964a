// kiln._C's binding of kiln.compile (kiln/compiler/compile.h, kiln/_compile.py) and
// call_captured, which every capture of a Python function uses (python_args.h). A client-only
// build (KILN_CLIENT_ONLY) has no compiler and leaves this file out.
//
//   f = _C._compile(fn, 8); outs = f([x]); f.explain()
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include "kiln/compiler/compile.h"
#include "python_args.h"

namespace kiln::python {
namespace {

using TensorVec = std::vector<Tensor>;

nb::list to_list(const TensorVec& ts) { return nb::steal<nb::list>(wrap_list(ts)); }

// fn(list of tensors) -> list of tensors, for kiln.compile (See call_captured in
// python_args.h). It holds `fn` weakly: kiln/_compile.py keeps it, and a strong reference from
// C++, which Python's cycle collector cannot see, would keep the function's globals alive forever.
compiler::Fn as_compiled_fn(nb::handle fn) {
  PyRef ref = hold(nb::module_::import_("weakref").attr("ref")(fn));
  return [ref](const TensorVec& xs) -> TensorVec {
    nb::gil_scoped_acquire gil;
    nb::object f = (*ref)();
    KILN_CHECK(!f.is_none(), Runtime, "kiln.compile: the compiled function was released");
    return call_captured(f, xs, "kiln.compile");
  };
}

}  // namespace

TensorVec call_captured(nb::handle fn, const TensorVec& args, const char* what) {
  TensorVec out;
  {
    nb::object r = nb::borrow(fn)(to_list(args));
    out = tensors_of(r, what);
  }  // the call's result is released before the collection
  if (compiler::is_capturing()) nb::module_::import_("gc").attr("collect")();
  return out;
}

void bind_compile(nb::module_& m) {
  nb::class_<compiler::CompiledFunction>(m, "_CompiledFunction")
      .def("__call__", [](compiler::CompiledFunction& f,
                          nb::handle args) { return to_list(f(tensors_of(args, "kiln.compile"))); })
      .def("explain",
           [](const compiler::CompiledFunction& f) {
             nb::list l;
             for (const compiler::Event& e : f.explain())
               l.append(nb::make_tuple(compiler::event_kind_name(e.kind), e.reason));
             return l;
           })
      .def_prop_ro("num_programs", &compiler::CompiledFunction::num_programs)
      .def_prop_ro("num_recompiles", &compiler::CompiledFunction::num_recompiles)
      .def_prop_ro("num_replays", &compiler::CompiledFunction::num_replays)
      .def_prop_ro("num_segment_runs", &compiler::CompiledFunction::num_segment_runs)
      .def("graph_str", &compiler::CompiledFunction::graph_str)
      .def("saved_activation_bytes", &compiler::CompiledFunction::saved_activation_bytes)
      .def("reset", &compiler::CompiledFunction::reset);
  m.def("_compile", [](nb::handle fn, int recompile_limit) {
    return compiler::compile(as_compiled_fn(fn),
                             compiler::Options{.recompile_limit = recompile_limit});
  });
}

}  // namespace kiln::python
