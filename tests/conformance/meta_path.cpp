// tests/conformance/meta_path.cpp: the Meta path. The sample's tensors become data-less Meta
// tensors of the same geometry and the op's outputs must agree with eager CPU's on sizes,
// strides, storage offset, dtype and aliasing (DESIGN.md: Meta runs meta functions only).
#include <sstream>

#include "conformance/path.h"

namespace kiln::conformance {
namespace {

Tensor to_meta(const Tensor& t) {
  auto storage = Storage::create_dataless(t.impl()->storage()->nbytes(), Device(DeviceType::Meta));
  Tensor m(TensorImpl::make(storage, t.dtype(), t.sizes(), t.strides(), t.storage_offset()));
  m.impl()->set_wrapped_number(t.impl()->is_wrapped_number());
  return m;
}

IValue to_meta(const IValue& v) {
  if (v.is_tensor()) return to_meta(v.to_tensor());
  if (v.is_tensor_list()) {
    std::vector<Tensor> ts;
    for (const Tensor& t : v.to_tensor_list()) ts.push_back(to_meta(t));
    return ts;
  }
  if (v.is<Device>() && v.get<Device>().is_cpu()) return Device(DeviceType::Meta);
  return v;
}

// Index of the input tensor whose storage `t` shares, or -1.
int alias_index(const Tensor& t, const Stack& inputs) {
  for (size_t i = 0; i < inputs.size(); ++i)
    if (inputs[i].is_tensor() && inputs[i].to_tensor().is_alias_of(t)) return static_cast<int>(i);
  return -1;
}

class MetaPath : public Path {
 public:
  std::string name() const override { return "Meta"; }
  testing::Backend claims() const override { return testing::Backend::Meta; }
  DispatchKey key() const override { return DispatchKey::Meta; }
  std::string unavailable() const override { return ""; }

  Outcome run(const Case& c) const override {
    const OpInfo& info = c.op().info();
    Stack meta_in;
    for (size_t i = 0; i < c.sample.size(); ++i) {
      const bool device_arg = info.args[i].arg_type == ArgType::OptionalDevice;
      meta_in.push_back(device_arg && c.sample[i].is_none() ? IValue(Device(DeviceType::Meta))
                                                            : to_meta(c.sample[i]));
    }
    Stack meta = meta_in;
    c.op().call_boxed(meta);
    std::vector<Tensor> co = testing::outputs_of(c.cpu_out), mo = testing::outputs_of(meta);
    if (co.size() != mo.size())
      return Outcome::failed(std::to_string(mo.size()) + " outputs, eager CPU has " +
                             std::to_string(co.size()));
    for (size_t i = 0; i < co.size(); ++i) {
      std::ostringstream why;
      why << "output " << i << ": ";
      if (!mo[i].is_meta()) {
        why << "not a Meta tensor";
      } else if (co[i].sizes() != mo[i].sizes()) {
        why << "sizes " << mo[i].sizes() << ", eager CPU " << co[i].sizes();
      } else if (co[i].dtype() != mo[i].dtype()) {
        why << "dtype " << scalar_type_name(mo[i].dtype()) << ", eager CPU "
            << scalar_type_name(co[i].dtype());
      } else if (co[i].numel() > 1 && co[i].strides() != mo[i].strides()) {
        why << "strides " << mo[i].strides() << ", eager CPU " << co[i].strides();
      } else if (co[i].storage_offset() != mo[i].storage_offset()) {
        why << "storage offset " << mo[i].storage_offset() << ", eager CPU "
            << co[i].storage_offset();
      } else if (alias_index(co[i], c.cpu_in) != alias_index(mo[i], meta_in)) {
        why << "aliases input " << alias_index(mo[i], meta_in) << ", eager CPU's aliases input "
            << alias_index(co[i], c.cpu_in);
      } else {
        continue;
      }
      return Outcome::failed(why.str());
    }
    return Outcome::ok();
  }
};

}  // namespace

KILN_CONFORMANCE_PATH(MetaPath);

}  // namespace kiln::conformance
