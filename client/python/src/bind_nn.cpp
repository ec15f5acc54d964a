// kiln._C helpers for kiln.nn: rebinding a tensor object to other data (Module.to, the
// `tensor.data = x` setter), which Python cannot do over the op bindings.
#include "python_args.h"

namespace kiln::python {

void bind_nn(nb::module_& m) {
  // self's Python object (and so every reference to it: a Module's parameter, an optimizer's
  // list) now holds `data`'s values, shape and dtype; requires_grad is kept, .grad dropped.
  m.def(
      "_set_data",
      [](nb::handle self, const Tensor& data) {
        KILN_CHECK(is_tensor(self.ptr()), Type, "_set_data: expected a Tensor, got ",
                   nb::type_name(self.type()).c_str());
        Tensor& t = unwrap(self.ptr());
        KILN_CHECK(t.is_leaf(), Runtime,
                   "_set_data: only a leaf tensor (a parameter, a buffer) can be given new data");
        const bool requires_grad = t.requires_grad();
        t = data.detach();
        if (requires_grad) t.requires_grad_(true);
      },
      nb::arg("self"), nb::arg("data"));
}

}  // namespace kiln::python
