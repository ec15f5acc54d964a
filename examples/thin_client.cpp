// examples/thin_client.cpp: the thin client's smallest training program. It builds in the full
// build and in the client-only one (cmake -DKILN_CLIENT_ONLY=ON: no CPU or CUDA kernels, no
// oneDNN, no UCX), where every op must run on a worker: the default device is the session's, so
// the MLP's parameters, the data and the optimizer state are all made there, and only the losses
// come back. Both builds print the same losses against the same worker.
//
//   build/bin/kiln-worker --listen 127.0.0.1:5000 &
//   build-client/bin/thin_client 127.0.0.1:5000 [steps]
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>

#include "kiln/client/session.h"
#include "kiln/default_device.h"
#include "kiln/kiln.h"
#include "kiln/nn/nn.h"
#include "kiln/optim/optim.h"

int main(int argc, char** argv) {
  if (argc < 2 || argc > 3) {
    std::fprintf(stderr, "usage: thin_client WORKER_ADDRESS [STEPS]\n");
    return 2;
  }
  const int steps = argc == 3 ? std::atoi(argv[2]) : 5;
  try {
    kiln::client::Session session = kiln::client::connect(argv[1]);
    kiln::set_default_device(session.device());
    kiln::manual_seed(0);
    auto model = std::make_shared<kiln::nn::Sequential>(std::vector<kiln::nn::ModulePtr>{
        std::make_shared<kiln::nn::Linear>(784, 256), std::make_shared<kiln::nn::ReLU>(),
        std::make_shared<kiln::nn::Linear>(256, 10)});
    kiln::optim::AdamW opt(model->parameters(), {.lr = 1e-3});
    const kiln::Tensor x = kiln::randn({512, 784});
    const kiln::Tensor y = kiln::randint(0, 10, {512});
    for (int step = 1; step <= steps; ++step) {
      kiln::Tensor loss = kiln::cross_entropy(model->forward(x), y);
      opt.zero_grad();
      loss.backward();
      opt.step();
      std::printf("step %d loss %.6f\n", step, loss.item<float>());
    }
    session.close();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "thin_client: %s\n", e.what());
    return 1;
  }
  return 0;
}
