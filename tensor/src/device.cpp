#include "kiln/device.h"

#include <cstdlib>

#include "kiln/default_device.h"
#include "kiln/error.h"

namespace kiln {

const char* device_type_name(DeviceType t) {
  static const char* const names[] = {"cpu", "cuda", "metal", "meta", "remote"};
  return names[static_cast<int>(t)];
}

Device::Device(const std::string& spec) : type_(DeviceType::CPU), index_(-1) {
  std::string kind = spec, idx;
  if (auto colon = spec.find(':'); colon != std::string::npos) {
    kind = spec.substr(0, colon);
    idx = spec.substr(colon + 1);
  }
  int t = -1;
  for (int i = 0; i < kNumDeviceTypes; ++i)
    if (kind == device_type_name(static_cast<DeviceType>(i))) t = i;
  KILN_CHECK(t >= 0, Value, "unknown device '", spec, "' (expected cpu, cuda[:N], metal, meta or remote[:N])");
  type_ = static_cast<DeviceType>(t);
  int index = -1;
  if (!idx.empty()) {
    char* end = nullptr;
    long v = std::strtol(idx.c_str(), &end, 10);
    KILN_CHECK(*end == '\0' && v >= 0 && v < 32768, Value, "bad device index in '", spec, "'");
    index = static_cast<int>(v);
  }
  *this = Device(type_, static_cast<int16_t>(index));
  KILN_CHECK(idx.empty() || index_ >= 0, Value, "device '", kind, "' takes no index (got '", spec, "')");
}

std::string Device::str() const {
  std::string s = device_type_name(type_);
  if (index_ >= 0) s += ":" + std::to_string(index_);
  return s;
}

std::ostream& operator<<(std::ostream& os, Device d) { return os << d.str(); }

namespace {
thread_local Device t_default_device = kCPU;  // See kiln/default_device.h
}  // namespace

Device default_device() { return t_default_device; }
void set_default_device(Device d) { t_default_device = d; }

}  // namespace kiln
