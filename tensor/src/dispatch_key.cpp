#include "kiln/dispatch_key.h"

#include "kiln/error.h"

namespace kiln {

const char* dispatch_key_name(DispatchKey k) {
  static const char* const names[] = {"CPU",     "CUDA",          "Metal",    "Meta",
                                      "Remote",  "Tracing",       "DTensor",  "Functionalize",
                                      "Autograd", "Autocast",     "Batched"};
  return names[static_cast<int>(k)];
}

std::ostream& operator<<(std::ostream& os, DispatchKey k) { return os << dispatch_key_name(k); }

std::ostream& operator<<(std::ostream& os, DispatchKeySet ks) {
  os << "{";
  bool first = true;
  for (int i = kNumDispatchKeys - 1; i >= 0; --i) {
    if (!ks.has(static_cast<DispatchKey>(i))) continue;
    os << (first ? "" : ", ") << dispatch_key_name(static_cast<DispatchKey>(i));
    first = false;
  }
  return os << "}";
}

DispatchKey backend_key(DeviceType t) {
  switch (t) {
    case DeviceType::CPU: return DispatchKey::CPU;
    case DeviceType::CUDA: return DispatchKey::CUDA;
    case DeviceType::Metal: return DispatchKey::Metal;
    case DeviceType::Meta: return DispatchKey::Meta;
    case DeviceType::Remote: return DispatchKey::Remote;
  }
  KILN_ASSERT(false, "bad device type");
  return DispatchKey::CPU;
}

LocalDispatchKeySet& tls_local_dispatch_key_set() {
  static thread_local LocalDispatchKeySet s;
  return s;
}

}  // namespace kiln
