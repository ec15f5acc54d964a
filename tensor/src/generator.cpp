#include "kiln/generator.h"

#include "kiln/error.h"

namespace kiln {

Generator::Generator(uint64_t seed) : impl_(std::make_shared<Impl>()) { impl_->state.seed = seed; }

void Generator::manual_seed(uint64_t seed) {
  std::lock_guard<std::mutex> g(impl_->mu);
  impl_->state = GeneratorState{seed, 0};
}

uint64_t Generator::initial_seed() const {
  std::lock_guard<std::mutex> g(impl_->mu);
  return impl_->state.seed;
}

GeneratorState Generator::get_state() const {
  std::lock_guard<std::mutex> g(impl_->mu);
  return impl_->state;
}

void Generator::set_state(GeneratorState s) {
  std::lock_guard<std::mutex> g(impl_->mu);
  impl_->state = s;
}

std::pair<uint64_t, uint64_t> Generator::reserve(uint64_t n) {
  std::lock_guard<std::mutex> g(impl_->mu);
  uint64_t first = impl_->state.offset;
  impl_->state.offset += n;
  return {impl_->state.seed, first};
}

Generator& default_generator() {
  static Generator g;
  return g;
}

void manual_seed(uint64_t seed) { default_generator().manual_seed(seed); }

RandomWidth random_op_width(std::string_view op, ScalarType dtype) {
  if (op == "randint" || op == "randperm") return RandomWidth::k64;
  if (op == "rand" || op == "randn" || op == "uniform_" || op == "normal_" || op == "bernoulli")
    return dtype == kFloat64 ? RandomWidth::k64 : RandomWidth::k32;
  KILN_FAIL(Value, "random_op_counters: '", op, "' is not a random op of the table");
}

uint64_t random_op_counters(std::string_view op, int64_t numel, ScalarType dtype) {
  return random_counters(random_op_width(op, dtype), numel);
}

}  // namespace kiln
