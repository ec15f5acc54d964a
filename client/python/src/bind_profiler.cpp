// kiln._C's profiler (kiln/profiler.h). kiln/profiler/__init__.py builds PyTorch's
// kiln.profiler.profile / schedule / record_function on these.
//
//   p = _C._Profile(record_shapes=True, profile_memory=False, with_flops=True,
//                   schedule=_C._Schedule(1, 1, 2, 1, 0), on_trace_ready=None)
//   p.start(); ...; p.step(); p.stop(); print(p.key_averages(False).table("cpu_time_total", 10))
#include <nanobind/stl/function.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include "kiln/profiler.h"
#include "python_args.h"

namespace kiln::python {
namespace {

namespace prof = kiln::profiler;

// A record_function range whose begin and end are separate Python calls (__enter__/__exit__).
struct RecordRange {
  std::string name;
  std::optional<prof::RecordFunction> range;
};

}  // namespace

void bind_profiler(nb::module_& m) {
  nb::enum_<prof::ProfilerActivity>(m, "_ProfilerActivity")
      .value("CPU", prof::ProfilerActivity::CPU)
      .value("CUDA", prof::ProfilerActivity::CUDA);
  nb::enum_<prof::ProfilerAction>(m, "_ProfilerAction")
      .value("NONE", prof::ProfilerAction::None)
      .value("WARMUP", prof::ProfilerAction::Warmup)
      .value("RECORD", prof::ProfilerAction::Record)
      .value("RECORD_AND_SAVE", prof::ProfilerAction::RecordAndSave);

  nb::class_<prof::Schedule>(m, "_Schedule")
      .def(nb::init<int64_t, int64_t, int64_t, int64_t, int64_t>(), nb::arg("wait"),
           nb::arg("warmup"), nb::arg("active"), nb::arg("repeat") = 0, nb::arg("skip_first") = 0)
      .def("__call__", &prof::Schedule::operator(), nb::arg("step"))
      .def_ro("wait", &prof::Schedule::wait)
      .def_ro("warmup", &prof::Schedule::warmup)
      .def_ro("active", &prof::Schedule::active)
      .def_ro("repeat", &prof::Schedule::repeat)
      .def_ro("skip_first", &prof::Schedule::skip_first);

  nb::class_<prof::FunctionEventAvg>(m, "_FunctionEventAvg")
      .def_ro("key", &prof::FunctionEventAvg::key)
      .def_ro("count", &prof::FunctionEventAvg::count)
      .def_ro("input_shapes", &prof::FunctionEventAvg::input_shapes)
      .def_ro("flops", &prof::FunctionEventAvg::flops)
      .def_ro("bytes", &prof::FunctionEventAvg::bytes)
      .def_ro("cpu_memory_usage", &prof::FunctionEventAvg::cpu_memory_usage)
      .def_ro("self_cpu_memory_usage", &prof::FunctionEventAvg::self_cpu_memory_usage)
      // Times in microseconds, as PyTorch's FunctionEventAvg.
      .def_prop_ro("cpu_time_total",
                   [](const prof::FunctionEventAvg& r) { return r.cpu_time_total_ns / 1e3; })
      .def_prop_ro("self_cpu_time_total",
                   [](const prof::FunctionEventAvg& r) { return r.self_cpu_time_total_ns / 1e3; })
      .def_prop_ro("cpu_time", &prof::FunctionEventAvg::cpu_time_avg_us)
      .def("__repr__", [](const prof::FunctionEventAvg& r) {
        return "<FunctionEventAvg key=" + r.key + " count=" + std::to_string(r.count) +
               " cpu_time_total=" + std::to_string(r.cpu_time_total_ns / 1e3) + "us>";
      });

  nb::class_<prof::KeyAverages>(m, "_KeyAverages")
      .def(
          "table",
          [](const prof::KeyAverages& k, std::optional<std::string> sort_by,
             std::optional<int64_t> row_limit) {
            return k.table(sort_by.value_or(""), row_limit.value_or(-1));
          },
          nb::arg("sort_by").none() = nb::none(), nb::arg("row_limit").none() = 100)
      .def("__len__", [](const prof::KeyAverages& k) { return k.rows.size(); })
      .def(
          "__getitem__",
          [](const prof::KeyAverages& k, int64_t i) {
            int64_t n = static_cast<int64_t>(k.rows.size());
            if (i < 0) i += n;
            KILN_CHECK(i >= 0 && i < n, Index, "key_averages index ", i, " out of range for ", n,
                       " rows");
            return k.rows[i];
          },
          nb::arg("index"))
      .def("__str__", [](const prof::KeyAverages& k) { return k.table(); });

  nb::class_<prof::Profile>(m, "_Profile")
      .def(
          "__init__",
          [](prof::Profile* self, std::vector<prof::ProfilerActivity> activities,
             nb::object schedule, nb::object on_trace_ready, bool record_shapes,
             bool profile_memory, bool with_flops) {
            prof::ProfilerOptions o;
            o.activities = std::move(activities);
            o.record_shapes = record_shapes;
            o.profile_memory = profile_memory;
            o.with_flops = with_flops;
            if (!schedule.is_none()) {
              KILN_CHECK(PyCallable_Check(schedule.ptr()), Type,
                         "profile: schedule must be callable (step -> ProfilerAction), got ",
                         Py_TYPE(schedule.ptr())->tp_name);
              o.schedule = [schedule](int64_t step) {
                nb::gil_scoped_acquire gil;
                nb::object a = schedule(step);
                KILN_CHECK(nb::isinstance<prof::ProfilerAction>(a), Type,
                           "profile: the schedule must return a ProfilerAction, got ",
                           Py_TYPE(a.ptr())->tp_name, " for step ", step);
                return nb::cast<prof::ProfilerAction>(a);
              };
            }
            if (!on_trace_ready.is_none()) {
              KILN_CHECK(PyCallable_Check(on_trace_ready.ptr()), Type,
                         "profile: on_trace_ready must be callable, got ",
                         Py_TYPE(on_trace_ready.ptr())->tp_name);
              o.on_trace_ready = [on_trace_ready](prof::Profile&) {
                nb::gil_scoped_acquire gil;
                on_trace_ready();
              };
            }
            new (self) prof::Profile(std::move(o));
          },
          nb::arg("activities"), nb::arg("schedule").none(), nb::arg("on_trace_ready").none(),
          nb::arg("record_shapes"), nb::arg("profile_memory"), nb::arg("with_flops"))
      .def("start", &prof::Profile::start)
      .def("stop", &prof::Profile::stop)
      .def("step", &prof::Profile::step)
      .def_prop_ro("step_num", &prof::Profile::step_num)
      .def_prop_ro("running", &prof::Profile::running)
      .def_prop_ro("current_action", &prof::Profile::current_action)
      .def("key_averages", &prof::Profile::key_averages, nb::arg("group_by_input_shape") = false)
      .def("export_chrome_trace", &prof::Profile::export_chrome_trace, nb::arg("path"));

  nb::class_<RecordRange>(m, "_RecordRange")
      .def(nb::init<std::string>(), nb::arg("name"))
      .def("enter", [](RecordRange& r) { r.range.emplace(r.name); })
      .def("exit", [](RecordRange& r) { r.range.reset(); });
}

}  // namespace kiln::python
