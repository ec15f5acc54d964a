// kiln._C's exported programs (kiln/_export.py): kiln::export_program_bytes and
// kiln::ExportedProgram (See Note [Exported programs] in kiln/exported_program.h).
//
//   data = _C._export_program(lambda xs: [model(*xs)], [x], ["x"], [], [(0, 0, "batch", 1, 0)],
//                             names, tensors)
//   p = _C.ExportedProgram.from_bytes(data, "<memory>")   # or ExportedProgram.load(path)
//   p.run([x])   # [y];  p.describe(), p.inputs, p.outputs, p.weights
//   c = _C._Calibrator(p); c.observe([x]); data = c.convert()   (kiln/quantization.h)
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include "kiln/compiler/compile.h"
#include "kiln/exported_program.h"
#include "kiln/quantization.h"
#include "kiln/scalar_type.h"
#include "python_args.h"

namespace kiln::python {
namespace {

using TensorVec = std::vector<Tensor>;
using DynamicTuple = std::tuple<size_t, int64_t, std::string, int64_t, int64_t>;

// fn(list of tensors) -> list of tensors (See call_captured in python_args.h).
compiler::Fn as_fn(nb::handle fn) {
  return [fn](const TensorVec& xs) -> TensorVec {
    return call_captured(fn, xs, "kiln.export: the function's outputs");
  };
}

nb::bytes export_program(nb::handle fn, nb::handle args,
                         const std::vector<std::string>& input_names,
                         const std::vector<std::string>& output_names,
                         const std::vector<DynamicTuple>& dynamic,
                         const std::vector<std::string>& weight_names, nb::handle weight_tensors) {
  ExportOptions o;
  o.input_names = input_names;
  o.output_names = output_names;
  for (const auto& [input, dim, name, min, max] : dynamic)
    o.dynamic_dims.push_back({input, dim, name, min, max});
  const TensorVec weights = tensors_of(weight_tensors, "kiln.export: weights");
  KILN_CHECK(weights.size() == weight_names.size(), Value, "kiln.export: ", weight_names.size(),
             " weight names for ", weights.size(), " tensors");
  for (size_t k = 0; k < weights.size(); ++k)
    o.weight_names.emplace_back(weight_names[k], weights[k]);
  const std::string bytes = export_program_bytes(as_fn(fn), tensors_of(args, "kiln.export"), o);
  return nb::bytes(bytes.data(), bytes.size());
}

nb::list ports(const std::vector<ExportedProgram::Port>& ps) {
  nb::list out;
  for (const ExportedProgram::Port& p : ps)
    out.append(nb::make_tuple(p.name, scalar_type_name(p.dtype), p.dims));
  return out;
}

}  // namespace

void bind_export(nb::module_& m) {
  m.def("_export_program", &export_program);
  nb::class_<ExportedProgram>(m, "_ExportedProgram")
      .def_static("load", &ExportedProgram::load)
      .def_static("from_bytes",
                  [](nb::bytes b, const std::string& what) {
                    return ExportedProgram::from_bytes(std::string_view(b.c_str(), b.size()), what);
                  })
      .def("describe", &ExportedProgram::describe)
      .def_prop_ro("inputs", [](const ExportedProgram& p) { return ports(p.inputs()); })
      .def_prop_ro("outputs", [](const ExportedProgram& p) { return ports(p.outputs()); })
      .def_prop_ro("weights",
                   [](const ExportedProgram& p) {
                     nb::dict d;
                     for (const auto& [name, t] : p.weights()) d[name.c_str()] = nb::steal(wrap(t));
                     return d;
                   })
      .def("run", [](const ExportedProgram& p, nb::handle inputs) {
        const TensorVec in = tensors_of(inputs, "kiln.ExportedProgram");
        TensorVec out;
        {
          nb::gil_scoped_release release;  // no Python runs inside
          out = p.run(in);
        }
        return nb::steal(wrap_list(out));
      });
  using quantization::Calibrator;
  nb::class_<Calibrator>(m, "_Calibrator")
      .def(nb::init<const ExportedProgram&>())
      .def("observe",
           [](Calibrator& c, nb::handle inputs) {
             const TensorVec in = tensors_of(inputs, "prepare_pt2e");
             TensorVec out;
             {
               nb::gil_scoped_release release;
               out = c.observe(in);
             }
             return nb::steal(wrap_list(out));
           })
      .def_prop_ro("batches", &Calibrator::batches_observed)
      .def_prop_ro("layers", &Calibrator::layers)
      .def("convert",
           [](const Calibrator& c) {
             std::string b;
             {
               nb::gil_scoped_release release;
               b = c.convert();
             }
             return nb::bytes(b.data(), b.size());
           })
      .def("error_report", [](const Calibrator& c, nb::handle inputs) {
        const TensorVec in = tensors_of(inputs, "error_report");
        std::vector<quantization::LayerError> rows;
        {
          nb::gil_scoped_release release;
          rows = c.error_report(in);
        }
        nb::list out;
        for (const auto& e : rows)
          out.append(nb::make_tuple(e.layer, e.op, e.max_abs, e.mean_abs, e.sqnr_db));
        return out;
      });
}

}  // namespace kiln::python
