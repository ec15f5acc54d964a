// kiln._C's view of an exported program as plain Python data, for kiln.onnx (kiln/onnx.py):
//
//   g = _C._program_graph(data)   # the bytes of a .kprog file (Note [Exported program file])
//   g["inputs"]    [(value id, kind "argument"|"weight"|"constant", name, dtype, sizes, number,
//                    strides, offset, wrapped number)], at the example sizes
//   g["nodes"]     [(op, [arg, ...], [output ids])]; an arg is ("value", id), ("values", [ids])
//                  or ("attr", kind, python value) with kind as in program.proto's Attribute
//   g["outputs"]   [(value id, name, dtype, sizes)]
//   g["dims"]      [(name, input, dim, example, min, max)]
//   g["symbolic"]  [(path, constant, [(coefficient, [symbol, ...]), ...])]: the integers that
//                  depend on the dims, path as program.proto field numbers and indices (-1: not
//                  a list), as in client/export/src/symbolic.h
#include <cstring>
#include <string>

#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>

#include "kiln/error.h"
#include "kiln/proto/program.pb.h"
#include "python_args.h"

namespace kiln::python {
namespace {

nb::list int_list(const google::protobuf::RepeatedField<int64_t>& v) {
  nb::list out;
  for (int64_t x : v) out.append(x);
  return out;
}

nb::tuple attribute(const proto::Attribute& a) {
  using A = proto::Attribute;
  switch (a.kind_case()) {
    case A::kNone: return nb::make_tuple("attr", "none", nb::none());
    case A::kIntValue: return nb::make_tuple("attr", "int", a.int_value());
    case A::kFloatValue: return nb::make_tuple("attr", "float", a.float_value());
    case A::kBoolValue: return nb::make_tuple("attr", "bool", a.bool_value());
    case A::kInts: return nb::make_tuple("attr", "ints", int_list(a.ints().values()));
    case A::kStringValue: return nb::make_tuple("attr", "string", a.string_value());
    case A::kDtype: return nb::make_tuple("attr", "dtype", a.dtype());
    case A::kDevice: return nb::make_tuple("attr", "device", a.device());
    case A::kScalarInt: return nb::make_tuple("attr", "scalar_int", a.scalar_int());
    case A::kScalarFloat: return nb::make_tuple("attr", "scalar_float", a.scalar_float());
    case A::kScalarBool: return nb::make_tuple("attr", "scalar_bool", a.scalar_bool());
    default: return nb::make_tuple("attr", "none", nb::none());
  }
}

nb::dict program_graph(nb::bytes data) {
  const char* p = data.c_str();
  const size_t n = data.size();
  KILN_CHECK(n >= 64 && std::memcmp(p, "KILNPROG", 8) == 0, Value,
             "kiln.onnx: not an exported program (no KILNPROG header)");
  uint64_t plen = 0;
  std::memcpy(&plen, p + 16, 8);
  KILN_CHECK(plen <= n - 64, Value, "kiln.onnx: the exported program is truncated");
  proto::ExportedProgram m;
  KILN_CHECK(m.ParseFromArray(p + 64, static_cast<int>(plen)), Value,
             "kiln.onnx: the program part is not a kiln.proto.ExportedProgram message");
  const proto::Graph& g = m.graph();
  nb::list inputs;
  for (int i = 0; i < g.inputs_size(); ++i) {
    const proto::ExportedInput& in = m.inputs(i);
    const proto::TensorSpec& s = g.input_specs(i);
    std::string kind = in.has_argument() ? "argument" : in.has_weight() ? "weight" : "constant";
    std::string name = in.has_argument() ? in.argument() : in.has_weight() ? in.weight() : "";
    nb::object number = s.has_number() ? nb::object(attribute(s.number())[2]) : nb::none();
    inputs.append(nb::make_tuple(g.inputs(i), kind, name, s.dtype(), int_list(s.sizes()),
                                 number, int_list(s.strides()), s.offset(), s.wrapped_number()));
  }
  nb::list nodes;
  for (const proto::Instruction& ins : g.nodes()) {
    nb::list args;
    for (const proto::Argument& a : ins.args()) {
      if (a.has_value())
        args.append(nb::make_tuple("value", a.value()));
      else if (a.has_values())
        args.append(nb::make_tuple("values", int_list(a.values().ids())));
      else
        args.append(attribute(a.attribute()));
    }
    nodes.append(nb::make_tuple(ins.op(), args, int_list(ins.outputs())));
  }
  nb::list outputs;
  for (int i = 0; i < g.outputs_size(); ++i)
    outputs.append(nb::make_tuple(g.outputs(i), m.output_names(i), m.output_specs(i).dtype(),
                                  int_list(m.output_specs(i).sizes())));
  nb::list dims;
  for (const proto::SymbolicDim& d : m.dims())
    dims.append(nb::make_tuple(d.name(), d.input(), d.dim(), d.example(), d.min(), d.max()));
  nb::list symbolic;
  for (const proto::SymbolicInt& si : m.symbolic()) {
    nb::list path, terms;
    for (int32_t x : si.path()) path.append(x);
    for (const proto::SymbolicTerm& t : si.terms()) {
      nb::list syms;
      for (int32_t s : t.symbols()) syms.append(s);
      terms.append(nb::make_tuple(t.coefficient(), syms));
    }
    symbolic.append(nb::make_tuple(path, si.constant(), terms));
  }
  nb::dict out;
  out["inputs"] = inputs;
  out["nodes"] = nodes;
  out["outputs"] = outputs;
  out["dims"] = dims;
  out["symbolic"] = symbolic;
  return out;
}

}  // namespace

void bind_onnx(nb::module_& m) { m.def("_program_graph", &program_graph); }

}  // namespace kiln::python
