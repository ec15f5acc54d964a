// kiln_gpu_bench: bandwidth of Kiln's CUDA add, mul, gelu and host<->device copies, as JSON lines
// {"workload","metric","value","unit","impl":"kiln"} (scripts/gpu-check prints PyTorch's next
// to them). Exits 0 with a note on stderr when no GPU is present.
//
//   build-gpu/bin/kiln_gpu_bench            # add_16M, mul_16M, gelu_16M, h2d_64M, d2h_64M (pinned)
#include <algorithm>
#include <cstdio>
#include <vector>

#include "kiln/cuda/device.h"
#include "kiln/cuda/pinned.h"
#include "kiln/cuda/stream.h"
#include "kiln/kiln.h"

using namespace kiln;

namespace {

// Median milliseconds of `reps` timed runs of f (after warm-up), timed with CUDA events.
template <typename F>
double median_ms(int reps, F f) {
  for (int i = 0; i < 3; ++i) f();
  cuda::getCurrentStream().synchronize();
  std::vector<double> ms;
  for (int i = 0; i < reps; ++i) {
    cuda::Event a(true), b(true);
    a.record();
    f();
    b.record();
    b.synchronize();
    ms.push_back(a.elapsed_time(b));
  }
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

void emit(const char* workload, const char* metric, double value, const char* unit) {
  std::printf("{\"workload\": \"%s\", \"metric\": \"%s\", \"value\": %.3f, \"unit\": \"%s\", \"impl\": \"kiln\"}\n",
              workload, metric, value, unit);
}

}  // namespace

int main() {
  if (!cuda::is_available()) {
    std::fprintf(stderr, "kiln_gpu_bench: no CUDA device; nothing measured\n");
    return 0;
  }
  const Device dev("cuda");
  {
    const int64_t n = int64_t{1} << 24;  // add_16M: c = a + b, float32, 3 * 64 MiB moved
    Tensor a = kiln::ones({n}, kFloat32, dev), b = kiln::ones({n}, kFloat32, dev);
    Tensor c = kiln::empty({n}, kFloat32, dev);
    double ms = median_ms(50, [&] { kiln::add_out(c, a, b); });
    emit("add_16M", "bandwidth", 3.0 * n * 4 / (ms * 1e-3) / 1e9, "GB/s");
    emit("add_16M", "time", ms * 1e3, "us");
  }
  {
    const int64_t n = int64_t{1} << 24;  // mul_16M: c = a * b, float32, 3 * 64 MiB moved
    Tensor a = kiln::full({n}, 1.5, kFloat32, dev), b = kiln::full({n}, 0.5, kFloat32, dev);
    Tensor c = kiln::empty({n}, kFloat32, dev);
    double ms = median_ms(50, [&] { kiln::mul_out(c, a, b); });
    emit("mul_16M", "bandwidth", 3.0 * n * 4 / (ms * 1e-3) / 1e9, "GB/s");
    emit("mul_16M", "time", ms * 1e3, "us");
  }
  {
    const int64_t n = int64_t{1} << 24;  // gelu_16M: y = gelu(x) (erf form), float32, 2 * 64 MiB moved
    Tensor x = kiln::linspace(-4, 4, n, kFloat32, dev), y = kiln::empty({n}, kFloat32, dev);
    double ms = median_ms(50, [&] { kiln::gelu_out(y, x); });
    emit("gelu_16M", "bandwidth", 2.0 * n * 4 / (ms * 1e-3) / 1e9, "GB/s");
    emit("gelu_16M", "time", ms * 1e3, "us");
  }
  {
    const int64_t bytes = int64_t{64} << 20;  // 64 MiB pinned <-> device
    Tensor h = cuda::pinned_empty({bytes}, kUInt8);
    Tensor d = kiln::empty({bytes}, kUInt8, dev);
    double h2d = median_ms(20, [&] { d.copy_(h, true); });
    emit("h2d_64M", "bandwidth", bytes / (h2d * 1e-3) / 1e9, "GB/s");
    double d2h = median_ms(20, [&] { h.copy_(d, true); });
    emit("d2h_64M", "bandwidth", bytes / (d2h * 1e-3) / 1e9, "GB/s");
  }
  return 0;
}
