// kiln._C's pipeline part (kiln/dist/pipelining.h): action lists, their simulation and
// timelines, stages made of Python functions, and the schedule runner.
// kiln/distributed/pipelining/__init__.py builds PyTorch's torch.distributed.pipelining on these.
//
//   acts = _C._pp_schedule("1f1b", 2, 4, 1, False)        # [[_PipelineAction, ...] per rank]
//   st = _C._PipelineStage(fwd, fwd_meta, None, None, 0, 2, group)
//   sc = _C._PipelineSchedule([st], "1f1b", 4, loss_fn, False)
//   outs, losses = sc.step([x], None, True)
//   sc = _C._PipelineSchedule(stages, "1f1b", 4, loss_fn, False, [[0], [1]])   # on a gang
// The runner calls back into Python (the stage's forward, the loss) with the GIL held.
#include <nanobind/stl/function.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include "kiln/client/connection.h"
#include "kiln/client/gang_pipeline.h"
#include "kiln/client/session.h"
#include "kiln/client/transport.h"
#include "kiln/dist/pipelining.h"
#include "python_args.h"

namespace kiln::python {
namespace {

namespace pp = kiln::dist::pipelining;
using TensorFn = std::function<std::vector<Tensor>(const std::vector<Tensor>&)>;

// A context manager: what Python records inside it is placed on these workers of a gang.
struct PyStageScope {
  std::vector<int> ranks;
  std::unique_ptr<client::StageScope> scope;
};

}  // namespace

void bind_pipelining(nb::module_& m) {
  nb::class_<pp::Action>(m, "_PipelineAction")
      .def_prop_ro("op", [](const pp::Action& a) { return std::string(pp::op_name(a.op)); })
      .def_ro("stage", &pp::Action::stage)
      .def_ro("microbatch", &pp::Action::microbatch)
      .def("__eq__", [](const pp::Action& a, const pp::Action& b) { return a == b; })
      .def("__repr__", [](const pp::Action& a) { return pp::to_string(a); });
  nb::class_<pp::TimedAction>(m, "_PipelineTimedAction")
      .def_ro("rank", &pp::TimedAction::rank)
      .def_ro("action", &pp::TimedAction::action)
      .def_ro("start", &pp::TimedAction::start)
      .def_ro("end", &pp::TimedAction::end);
  m.def("_pp_schedule", [](const std::string& kind, int pp_size, int n_microbatches,
                           int stages_per_rank, bool fsdp) {
    return pp::make_schedule(
        {pp::parse_schedule_kind(kind), pp_size, n_microbatches, stages_per_rank, fsdp});
  });
  m.def("_pp_format", &pp::format_schedule);
  m.def("_pp_simulate",
        [](const std::vector<pp::ActionList>& lists, double f, double b, double i, double w) {
          return pp::simulate(lists, pp::Costs{f, b, i, w});
        });
  m.def("_pp_bubble_fraction", &pp::bubble_fraction);
  m.def("_pp_chrome_trace", &pp::chrome_trace);

  nb::class_<pp::PipelineStage>(m, "_PipelineStage")
      .def(
          "__init__",
          [](pp::PipelineStage* self, TensorFn forward, TensorFn forward_meta,
             std::optional<std::function<void()>> unshard,
             std::optional<std::function<void()>> reshard, int stage_index, int num_stages,
             std::optional<std::shared_ptr<dist::ProcessGroup>> group, const std::string& device) {
            pp::StageFunctions fns{std::move(forward), std::move(forward_meta),
                                   unshard.value_or(nullptr), reshard.value_or(nullptr)};
            new (self) pp::PipelineStage(std::move(fns), stage_index, num_stages,
                                         group.value_or(nullptr), Device(device));
          },
          nb::arg("forward"), nb::arg("forward_meta"), nb::arg("unshard").none(),
          nb::arg("reshard").none(), nb::arg("stage_index"), nb::arg("num_stages"),
          nb::arg("group").none(), nb::arg("device") = "cpu")
      .def_prop_ro("stage_index", &pp::PipelineStage::stage_index)
      .def_prop_ro("num_stages", &pp::PipelineStage::num_stages)
      .def_prop_ro("is_first", &pp::PipelineStage::is_first)
      .def_prop_ro("is_last", &pp::PipelineStage::is_last);

  nb::class_<pp::Schedule>(m, "_PipelineSchedule")
      .def(
          "__init__",
          [](pp::Schedule* self, std::vector<pp::PipelineStage*> stages, const std::string& kind,
             int n_microbatches, std::optional<nb::object> loss_fn, bool fsdp,
             std::vector<std::vector<int>> gang_workers) {
            pp::LossFn fn;
            if (loss_fn && !loss_fn->is_none()) {
              nb::object f = *loss_fn;
              fn = [f](const std::vector<Tensor>& outs, const Tensor& target) {
                nb::object out = outs.size() == 1 ? nb::cast(outs[0]) : nb::cast(outs);
                return nb::cast<Tensor>(f(out, target));
              };
            }
            std::optional<pp::Controller> controller;
            if (!gang_workers.empty())
              controller = client::gang_controller(std::move(gang_workers));
            new (self) pp::Schedule(std::move(stages), pp::parse_schedule_kind(kind),
                                    n_microbatches, std::move(fn), fsdp, std::move(controller));
          },
          nb::arg("stages"), nb::arg("kind"), nb::arg("n_microbatches"), nb::arg("loss_fn").none(),
          nb::arg("fsdp"), nb::arg("gang_workers") = std::vector<std::vector<int>>{},
          nb::keep_alive<1, 2>())
      .def("step",
           [](pp::Schedule& s, const std::vector<Tensor>& inputs, std::optional<Tensor> target,
              bool want_losses) {
             std::vector<Tensor> losses;
             auto outs = s.step(inputs, target, want_losses ? &losses : nullptr);
             return std::make_pair(outs, losses);
           })
      .def("eval", &pp::Schedule::eval)
      .def("actions", &pp::Schedule::actions)
      .def("last_timeline", &pp::Schedule::last_timeline)
      .def("last_step_seconds", &pp::Schedule::last_step_seconds);

  // Note [Gang stages] (kiln/client/transport.h).
  nb::class_<PyStageScope>(m, "_StageScope")
      .def("__init__",
           [](PyStageScope* self, std::vector<int> ranks) {
             new (self) PyStageScope{std::move(ranks), {}};
           })
      .def("__enter__",
           [](PyStageScope& s) {
             KILN_CHECK(!s.scope, Value, "_StageScope: already entered");
             s.scope = std::make_unique<client::StageScope>(s.ranks);
           })
      .def("__exit__", [](PyStageScope& s, nb::args) { s.scope.reset(); });
  m.def("_scatter_to", [](const Tensor& t, const std::string& device, std::vector<int> ranks) {
    return client::scatter_to(t, Device(device), ranks);
  });
  m.def("_gang_size", [](const std::string& device) {
    return client::connection_for(Device(device))->transport().world_size();
  });
}

}  // namespace kiln::python
