// kiln._C's remote part (kiln/client/session.h): connecting to workers, and the call-site
// provider that makes remote errors name the Python line that recorded the failed op.
// kiln/remote.py builds kiln.connect and kiln.Session on these.
//
//   s = _C._connect("127.0.0.1:5000", 1, "", 0)   # or "inproc"
//   s.device(); s.scatter(batch); s.all_reduce_gradients(params); s.sync(); s.close()
// Connecting, syncing and closing release the GIL: they wait on the network.
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <cstring>
#include <string>

#include "kiln/client/session.h"
#include "python_args.h"

namespace kiln::python {
namespace {

using Release = nb::call_guard<nb::gil_scoped_release>;

// Frames whose file starts with this prefix are the kiln package's own (Note [Call sites]).
std::string g_package_prefix;

// "file.py:LINE in func" of the innermost frame outside the kiln package. Called by the Remote
// backend while it records an op, with its connection's lock held: a thread that does not hold
// the GIL gets "" rather than waiting for it (the GIL's holder may be waiting for that lock).
std::string python_call_site() {
  if (!Py_IsInitialized() || !PyGILState_Check()) return {};
  PyFrameObject* f = PyEval_GetFrame();
  Py_XINCREF(f);
  std::string site;
  while (f != nullptr) {
    PyCodeObject* code = PyFrame_GetCode(f);
    const char* file = PyUnicode_AsUTF8(code->co_filename);
    if (file != nullptr &&
        (g_package_prefix.empty() ||
         std::strncmp(file, g_package_prefix.data(), g_package_prefix.size()) != 0)) {
      const char* slash = std::strrchr(file, '/');
      const char* name = PyUnicode_AsUTF8(code->co_name);
      site = std::string(slash ? slash + 1 : file) + ":" +
             std::to_string(PyFrame_GetLineNumber(f)) + " in " + (name ? name : "?");
      Py_DECREF(code);
      Py_DECREF(f);
      break;
    }
    Py_DECREF(code);
    PyFrameObject* back = PyFrame_GetBack(f);
    Py_DECREF(f);
    f = back;
  }
  PyErr_Clear();  // a failed UTF-8 conversion leaves no error behind
  return site;
}

}  // namespace

void bind_remote(nb::module_& m) {
  using client::Session;
  nb::class_<Session>(m, "_Session")
      .def("device", &Session::device)
      .def("world_size", &Session::world_size)
      .def("session_id", &Session::session_id)
      // These record (the call-site provider needs the GIL): they keep it.
      .def("scatter", &Session::scatter, nb::arg("tensor"))
      .def("all_reduce_gradients", &Session::all_reduce_gradients, nb::arg("params"))
      .def(
          "log_step",
          [](const Session& s, std::optional<Tensor> loss, double tokens) {
            s.log_step(loss.value_or(Tensor()), tokens);
          },
          nb::arg("loss").none(), nb::arg("tokens"))
      .def("sync", &Session::sync, Release())
      .def("close", &Session::close, Release());

  m.def(
      "_connect",
      [](const std::string& address, int workers, const std::string& token, uint32_t wait_ms) {
        return client::connect(address, {.workers = workers, .token = token, .wait_ms = wait_ms});
      },
      nb::arg("address"), nb::arg("workers"), nb::arg("token"), nb::arg("wait_ms"), Release());
  // Installs the call-site provider; `prefix` is the kiln package's directory (its frames are
  // skipped). Recording remote ops is the only caller, so eager ops never pay for it.
  m.def(
      "_set_call_site_package",
      [](const std::string& prefix) {
        g_package_prefix = prefix;
        client::set_call_site_provider(&python_call_site);
      },
      nb::arg("prefix"));
}

}  // namespace kiln::python
