// kiln/dispatch_key.h: dispatch keys in priority order, key sets as bitsets, and the
// thread-local include/exclude sets with their RAII guards.
//
//   kiln::DispatchKeySet ks = t.key_set();                  // e.g. {CPU, Autograd}
//   ks.highest();                                           // Autograd
//   { kiln::ExcludeDispatchKeyGuard g(kiln::DispatchKey::Autograd); ... }   // below autograd
//   kiln::DispatchKeySet::below(kiln::DispatchKey::Autograd);   // keys a kernel redispatches to
#pragma once

#include <cstdint>
#include <initializer_list>
#include <ostream>

#include "kiln/device.h"

namespace kiln {

// Note [Dispatch key order]: a larger value is a higher priority (DESIGN.md "The dispatcher").
// The backends are the lowest keys; exactly one of them is set on a tensor.
enum class DispatchKey : uint8_t {
  CPU,
  CUDA,
  Metal,
  Meta,
  Remote,
  Tracing,
  DTensor,
  Functionalize,
  Autograd,
  Autocast,
  Batched,
};
constexpr int kNumDispatchKeys = 11;
constexpr int kNumBackendKeys = 5;

const char* dispatch_key_name(DispatchKey k);
std::ostream& operator<<(std::ostream& os, DispatchKey k);

class DispatchKeySet {
 public:
  constexpr DispatchKeySet() = default;
  constexpr explicit DispatchKeySet(uint32_t bits) : bits_(bits) {}
  constexpr DispatchKeySet(DispatchKey k) : bits_(1u << static_cast<int>(k)) {}  // NOLINT
  constexpr DispatchKeySet(std::initializer_list<DispatchKey> ks) {
    for (auto k : ks) bits_ |= 1u << static_cast<int>(k);
  }
  // Every key strictly below `k`.
  static constexpr DispatchKeySet below(DispatchKey k) {
    return DispatchKeySet((1u << static_cast<int>(k)) - 1);
  }
  static constexpr DispatchKeySet all() { return DispatchKeySet((1u << kNumDispatchKeys) - 1); }
  static constexpr DispatchKeySet backends() {
    return DispatchKeySet((1u << kNumBackendKeys) - 1);
  }

  constexpr bool has(DispatchKey k) const { return bits_ & (1u << static_cast<int>(k)); }
  constexpr bool empty() const { return bits_ == 0; }
  constexpr uint32_t raw() const { return bits_; }
  DispatchKey highest() const { return static_cast<DispatchKey>(31 - __builtin_clz(bits_)); }
  constexpr DispatchKeySet operator|(DispatchKeySet o) const { return DispatchKeySet(bits_ | o.bits_); }
  constexpr DispatchKeySet operator&(DispatchKeySet o) const { return DispatchKeySet(bits_ & o.bits_); }
  constexpr DispatchKeySet operator-(DispatchKeySet o) const { return DispatchKeySet(bits_ & ~o.bits_); }
  constexpr DispatchKeySet add(DispatchKey k) const { return *this | DispatchKeySet(k); }
  constexpr DispatchKeySet remove(DispatchKey k) const { return *this - DispatchKeySet(k); }
  constexpr bool operator==(const DispatchKeySet&) const = default;

 private:
  uint32_t bits_ = 0;
};

std::ostream& operator<<(std::ostream& os, DispatchKeySet ks);

// The key a backend device maps to.

DispatchKey backend_key(DeviceType t);

// Note [Thread-local dispatch state]: `included` is OR-ed into every call's key set, `excluded`
// is removed from it. One struct, read once per call.
struct LocalDispatchKeySet {
  DispatchKeySet included;
  DispatchKeySet excluded;
  bool inference_mode = false;  // set by autograd's InferenceModeGuard; marks new TensorImpls
};
LocalDispatchKeySet& tls_local_dispatch_key_set();

class IncludeDispatchKeyGuard {
 public:
  explicit IncludeDispatchKeyGuard(DispatchKeySet ks)
      : tls_(tls_local_dispatch_key_set()), saved_(tls_.included) {
    tls_.included = tls_.included | ks;
  }
  ~IncludeDispatchKeyGuard() { tls_.included = saved_; }
  IncludeDispatchKeyGuard(const IncludeDispatchKeyGuard&) = delete;
  IncludeDispatchKeyGuard& operator=(const IncludeDispatchKeyGuard&) = delete;

 private:
  LocalDispatchKeySet& tls_;
  DispatchKeySet saved_;
};

class ExcludeDispatchKeyGuard {
 public:
  explicit ExcludeDispatchKeyGuard(DispatchKeySet ks)
      : tls_(tls_local_dispatch_key_set()), saved_(tls_.excluded) {
    tls_.excluded = tls_.excluded | ks;
  }
  ~ExcludeDispatchKeyGuard() { tls_.excluded = saved_; }
  ExcludeDispatchKeyGuard(const ExcludeDispatchKeyGuard&) = delete;
  ExcludeDispatchKeyGuard& operator=(const ExcludeDispatchKeyGuard&) = delete;

 private:
  LocalDispatchKeySet& tls_;
  DispatchKeySet saved_;
};

}  // namespace kiln
