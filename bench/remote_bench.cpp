// kiln_remote_bench: the `remote` workloads of shared/bench/WORKLOADS.md, against a kiln-worker
// it starts on loopback (127.0.0.1:0, --port-file). JSON lines as kiln_bench prints them:
//   tiny_ops_per_s   1-element adds recorded by the client and run by the worker, end to end
//                    (a final sync included)
//   fetch_roundtrip  one item() on a remote value (flush, Fetch, reply)
//   mlp_step_remote  the mlp_train step (784-1024-1024-10, AdamW, batch 512, loss read) with
//                    the model on the worker; mlp_step_local is the same step in this process,
//                    timed alternately in the same run (target: remote <= 1.2x local)
//   grpc_pingpong    reference (impl "grpc-pingpong"): the same stream round trip with nothing
//                    behind it, against an echo server this binary runs as a second process
//                    (`--echo-server PORTFILE`), measured in the same run as fetch_roundtrip
//   kiln_remote_bench [--quick]
#include <grpcpp/grpcpp.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <thread>

#include "kiln/client/session.h"
#include "kiln/kiln.h"
#include "kiln/nn/nn.h"
#include "kiln/optim/optim.h"
#include "kiln/proto/service.h"
#include "kiln/proto/worker.grpc.pb.h"

using namespace kiln;
using Clock = std::chrono::steady_clock;

namespace {

void emit(const std::string& metric, double value, const char* unit) {
  std::printf(
      "{\"workload\": \"remote\", \"metric\": \"%s\", \"value\": %.4f, \"unit\": \"%s\", "
      "\"impl\": \"kiln-cpp\"}\n",
      metric.c_str(), value, unit);
  std::fflush(stdout);
}

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// A server process (kiln-worker, or this binary as the echo server) on a free loopback port;
// killed when this process is done with it.
struct Worker {
  pid_t pid = -1;
  std::string address;
  std::filesystem::path port_file;
  explicit Worker(bool echo = false) {
    port_file = std::filesystem::temp_directory_path() /
                ("kiln_remote_bench_" + std::to_string(getpid()) + (echo ? ".echo" : ".port"));
    std::filesystem::remove(port_file);
    pid = fork();
    if (pid == 0) {
      if (echo)
        execl("/proc/self/exe", "kiln_remote_bench", "--echo-server", port_file.c_str(),
              static_cast<char*>(nullptr));
      else
        execl(KILN_WORKER_BIN, KILN_WORKER_BIN, "--listen", "127.0.0.1:0", "--port-file",
              port_file.c_str(), static_cast<char*>(nullptr));
      _exit(127);
    }
    auto deadline = Clock::now() + std::chrono::seconds(20);
    while (Clock::now() < deadline) {
      std::ifstream f(port_file);
      int port = 0;
      if (f >> port && port > 0) {
        address = "127.0.0.1:" + std::to_string(port);
        return;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    KILN_FAIL(Runtime, "kiln-worker did not start within 20 s");
  }
  ~Worker() {
    kill(pid, SIGTERM);
    waitpid(pid, nullptr, 0);
    std::filesystem::remove(port_file);
  }
};

void tiny_ops(Device dev, const client::Session& s, bool quick) {
  Tensor x = ones({1}).to(std::nullopt, dev);
  const int n = quick ? 20000 : 200000;
  double best = 1e30;
  for (int rep = 0; rep < 3; ++rep) {
    auto t0 = Clock::now();
    for (int i = 0; i < n; ++i) Tensor y = x + x;
    s.sync();
    best = std::min(best, seconds_since(t0));
  }
  emit("tiny_ops_per_s", n / best, "ops/s");
}

void fetch_roundtrip(Device dev, bool quick) {
  Tensor x = ones({1}).to(std::nullopt, dev);
  (void)x.item<float>();
  const int n = quick ? 200 : 2000;
  double best = 1e30;
  for (int rep = 0; rep < 5; ++rep) {
    auto t0 = Clock::now();
    for (int i = 0; i < n; ++i) (void)x.item<float>();
    best = std::min(best, seconds_since(t0) / n);
  }
  emit("fetch_roundtrip", best * 1e6, "us");
}

// The echo server: Worker.Session answering each batch's Sync at once, through the same
// synchronous server API as kiln-worker, with nothing executed.
struct Echo final : proto::Worker::Service {
  grpc::Status Session(
      grpc::ServerContext*,
      grpc::ServerReaderWriter<proto::WorkerMessage, proto::ClientMessage>* s) override {
    proto::ClientMessage in;
    proto::WorkerMessage out;
    while (s->Read(&in))
      for (const auto& c : in.batch().commands())
        if (c.has_sync()) {
          out.mutable_sync()->set_request(c.sync().request());
          s->Write(out);
        }
    return grpc::Status::OK;
  }
};

int echo_server(const char* port_file) {
  Echo echo;
  grpc::ServerBuilder b;
  int port = 0;
  b.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  b.RegisterService(&echo);
  std::unique_ptr<grpc::Server> server = b.BuildAndStart();
  std::ofstream(port_file) << port << "\n";
  server->Wait();  // until SIGTERM ends the process
  return 0;
}

void grpc_pingpong(bool quick) {
  Worker echo(/*echo=*/true);
  auto channel = grpc::CreateChannel(echo.address, grpc::InsecureChannelCredentials());
  auto stub = proto::Worker::NewStub(channel);
  grpc::ClientContext ctx;
  auto stream = stub->Session(&ctx);
  proto::ClientMessage msg;
  proto::WorkerMessage reply;
  auto roundtrip = [&](uint64_t i) {
    msg.mutable_batch()->Clear();
    msg.mutable_batch()->add_commands()->mutable_sync()->set_request(i);
    KILN_CHECK(stream->Write(msg) && stream->Read(&reply) && reply.sync().request() == i, Runtime,
               "the echo server broke the stream");
  };
  roundtrip(0);
  const int n = quick ? 200 : 2000;
  double best = 1e30;
  for (int rep = 0; rep < 5; ++rep) {
    auto t0 = Clock::now();
    for (int i = 0; i < n; ++i) roundtrip(i);
    best = std::min(best, seconds_since(t0) / n);
  }
  stream->WritesDone();
  ctx.TryCancel();
  stream->Finish();
  std::printf(
      "{\"workload\": \"remote\", \"metric\": \"fetch_roundtrip\", \"value\": %.4f, "
      "\"unit\": \"us\", \"impl\": \"grpc-pingpong\"}\n",
      best * 1e6);
  std::fflush(stdout);
}

struct MlpRun {
  std::shared_ptr<nn::Sequential> m;
  std::unique_ptr<optim::AdamW> opt;
  Tensor x, y;
  explicit MlpRun(Device dev) {
    manual_seed(0);
    m = std::make_shared<nn::Sequential>(std::vector<nn::ModulePtr>{
        std::make_shared<nn::Linear>(784, 1024), std::make_shared<nn::ReLU>(),
        std::make_shared<nn::Linear>(1024, 1024), std::make_shared<nn::ReLU>(),
        std::make_shared<nn::Linear>(1024, 10)});
    m->to(dev);
    opt = std::make_unique<optim::AdamW>(m->parameters(), optim::AdamWOptions{.lr = 1e-3});
    x = randn({512, 784}).to(std::nullopt, dev);
    y = randint(0, 10, {512}).to(std::nullopt, dev);
  }
  void step() {
    opt->zero_grad();
    Tensor loss = cross_entropy(m->forward(x), y);
    loss.backward();
    opt->step();
    (void)loss.item<float>();
  }
};

void mlp_step(Device dev, bool quick) {
  MlpRun local(kCPU), remote(dev);
  local.step();
  remote.step();
  double tl = 1e30, tr = 1e30;
  for (int rep = 0; rep < (quick ? 3 : 10); ++rep) {
    auto t0 = Clock::now();
    local.step();
    tl = std::min(tl, seconds_since(t0));
    t0 = Clock::now();
    remote.step();
    tr = std::min(tr, seconds_since(t0));
  }
  emit("mlp_step_remote", tr * 1e3, "ms/step");
  emit("mlp_step_local", tl * 1e3, "ms/step");
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 3 && std::string(argv[1]) == "--echo-server") return echo_server(argv[2]);
  bool quick = argc > 1 && std::string(argv[1]) == "--quick";
  Worker w;
  client::Session s = client::connect(w.address);
  Device dev = s.device();
  tiny_ops(dev, s, quick);
  fetch_roundtrip(dev, quick);
  grpc_pingpong(quick);
  mlp_step(dev, quick);
  s.close();
  return 0;
}
