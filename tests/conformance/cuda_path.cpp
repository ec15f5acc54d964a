// tests/conformance/cuda_path.cpp: the CUDA path (builds with kiln_kernels_cuda). The sample is
// copied to the GPU with its layout, the op runs there, and its outputs must equal eager CPU's:
// floating values within two units in the last place of the dtype, integers and bool exactly,
// random ops bit for bit under the same seed (Note [Counter-based RNG] in kiln/generator.h).
// Without a device the claims are still checked against the registered CUDA kernels.
#include "conformance/path.h"
#include "kiln/cuda/device.h"

namespace kiln::conformance {
namespace {

class CudaPath : public Path {
 public:
  std::string name() const override { return "CUDA"; }
  testing::Backend claims() const override { return testing::Backend::CUDA; }
  DispatchKey key() const override { return DispatchKey::CUDA; }
  std::string unavailable() const override { return cuda::is_available() ? "" : "no CUDA device"; }
  Outcome run(const Case& c) const override { return run_on_device(c, Device("cuda")); }
};

}  // namespace

KILN_CONFORMANCE_PATH(CudaPath);

}  // namespace kiln::conformance
