// tests/golden/digits_parity_gen.cpp: PyTorch's (libtorch C++ API) run of examples/digits' two
// models, which tests/nn/digits_parity_test.cpp repeats in Kiln. Built and run by
// make_digits_parity.sh; CI never runs it (the committed files are what the test reads).
//
// Input: the raw digits (scikit-learn's load_digits: pixels.u8, 1797 x 64 values 0..16, and
// labels.u8), exported by the script. Output, into the directory given:
//   digits_parity_data.safetensors  "pixels" U8 (1797, 64), "labels" I64 (1797); x = pixels / 16
//   digits_parity_mlp.safetensors   the MLP's initial weights (keys = Kiln's state-dict keys)
//   digits_parity_cnn.safetensors   the CNN's initial weights
//   digits_parity.bin               (golden_writer.h format)
//     "train_batches" (N, 32): the example indices of each step's batch
//     "heldout" (360): the held-out example indices
//     "<model>.losses" (N): the training loss of each step, before its optimizer update
//     "<model>.heldout_loss" (1): the held-out loss after N steps
// Settings as examples/digits/models.h: AdamW(lr 2e-3, weight decay 1e-4), batch 32, float32,
// weights from PyTorch's default init after manual_seed(0) (MLP first, then the CNN).
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "golden_writer.h"

namespace {

constexpr int64_t kImages = 1797, kPixels = 64, kBatch = 32, kSteps = 150;

std::vector<uint8_t> read_bytes(const std::string& path, size_t n) {
  std::vector<uint8_t> out(n);
  std::ifstream in(path, std::ios::binary);
  in.read(reinterpret_cast<char*>(out.data()), n);
  if (!in || in.peek() != EOF) {
    std::fprintf(stderr, "%s: expected exactly %zu bytes\n", path.c_str(), n);
    std::exit(1);
  }
  return out;
}

// The safetensors format by hand: 8-byte little-endian header length, a JSON header (padded with
// spaces to a multiple of 8), then each tensor's raw little-endian bytes in key order.
void save_safetensors(const std::string& path, const std::map<std::string, torch::Tensor>& ts) {
  std::string header = "{";
  std::string data;
  for (const auto& [name, t0] : ts) {
    torch::Tensor t = t0.detach().contiguous();
    const char* dtype = t.scalar_type() == torch::kFloat32 ? "F32"
                        : t.scalar_type() == torch::kInt64 ? "I64"
                                                           : "U8";
    std::string shape;
    for (int64_t s : t.sizes()) shape += (shape.empty() ? "" : ",") + std::to_string(s);
    size_t begin = data.size();
    data.append(static_cast<const char*>(t.data_ptr()), t.nbytes());
    header +=
        (header.size() > 1 ? "," : "") +
        ("\"" + name + "\":{\"dtype\":\"" + dtype + "\",\"shape\":[" + shape +
         "],\"data_offsets\":[" + std::to_string(begin) + "," + std::to_string(data.size()) + "]}");
  }
  header += "}";
  header.resize((header.size() + 7) / 8 * 8, ' ');
  uint64_t n = header.size();
  std::ofstream out(path, std::ios::binary);
  for (int i = 0; i < 8; ++i) out.put(static_cast<char>(n >> (8 * i)));
  out << header << data;
  std::printf("wrote %zu tensors to %s\n", ts.size(), path.c_str());
}

std::map<std::string, torch::Tensor> state_dict(torch::nn::Module& m) {
  std::map<std::string, torch::Tensor> out;
  for (const auto& p : m.named_parameters()) out[p.key()] = p.value();
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 4) {
    std::fprintf(stderr, "usage: %s pixels.u8 labels.u8 OUT_DIR\n", argv[0]);
    return 1;
  }
  const std::string out_dir = argv[3];
  std::vector<uint8_t> px = read_bytes(argv[1], kImages * kPixels),
                       lb = read_bytes(argv[2], kImages);
  torch::Tensor pixels = torch::from_blob(px.data(), {kImages, kPixels}, torch::kUInt8).clone();
  torch::Tensor labels = torch::from_blob(lb.data(), {kImages}, torch::kUInt8).to(torch::kInt64);
  save_safetensors(out_dir + "/digits_parity_data.safetensors",
                   {{"pixels", pixels}, {"labels", labels}});
  torch::Tensor x = pixels.to(torch::kFloat32) / 16;  // exact, as export_digits.py's float64 / 16

  torch::manual_seed(0);
  torch::nn::Sequential mlp(torch::nn::Linear(64, 128), torch::nn::ReLU(),
                            torch::nn::Linear(128, 10));
  torch::nn::Sequential cnn(torch::nn::Conv2d(torch::nn::Conv2dOptions(1, 16, 3).padding(1)),
                            torch::nn::ReLU(), torch::nn::MaxPool2d(torch::nn::MaxPool2dOptions(2)),
                            torch::nn::Conv2d(torch::nn::Conv2dOptions(16, 32, 3).padding(1)),
                            torch::nn::ReLU(), torch::nn::Flatten(),
                            torch::nn::Linear(32 * 4 * 4, 10));
  save_safetensors(out_dir + "/digits_parity_mlp.safetensors", state_dict(*mlp));
  save_safetensors(out_dir + "/digits_parity_cnn.safetensors", state_dict(*cnn));

  // An 80/20 split, then batches of 32 from a fresh permutation of the training part per epoch
  // (the short last batch of an epoch dropped).
  torch::Tensor order = torch::randperm(kImages, torch::kInt64);
  const int64_t n_train = kImages - kImages / 5;
  torch::Tensor train = order.slice(0, 0, n_train), heldout = order.slice(0, n_train);
  std::vector<torch::Tensor> batches;
  while (static_cast<int64_t>(batches.size()) < kSteps) {
    torch::Tensor epoch = train.index_select(0, torch::randperm(n_train, torch::kInt64));
    for (int64_t b = 0; b + kBatch <= n_train && static_cast<int64_t>(batches.size()) < kSteps;
         b += kBatch)
      batches.push_back(epoch.slice(0, b, b + kBatch));
  }
  golden::Writer out;
  out.add("train_batches", torch::stack(batches));
  out.add("heldout", heldout);

  auto run = [&](const std::string& name, torch::nn::Sequential& model,
                 std::vector<int64_t> shape) {
    auto shaped = [&](const torch::Tensor& idx) {
      std::vector<int64_t> sizes{idx.size(0)};
      sizes.insert(sizes.end(), shape.begin(), shape.end());
      return x.index_select(0, idx).reshape(sizes);
    };
    torch::optim::AdamW opt(model->parameters(),
                            torch::optim::AdamWOptions(2e-3).weight_decay(1e-4));
    std::vector<double> losses;
    for (const torch::Tensor& idx : batches) {
      torch::Tensor loss = torch::nn::functional::cross_entropy(model->forward(shaped(idx)),
                                                                labels.index_select(0, idx));
      opt.zero_grad();
      loss.backward();
      opt.step();
      losses.push_back(loss.item<double>());
    }
    torch::NoGradGuard no_grad;
    torch::Tensor held = torch::nn::functional::cross_entropy(model->forward(shaped(heldout)),
                                                              labels.index_select(0, heldout));
    out.add(name + ".losses", torch::tensor(losses, torch::kFloat64));
    out.add(name + ".heldout_loss", held.reshape({1}));
    std::printf("%s: step 1 loss %.9g, step %lld loss %.9g, held-out loss %.9g\n", name.c_str(),
                losses.front(), static_cast<long long>(kSteps), losses.back(), held.item<double>());
  };
  run("mlp", mlp, {64});
  run("cnn", cnn, {1, 8, 8});
  return out.save((out_dir + "/digits_parity.bin").c_str());
}
