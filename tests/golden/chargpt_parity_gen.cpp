// tests/golden/chargpt_parity_gen.cpp: PyTorch's (libtorch C++ API) side of
// tests/nn/chargpt_parity_test.cpp. Built and run by make_chargpt_parity.sh; CI never runs it
// (the test reads the committed files).
//
// The same GPT as examples/chargpt/gpt.h (bench/torch_gpt.h, the model of torch_reference.py),
// reduced so the files stay small: vocab 256, context 32, 2 layers, 4 heads, width 64,
// written-out attention, no dropout, float32. Trained for kSteps steps on batches of 8 random windows of a 32 KiB slice of
// the fortunes text (the first 32 KiB of the plain files of /usr/share/games/fortunes in sorted
// order; the first 28 KiB train, the last 4 KiB validate) with AdamW(lr 1e-3, weight decay 0.1
// on matrices, 0 on vectors: chargpt::decay_groups), constant lr. Writes:
//   chargpt_parity_text.bin          the 32 KiB slice
//   chargpt_parity_init.safetensors  the initial weights, keyed as Kiln's state_dict
//   chargpt_parity.bin               (golden_writer.h format) "config" (vocab, block, layers,
//                                    heads, width, batch), "starts" (kSteps, batch) window starts,
//                                    "losses" (kSteps), "val_starts" (kValWindows), "val_loss"
//                                    (the mean loss over those validation windows after kSteps)
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "../../bench/torch_gpt.h"  // the model, shared with bench/torch_cpp_ref.cpp
#include "golden_writer.h"

namespace fs = std::filesystem;

namespace {

constexpr int64_t kVocab = 256, kBlock = 32, kLayers = 2, kHeads = 4, kWidth = 64, kBatch = 8;
constexpr int64_t kSteps = 30, kValWindows = 32;
constexpr size_t kTextBytes = 32768, kTrainBytes = 28672;

std::string read_slice(const std::string& dir) {
  std::vector<fs::path> paths;
  for (const auto& e : fs::directory_iterator(dir)) {
    std::string ext = e.path().extension().string();
    if (e.is_symlink() || !e.is_regular_file() || ext == ".dat" || ext == ".u8") continue;
    paths.push_back(e.path());
  }
  std::sort(paths.begin(), paths.end());
  std::string text;
  for (const auto& p : paths) {
    std::ifstream in(p, std::ios::binary);
    text.append(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
    if (text.size() >= kTextBytes) break;
  }
  text.resize(std::min(text.size(), kTextBytes));
  return text;
}

// x, y: (n, kBlock) int64 windows of `text` at `starts` (offsets into text).
std::pair<torch::Tensor, torch::Tensor> windows(const std::string& text, torch::Tensor starts) {
  int64_t n = starts.size(0);
  auto x = torch::empty({n, kBlock}, torch::kInt64), y = torch::empty({n, kBlock}, torch::kInt64);
  for (int64_t b = 0; b < n; ++b)
    for (int64_t t = 0; t < kBlock; ++t) {
      int64_t s = starts[b].item<int64_t>();
      x[b][t] = int64_t(static_cast<unsigned char>(text[s + t]));
      y[b][t] = int64_t(static_cast<unsigned char>(text[s + t + 1]));
    }
  return {x, y};
}

using torch_gpt::GPT;

torch::Tensor lm_loss(GPT& m, const torch::Tensor& x, const torch::Tensor& y) {
  return torch::nn::functional::cross_entropy(m->forward(x).view({-1, kVocab}), y.view({-1}));
}

// The safetensors format (8-byte little-endian header length, JSON header padded with spaces to a
// multiple of 8, raw little-endian data), float32 tensors in key order.
void write_safetensors(const std::string& path, const std::map<std::string, torch::Tensor>& ts) {
  std::ostringstream h;
  h << "{";
  int64_t off = 0;
  bool first = true;
  for (const auto& [name, t] : ts) {
    h << (first ? "" : ",") << "\"" << name << "\":{\"dtype\":\"F32\",\"shape\":[";
    for (int64_t d = 0; d < t.dim(); ++d) h << (d ? "," : "") << t.size(d);
    int64_t bytes = t.numel() * 4;
    h << "],\"data_offsets\":[" << off << "," << off + bytes << "]}";
    off += bytes;
    first = false;
  }
  h << "}";
  std::string header = h.str();
  header.append((8 - header.size() % 8) % 8, ' ');
  std::ofstream out(path, std::ios::binary);
  uint64_t n = header.size();
  out.write(reinterpret_cast<const char*>(&n), 8);
  out << header;
  for (const auto& [name, t] : ts) {
    auto c = t.detach().contiguous().to(torch::kFloat32);
    out.write(static_cast<const char*>(c.data_ptr()), c.numel() * 4);
  }
}

}  // namespace

int main(int argc, char** argv) {
  std::string dir = argc > 1 ? argv[1] : "/usr/share/games/fortunes";
  std::string text = read_slice(dir);
  if (text.size() != kTextBytes) {
    std::fprintf(stderr, "need %zu bytes of fortunes in %s\n", kTextBytes, dir.c_str());
    return 1;
  }
  std::ofstream("chargpt_parity_text.bin", std::ios::binary) << text;
  std::string train = text.substr(0, kTrainBytes), val = text.substr(kTrainBytes);

  torch::manual_seed(0);
  GPT model(kVocab, kBlock, kLayers, kHeads, kWidth);
  std::map<std::string, torch::Tensor> init;
  for (const auto& p : model->named_parameters()) init[p.key()] = p.value();
  write_safetensors("chargpt_parity_init.safetensors", init);

  std::vector<torch::Tensor> decay, no_decay;
  for (const auto& p : model->parameters()) (p.dim() >= 2 ? decay : no_decay).push_back(p);
  torch::optim::AdamW opt(
      {torch::optim::OptimizerParamGroup(decay), torch::optim::OptimizerParamGroup(no_decay)},
      torch::optim::AdamWOptions(1e-3));
  static_cast<torch::optim::AdamWOptions&>(opt.param_groups()[0].options()).weight_decay(0.1);
  static_cast<torch::optim::AdamWOptions&>(opt.param_groups()[1].options()).weight_decay(0.0);

  auto starts = torch::randint(0, int64_t(train.size()) - kBlock, {kSteps, kBatch}, torch::kInt64);
  auto val_starts = torch::randint(0, int64_t(val.size()) - kBlock, {kValWindows}, torch::kInt64);
  auto losses = torch::empty({kSteps}, torch::kFloat64);
  for (int64_t s = 0; s < kSteps; ++s) {
    auto [x, y] = windows(train, starts[s]);
    opt.zero_grad();
    auto loss = lm_loss(model, x, y);
    loss.backward();
    opt.step();
    losses[s] = loss.item<double>();
  }
  torch::Tensor val_loss;
  {
    torch::NoGradGuard no_grad;
    auto [x, y] = windows(val, val_starts);
    val_loss = lm_loss(model, x, y);
  }
  golden::Writer out;
  out.add("config",
          torch::tensor({kVocab, kBlock, kLayers, kHeads, kWidth, kBatch}, torch::kFloat64));
  out.add("starts", starts);
  out.add("losses", losses);
  out.add("val_starts", val_starts);
  out.add("val_loss", val_loss);
  if (out.save("chargpt_parity.bin") != 0) return 1;
  std::printf("step 1 loss %.8f, step %lld loss %.6f, validation loss %.6f\n",
              losses[0].item<double>(), static_cast<long long>(kSteps),
              losses[kSteps - 1].item<double>(), val_loss.item<double>());
  return 0;
}
