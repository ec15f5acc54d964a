// kiln._C's file I/O: safetensors files (kiln/safetensors.h) and atomic training checkpoints
// (kiln/nn/checkpoint.h). kiln/serialization.py builds kiln.save / kiln.load on these; no pickle.
//
//   _C._save_safetensors("w.safetensors", {"fc.weight": w}, {"step": "3"})
//   tensors, metadata = _C._load_safetensors("w.safetensors")
#include <nanobind/stl/map.h>
#include <nanobind/stl/string.h>

#include "kiln/nn/checkpoint.h"
#include "kiln/safetensors.h"
#include "python_args.h"

namespace kiln::python {
namespace {

TensorMap tensor_map(nb::handle d, const char* what) {
  KILN_CHECK(PyDict_Check(d.ptr()), Type, what, ": expected a dict of str -> Tensor, got ",
             Py_TYPE(d.ptr())->tp_name);
  TensorMap out;
  for (auto [k, v] : nb::borrow<nb::dict>(d)) {
    KILN_CHECK(PyUnicode_Check(k.ptr()), Type, what, ": keys must be str, got ",
               Py_TYPE(k.ptr())->tp_name);
    std::string key = nb::cast<std::string>(k);
    KILN_CHECK(is_tensor(v.ptr()), Type, what, ": the value of '", key, "' must be a Tensor, got ",
               Py_TYPE(v.ptr())->tp_name);
    out.emplace(std::move(key), unwrap(v.ptr()));
  }
  return out;
}

nb::dict to_dict(const TensorMap& m) {
  nb::dict d;
  for (const auto& [k, t] : m) d[nb::str(k.c_str(), k.size())] = nb::steal(wrap(t));
  return d;
}

}  // namespace

void bind_io(nb::module_& m) {
  m.def("_save_safetensors",
        [](const std::string& path, nb::handle tensors, const StringMap& metadata) {
          save_safetensors(path, tensor_map(tensors, "save"), metadata);
        });
  m.def("_load_safetensors", [](const std::string& path) {
    SafetensorsData d = load_safetensors(path);
    return nb::make_tuple(to_dict(d.tensors), d.metadata);
  });
  m.def("_save_checkpoint",
        [](const std::string& dir, nb::handle groups, const std::string& metadata) {
          nn::Checkpoint c;
          for (auto [k, v] : nb::borrow<nb::dict>(groups))
            c.groups[nb::cast<std::string>(k)] = tensor_map(v, "save");
          c.metadata = metadata;
          nn::save_checkpoint(dir, c);
        });
  m.def("_load_checkpoint", [](const std::string& dir) {
    nn::Checkpoint c = nn::load_checkpoint(dir);
    nb::dict groups;
    for (const auto& [name, tensors] : c.groups) groups[name.c_str()] = to_dict(tensors);
    return nb::make_tuple(groups, c.metadata);
  });
  m.def("_has_checkpoint", &nn::has_checkpoint);
}

}  // namespace kiln::python
