// tests/conformance/path.h: an execution path of the conformance driver (Meta, CUDA, Remote,
// Batched; DTensor and compiled graphs next). A path is one small file:
//
//   class MetaPath : public Path {
//     std::string name() const override { return "Meta"; }
//     testing::Backend claims() const override { return testing::Backend::Meta; }
//     DispatchKey key() const override { return DispatchKey::Meta; }
//     std::string unavailable() const override { return ""; }       // runs everywhere
//     Outcome run(const Case& c) const override { ... compare with c.cpu_out ... }
//   };
//   KILN_CONFORMANCE_PATH(MetaPath);
//
// The driver (driver.h) calls run() for every op, every sample and every dtype the row claims
// for the path's backend, after running the same sample on eager CPU. See Note [Conformance].
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "samples/manifest.h"
#include "samples/util.h"

namespace kiln::conformance {

// A cell of the support matrix (op x path x dtype), and the outcome of one sample.
enum class Status {
  NotClaimed,  // the row does not list the dtype for the path's backend
  Missing,     // claimed, but no kernel (nothing registered, or running raised NotImplemented /
               // "dtype ... is not supported")
  Failed,      // ran and disagreed with eager CPU
  Untested,    // claimed with a kernel, but nothing ran here (no device, or no sample in it)
  Ok,          // ran and agreed
};
const char* status_name(Status s);

struct Outcome {
  Status status = Status::Ok;
  std::string detail;       // why, for Missing and Failed
  bool documented = false;  // Untested for a reason of Note [Untested cells]
  static Outcome ok() { return {}; }
  static Outcome failed(std::string why) { return {Status::Failed, std::move(why)}; }
  static Outcome missing(std::string why) { return {Status::Missing, std::move(why)}; }
  static Outcome skipped(std::string why) { return {Status::Untested, std::move(why)}; }
  static Outcome nothing_to_compare(std::string why) {
    return {Status::Untested, std::move(why), true};
  }
  static Outcome failed_unless(std::string why) {
    return why.empty() ? ok() : failed(std::move(why));
  }
};

// One op on one sample in one dtype, and what eager CPU made of it.
struct Case {
  const testing::ManifestRow& row;
  const Stack& sample;  // in `dtype` (Note [Sample dtypes]), this path's own copy
  ScalarType dtype;
  int index;             // the sample's position among the op's samples
  const Stack& cpu_in;   // the copy of `sample` eager CPU ran on (mutated by in-place ops)
  const Stack& cpu_out;  // the stack after the CPU call: its outputs
  uint64_t seed;         // random ops: the seed CPU ran under (manual_seed) before the call
  std::string where;     // "sample 2" or "sample 2 (non-contiguous)": the index among the op's
                         // written samples

  const OperatorHandle& op() const { return *row.op; }
  bool random() const { return row.op->info().is_random; }
};

class Path {
 public:
  virtual ~Path() = default;
  virtual std::string name() const = 0;
  // Whose dtype claims the path checks: CUDA's, Meta's; the CPU ones for paths that run CPU
  // kernels underneath (Remote's worker, Batched).
  virtual testing::Backend claims() const = 0;
  // The dispatch key whose kernels the path runs: a claim without one is Missing.
  virtual DispatchKey key() const = 0;
  // Empty when the path can run here; otherwise why not ("no CUDA device").
  virtual std::string unavailable() const = 0;
  virtual Outcome run(const Case& c) const = 0;
};

// Where a tensor of a sample sits: argument index, and list member (-1 for a Tensor argument).
struct Slot {
  int arg;
  int member;
};
inline Tensor get(const Stack& s, const Slot& slot) {
  return slot.member < 0 ? s[slot.arg].to_tensor() : s[slot.arg].to_tensor_list()[slot.member];
}
inline void put(Stack& s, const Slot& slot, const Tensor& t) {
  if (slot.member < 0) {
    s[slot.arg] = t;
    return;
  }
  std::vector<Tensor> ts = s[slot.arg].to_tensor_list();
  ts[slot.member] = t;
  s[slot.arg] = ts;
}

void register_path(std::unique_ptr<Path> p);
const std::vector<std::unique_ptr<Path>>& paths();

// The outputs of a path against eager CPU's: "" when they agree. Values within the dtype's
// tolerance, integers and bool exact; `exact` for random ops (bit-identical for the same seed).
std::string compare_values(const std::vector<Tensor>& got, const std::vector<Tensor>& want,
                           bool exact);

// A copy of `t` on `device` with the same sizes and strides (a wrapped number stays on CPU);
// for a stack, generators are copied too (testing::copy_generator).
Tensor to_device(const Tensor& t, Device device);
Stack to_device(const Stack& s, Device device, const OpInfo& info);

// The case's sample run on `device` (tensors copied there with their layout, wrapped numbers
// left on CPU, a CPU or absent Device argument made `device`) under the seed eager CPU ran with,
// and its outputs' values compared with eager CPU's (compare_values; random ops exact; the
// uninitialized values of empty* only by shape and dtype).
Outcome run_on_device(const Case& c, Device device);

// Classifies an error a path raised on a sample eager CPU ran: an output shape that depends on
// values the path does not have (Note [Data-dependent shapes] in tensor/src/meta/indexing.cpp:
// Meta, Remote) leaves nothing to compare; NotImplemented and unsupported dtypes are Missing
// kernels; anything else is a failure.
Outcome outcome_of_error(const std::string& path, const Error& e);

}  // namespace kiln::conformance

#define KILN_CONFORMANCE_PATH(T)                                      \
  static const int KILN_CONCAT(kiln_conformance_path_, __COUNTER__) = \
      (::kiln::conformance::register_path(std::make_unique<T>()), 0)
