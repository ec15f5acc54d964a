// tests/worker/fuzz/fuzz_entries.h: what the fuzzers feed arbitrary bytes to, shared by the
// libFuzzer harnesses (scripts/fuzz, clang) and the replay test (fuzz_replay_test.cpp), which
// runs the seed corpus and every kept crash under ctest.
//
// The bytes are a serialized kiln.proto.Batch, the worker's untrusted input. Anything may be
// refused (kiln::Error, a non-OK status); nothing may crash, leak or read out of bounds.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#include <google/protobuf/stubs/logging.h>

#include "kiln/error.h"
#include "kiln/proto/codec.h"
#include "kiln/worker/session.h"

namespace kiln::fuzz {

// The codec: every Create's piece into one assembler (a complete tensor must round-trip), every
// attribute of every instruction decoded and re-encoded.
inline void codec(const uint8_t* data, size_t size) {
  google::protobuf::LogSilencer quiet;  // invalid UTF-8 in a string field is refused, noisily
  proto::Batch batch;
  if (!batch.ParseFromArray(data, static_cast<int>(size))) return;
  proto::TensorAssembler a;
  for (const proto::Command& c : batch.commands()) {
    try {
      if (c.has_create()) {
        if (c.create().data().offset() == 0 && a.started()) a = proto::TensorAssembler();
        a.add(c.create().data());
        if (a.complete()) {
          Tensor t = a.take();
          proto::TensorAssembler b;
          for (const auto& p : proto::encode_tensor(t, 4096)) b.add(p);
          Tensor u = b.take();
          KILN_ASSERT(u.nbytes() == t.nbytes() &&
                      (t.nbytes() == 0 || std::memcmp(u.data_ptr(), t.data_ptr(), t.nbytes()) == 0));
        }
      }
      for (const proto::Argument& arg : c.op().args())
        if (arg.has_attribute())
          proto::decode_attribute(proto::encode_attribute(proto::decode_attribute(arg.attribute())));
    } catch (const Error&) {
      a = proto::TensorAssembler();
    }
  }
}

// The executor: the batch through a fresh Session with a memory limit (so a huge op is refused
// rather than exhausting the fuzzer's memory).
inline void session(const uint8_t* data, size_t size) {
  google::protobuf::LogSilencer quiet;
  proto::Batch batch;
  if (!batch.ParseFromArray(data, static_cast<int>(size))) return;
  worker::Session s({.memory_limit_bytes = 64 << 20});
  (void)s.run(batch, [](proto::WorkerMessage&&) {});
}

}  // namespace kiln::fuzz
