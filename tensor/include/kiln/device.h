// kiln/device.h: where a tensor lives.
//
//   kiln::Device d("cuda:1");          // parsed; bad strings throw ValueError
//   d.type() == kiln::DeviceType::CUDA; d.index() == 1;
//   kiln::Device cpu = kiln::kCPU;     std::cout << d;   // "cuda:1"
#pragma once

#include <cstdint>
#include <ostream>
#include <string>

namespace kiln {

// Meta and Remote tensors have no local data (Note [Data-less tensors] in tensor_impl.h).
enum class DeviceType : int8_t { CPU, CUDA, Metal, Meta, Remote };
constexpr int kNumDeviceTypes = 5;

const char* device_type_name(DeviceType t);

class Device {
 public:
  // CUDA and Remote devices always carry an index (default 0); the others never do.
  constexpr Device(DeviceType type = DeviceType::CPU, int16_t index = -1)  // NOLINT
      : type_(type),
        index_((type == DeviceType::CUDA || type == DeviceType::Remote) ? (index < 0 ? 0 : index)
                                                                        : -1) {}
  explicit Device(const std::string& spec);
  Device(const char* spec) : Device(std::string(spec)) {}  // NOLINT

  DeviceType type() const { return type_; }
  int16_t index() const { return index_; }
  bool is_cpu() const { return type_ == DeviceType::CPU; }
  bool is_cuda() const { return type_ == DeviceType::CUDA; }
  bool has_data() const { return type_ != DeviceType::Meta && type_ != DeviceType::Remote; }
  std::string str() const;
  friend bool operator==(Device a, Device b) {
    return a.type_ == b.type_ && a.index_ == b.index_;
  }
  friend bool operator!=(Device a, Device b) { return !(a == b); }

 private:
  DeviceType type_;
  int16_t index_;
};

constexpr Device kCPU{DeviceType::CPU};
constexpr Device kMeta{DeviceType::Meta};

std::ostream& operator<<(std::ostream& os, Device d);

}  // namespace kiln
