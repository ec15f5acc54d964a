// Recording helpers shared by the Remote backend's fallback (remote_fallback.cpp) and its DTensor
// hooks (remote_dtensor.cpp).
#pragma once

#include <memory>
#include <vector>

#include "kiln/client/connection.h"
#include "kiln/dispatcher.h"
#include "kiln/proto/codec.h"

namespace kiln::client::detail {

// Where the values an op reads live on the worker: their ids, with small CPU inputs uploaded.
class ArgEncoder {
 public:
  ArgEncoder(const OperatorHandle& op, const std::shared_ptr<Connection>& conn)
      : op_(op), conn_(conn) {}

  int64_t id_of(const Tensor& t) {
    if (t.device() == conn_->device()) return remote_value(t, op_.name()).id;
    // PyTorch lets 0-dim CPU tensors (wrapped numbers) join a device op; anything else is a
    // device mismatch.
    KILN_CHECK(t.device().has_data() && t.dim() == 0, Value, op_.name(),
               ": expected all tensors to be on the same device, but found at least two "
               "devices, ",
               conn_->device(), " and ", t.device());
    int64_t id = conn_->new_id();
    conn_->add_create(id, t);
    uploads_.push_back(id);
    return id;
  }

  void encode(const IValue& v, const ArgInfo& ai, proto::Argument* out) {
    if (v.is_tensor()) {
      out->set_value(id_of(v.to_tensor()));
    } else if (v.is_tensor_list()) {
      auto* ids = out->mutable_values()->mutable_ids();
      for (const Tensor& t : v.to_tensor_list()) ids->Add(id_of(t));
    } else if (v.is<Generator>() || ai.arg_type == ArgType::OptionalGenerator) {
      out->mutable_attribute()->set_none(true);  // random ops send (seed, offset) instead
    } else if (v.is<Device>() && v.get<Device>().type() == DeviceType::Remote) {
      out->mutable_attribute()->set_device(conn_->transport().worker_device());
    } else {
      *out->mutable_attribute() = proto::encode_attribute(v);
    }
  }

  // Uploaded temporaries are freed once the instruction that reads them is queued.
  ~ArgEncoder() {
    for (int64_t id : uploads_) conn_->release(id);
  }

 private:
  const OperatorHandle& op_;
  const std::shared_ptr<Connection>& conn_;
  std::vector<int64_t> uploads_;
};

}  // namespace kiln::client::detail
