// Tensors and op arguments to and from their wire form (kiln/proto/codec.h).
#include "kiln/proto/codec.h"

#include <bit>
#include <cstring>
#include <string>

#include "kiln/error.h"
#include "kiln/proto/service.h"

namespace kiln::proto {

static_assert(std::endian::native == std::endian::little,
              "the wire format is little-endian; a big-endian host needs byte swapping here");

namespace {

ScalarType dtype_of(const std::string& name) {
  for (int i = 0; i < kNumScalarTypes; ++i) {
    auto t = static_cast<ScalarType>(i);
    if (name == scalar_type_name(t)) return t;
  }
  KILN_FAIL(Value, "tensor data: unknown dtype '", name, "'");
}

bool same_header(const proto::TensorData& a, const proto::TensorData& b) {
  if (a.dtype() != b.dtype() || a.shape_size() != b.shape_size()) return false;
  for (int i = 0; i < a.shape_size(); ++i)
    if (a.shape(i) != b.shape(i)) return false;
  return true;
}

Tensor new_tensor(const proto::TensorData& header) {
  DimVector sizes(IntArrayRef(header.shape().data(), static_cast<size_t>(header.shape_size())));
  return empty_on(IntArrayRef(sizes), dtype_of(header.dtype()), kCPU);
}

}  // namespace

uint64_t wire_bytes(const proto::TensorData& header) {
  ScalarType dtype = dtype_of(header.dtype());
  check_dims(header.shape_size(), "tensor data");
  uint64_t bytes = element_size(dtype);
  for (int i = 0; i < header.shape_size(); ++i) {
    int64_t s = header.shape(i);
    KILN_CHECK(s >= 0, Value, "tensor data: negative size ", s, " in dimension ", i);
    KILN_CHECK(!__builtin_mul_overflow(bytes, static_cast<uint64_t>(s), &bytes) &&
                   bytes <= (uint64_t{1} << 62),
               Value, "tensor data: shape overflows (", header.shape_size(), " dimensions, ",
               "dimension ", i, " is ", s, ")");
  }
  return bytes;
}

std::vector<proto::TensorData> encode_tensor(const Tensor& t, size_t chunk_bytes) {
  if (chunk_bytes == 0) chunk_bytes = proto::kChunkBytes;
  Device d = t.check_defined("encode_tensor").device();
  KILN_CHECK(d.has_data(), Value, "encode_tensor: a tensor on ", d, " has no data to send");
  Tensor c = d.is_cpu() ? t : t.to(std::nullopt, kCPU);
  c = c.contiguous();
  proto::TensorData header;
  header.set_dtype(scalar_type_name(c.dtype()));
  for (int64_t s : c.sizes()) header.add_shape(s);
  const char* data = c.numel() ? static_cast<const char*>(c.data_ptr()) : nullptr;
  size_t total = c.nbytes();
  std::vector<proto::TensorData> pieces;
  pieces.reserve(total / chunk_bytes + 1);
  size_t offset = 0;
  do {
    size_t n = std::min(chunk_bytes, total - offset);
    proto::TensorData& p = pieces.emplace_back(header);
    p.set_offset(offset);
    if (n) p.set_data(data + offset, n);
    offset += n;
  } while (offset < total);
  return pieces;
}

void TensorAssembler::add(const proto::TensorData& piece) {
  if (!started_) {
    KILN_CHECK(piece.offset() == 0, Value, "tensor data: the first piece starts at byte ",
               piece.offset(), ", expected 0");
    total_ = wire_bytes(piece);
    header_ = piece;
    header_.clear_data();
    started_ = true;
  } else {
    KILN_CHECK(same_header(piece, header_), Value, "tensor data: a piece's dtype or shape (",
               piece.dtype(), ", ", piece.shape_size(), " dims) differs from the first piece's (",
               header_.dtype(), ", ", header_.shape_size(), " dims)");
    KILN_CHECK(piece.offset() == received_, Value, "tensor data: piece at byte ", piece.offset(),
               ", expected the next at byte ", received_);
  }
  const std::string& d = piece.data();
  KILN_CHECK(d.size() <= total_ - received_, Value, "tensor data: piece of ", d.size(),
             " bytes at byte ", received_, " runs past the tensor's ", total_, " bytes");
  if (header_.dtype() == "bool") {
    for (char c : d)
      KILN_CHECK(c == 0 || c == 1, Value, "tensor data: bool byte ", int(c), " is neither 0 nor 1");
  }
  // Memory follows the bytes received: a lone complete piece is copied into its tensor at once,
  // several are gathered first (a header alone allocates nothing).
  if (received_ == 0 && d.size() == total_) {
    whole_ = new_tensor(header_);
    if (total_) std::memcpy(whole_.data_ptr(), d.data(), total_);
  } else {
    if (received_ == 0) buffer_.clear();
    buffer_.append(d);
  }
  received_ += d.size();
}

Tensor TensorAssembler::take() {
  KILN_CHECK(complete(), Value, "tensor data: incomplete, ", received_, " of ", total_,
             " bytes received");
  Tensor t = std::move(whole_);
  if (!t.defined()) {
    t = new_tensor(header_);
    if (total_) std::memcpy(t.data_ptr(), buffer_.data(), total_);
  }
  whole_ = Tensor();
  started_ = false;
  received_ = total_ = 0;
  header_.Clear();
  buffer_.clear();
  buffer_.shrink_to_fit();
  return t;
}

proto::Attribute encode_attribute(const IValue& v) {
  proto::Attribute a;
  std::visit(
      [&](const auto& x) {
        using T = std::decay_t<decltype(x)>;
        if constexpr (std::is_same_v<T, std::monostate>) {
          a.set_none(true);
        } else if constexpr (std::is_same_v<T, int64_t>) {
          a.set_int_value(x);
        } else if constexpr (std::is_same_v<T, double>) {
          a.set_float_value(x);
        } else if constexpr (std::is_same_v<T, bool>) {
          a.set_bool_value(x);
        } else if constexpr (std::is_same_v<T, std::vector<int64_t>>) {
          a.mutable_ints()->mutable_values()->Add(x.begin(), x.end());
        } else if constexpr (std::is_same_v<T, std::string>) {
          a.set_string_value(x);
        } else if constexpr (std::is_same_v<T, ScalarType>) {
          a.set_dtype(scalar_type_name(x));
        } else if constexpr (std::is_same_v<T, Device>) {
          a.set_device(x.str());
        } else if constexpr (std::is_same_v<T, Scalar>) {
          if (x.is_floating()) a.set_scalar_float(x.to_double());
          else if (x.is_bool()) a.set_scalar_bool(x.to_bool());
          else a.set_scalar_int(x.to_int());
        } else {
          KILN_FAIL(Value, "encode_attribute: a ", v.type_name(), " has no attribute form");
        }
      },
      v.variant());
  return a;
}

IValue decode_attribute(const proto::Attribute& a) {
  using K = proto::Attribute::KindCase;
  switch (a.kind_case()) {
    case K::kNone: return IValue();
    case K::kIntValue: return IValue(a.int_value());
    case K::kFloatValue: return IValue(a.float_value());
    case K::kBoolValue: return IValue(a.bool_value());
    case K::kInts:
      return IValue(std::vector<int64_t>(a.ints().values().begin(), a.ints().values().end()));
    case K::kStringValue: return IValue(a.string_value());
    case K::kDtype: return IValue(dtype_of(a.dtype()));
    case K::kDevice: return IValue(Device(a.device()));
    case K::kScalarInt: return IValue(Scalar(a.scalar_int()));
    case K::kScalarFloat: return IValue(Scalar(a.scalar_float()));
    case K::kScalarBool: return IValue(Scalar(a.scalar_bool()));
    case K::KIND_NOT_SET: break;
  }
  KILN_FAIL(Value, "attribute: no value set");
}

}  // namespace kiln::proto
