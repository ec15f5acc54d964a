// kiln/proto/codec.h: tensors, op arguments and graphs to and from their wire form
// (proto/kiln/proto/tensor.proto and program.proto), in the wire layer's own library, kiln_wire
// (it uses tensor; the generated messages in kiln_proto do not, so the coordinator links no tensor
// code). The worker decodes with it and the Remote backend (client/) encodes with it: both ends
// share one codec and agree by construction.
//
//   std::vector<kiln::proto::TensorData> pieces = kiln::proto::encode_tensor(t);   // chunked
//   kiln::proto::TensorAssembler a;  for (auto& p : pieces) a.add(p);  kiln::Tensor u = a.take();
//   kiln::proto::Argument arg = kiln::proto::encode_attribute(kiln::IValue(int64_t{3}));
//   kiln::IValue v = kiln::proto::decode_attribute(arg.attribute());
//   kiln::ir::Graph g = kiln::proto::decode_graph(kiln::proto::encode_graph(graph));
//
// Decoding never trusts the wire: every problem (unknown dtype name, negative size, byte count
// that does not match shape x itemsize, overflowing sizes, a piece out of order) is a
// kiln::Error of kind Value naming what was wrong; nothing is read out of bounds.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "kiln/ir.h"
#include "kiln/ivalue.h"
#include "kiln/proto/program.pb.h"
#include "kiln/proto/tensor.pb.h"
#include "kiln/tensor.h"

namespace kiln::proto {

// `t` (any strides, any device with data) as contiguous little-endian bytes, split into pieces
// of at most `chunk_bytes` (kiln::proto::kChunkBytes by default). A zero-size tensor is one
// piece with no data.
std::vector<proto::TensorData> encode_tensor(const Tensor& t, size_t chunk_bytes = 0);

// The byte size numel(shape) * itemsize(dtype) a piece's header declares. ValueError for an
// unknown dtype, a negative size or a product beyond 2^62 bytes.
uint64_t wire_bytes(const proto::TensorData& header);

// Rebuilds a CPU tensor from its pieces, in order. Memory grows with the bytes received, not
// with the size a header claims: a lone complete piece becomes the tensor at once, several
// pieces gather in a buffer first.
class TensorAssembler {
 public:
  // Adds the next piece. ValueError when its header differs from the first piece's, its offset
  // is not where the previous piece ended, it runs past the tensor's byte size, or a bool byte is
  // neither 0 nor 1.
  void add(const proto::TensorData& piece);
  bool started() const { return started_; }
  bool complete() const { return started_ && received_ == total_; }  // every byte received
  Tensor take();  // ValueError unless complete(); resets the assembler

 private:
  bool started_ = false;
  uint64_t received_ = 0;
  uint64_t total_ = 0;
  proto::TensorData header_;  // dtype and shape of the first piece, no data
  Tensor whole_;              // the tensor of a lone complete piece
  std::string buffer_;        // the bytes so far, when they came in several pieces
};

// A non-Tensor argument (Scalar, int, float, bool, int[], ScalarType, Device, str, None).
// Tensors and Generators have no attribute form (ValueError).
proto::Attribute encode_attribute(const IValue& v);
IValue decode_attribute(const proto::Attribute& a);

// A graph of the IR (kiln/ir.h: what kiln::compile captures, a batch job ships and export
// writes) as program.proto's Graph: its value ids, its nodes as Instructions (seq: the node's
// index), its input specs. decode_graph rebuilds the graph through Graph::add_node, so every
// node is checked against its op's schema and meta function: a malformed graph (an unknown op
// or value, a repeated id, arguments that do not fit) is a ValueError naming the node.
proto::Graph encode_graph(const ir::Graph& g);
ir::Graph decode_graph(const proto::Graph& p);

// Replaces the `group` argument of every collective in `g` by to(op name, group) (a batch job's
// groups named by mesh dim: Note [Batch jobs on a mesh] in worker/src/batch.h).
void rename_collective_groups(
    proto::Graph& g, const std::function<std::string(const std::string&, const std::string&)>& to);

}  // namespace kiln::proto
