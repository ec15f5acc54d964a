// Runs every op of the generated manifest on CPU and on Meta and checks that both backends
// agree on sizes, strides, dtype and aliasing (DESIGN.md: Meta runs meta functions only).
#include <gtest/gtest.h>

#include <set>

#include "kiln/generated/dtype_sets.h"
#include "op_samples.h"
#include "test_util.h"

namespace kiln::testing {

std::map<std::string, SampleFn>& op_sample_registry() {
  static std::map<std::string, SampleFn> r;
  return r;
}

std::vector<ScalarType> dtypes_of_set(const std::string& set_name) {
  const DTypeSet* set = dtype_sets::by_name(set_name);  // rules.toml's [dtype_sets], generated
  KILN_CHECK(set != nullptr, Value, "unknown dtype set ", set_name);
  return set->to_vector();
}

namespace {

struct ManifestEntry {
  const char* name;
  OpKind kind;
  OpTags tags;
  OpDTypes dtypes;
};

std::vector<ManifestEntry> manifest() {
  return {
#define KILN_MANIFEST_OP(name, handle, kind, tags, dtypes) {name, kind, tags, dtypes},
#include "kiln/generated/manifest.inc"
#undef KILN_MANIFEST_OP
  };
}

}  // namespace

std::vector<std::string> manifest_names() {
  std::vector<std::string> names;
  for (const auto& e : manifest()) names.push_back(e.name);
  return names;
}

namespace {

Tensor to_meta(const Tensor& t) {
  auto storage = Storage::create_dataless(t.impl()->storage()->nbytes(), Device(DeviceType::Meta));
  Tensor m(TensorImpl::make(storage, t.dtype(), t.sizes(), t.strides(), t.storage_offset()));
  m.impl()->set_wrapped_number(t.impl()->is_wrapped_number());
  return m;
}

IValue to_meta(const IValue& v) {
  if (v.is_tensor()) return to_meta(v.to_tensor());
  if (v.is_tensor_list()) {
    std::vector<Tensor> ts;
    for (const Tensor& t : v.to_tensor_list()) ts.push_back(to_meta(t));
    return ts;
  }
  if (v.is<Device>() && v.get<Device>().is_cpu()) return Device(DeviceType::Meta);
  return v;
}


// Index of the input tensor whose storage `t` shares, or -1.
int alias_index(const Tensor& t, const Stack& inputs) {
  for (size_t i = 0; i < inputs.size(); ++i)
    if (inputs[i].is_tensor() && inputs[i].to_tensor().is_alias_of(t)) return static_cast<int>(i);
  return -1;
}

}  // namespace

TEST(Manifest, EveryOpHasSamples) {
  std::vector<std::string> missing;
  for (const auto& e : manifest())
    if (!op_sample_registry().count(e.name)) missing.push_back(e.name);
  std::string list;
  for (auto& m : missing) list += m + " ";
  EXPECT_TRUE(missing.empty()) << "ops without KILN_OP_SAMPLES: " << list;
}

// The manifest and the runtime's OpInfo carry the same typed claims (one generator, two views).
TEST(Manifest, AgreesWithOpInfo) {
  for (const auto& e : manifest()) {
    const OpInfo& info = Dispatcher::get().find_or_throw(e.name).info();
    EXPECT_EQ(info.kind, e.kind) << e.name;
    EXPECT_EQ(info.tags, e.tags) << e.name;
    EXPECT_EQ(info.dtypes, e.dtypes) << e.name;
    EXPECT_EQ(info.tags.has(OpTag::Random), info.is_random) << e.name;
  }
}

TEST(Manifest, MetaAgreesWithCpu) {
  for (const auto& e : manifest()) {
    auto it = op_sample_registry().find(e.name);
    if (it == op_sample_registry().end()) continue;
    OperatorHandle& op = Dispatcher::get().find_or_throw(e.name);
    int n = 0;
    for (const Stack& sample : it->second()) {
      SCOPED_TRACE(std::string(e.name) + " sample " + std::to_string(n++));
      Stack cpu_in = sample, meta_in;
      for (size_t i = 0; i < sample.size(); ++i) {
        bool device_arg = op.info().args[i].arg_type == ArgType::OptionalDevice;
        meta_in.push_back(device_arg && sample[i].is_none() ? IValue(Device(DeviceType::Meta))
                                                            : to_meta(sample[i]));
      }
      Stack cpu = cpu_in, meta = meta_in;
      op.call_boxed(cpu);
      try {
        op.call_boxed(meta);
      } catch (const Error& e) {
        // Nothing to compare (See Note [Data-dependent shapes] in tensor/src/meta/indexing.cpp).
        const bool data_dependent =
            e.kind() == ErrorKind::NotImplemented &&
            std::string(e.what()).find("data-dependent output shape") != std::string::npos;
        if (data_dependent) continue;
        throw;
      }
      auto co = outputs_of(cpu), mo = outputs_of(meta);
      ASSERT_EQ(co.size(), mo.size());
      for (size_t i = 0; i < co.size(); ++i) {
        EXPECT_TRUE(mo[i].is_meta());
        EXPECT_EQ(co[i].sizes(), mo[i].sizes());
        EXPECT_EQ(co[i].dtype(), mo[i].dtype());
        if (co[i].numel() > 1) EXPECT_EQ(co[i].strides(), mo[i].strides());
        EXPECT_EQ(co[i].storage_offset(), mo[i].storage_offset());
        EXPECT_EQ(alias_index(co[i], cpu_in), alias_index(mo[i], meta_in)) << "aliasing differs";
      }
    }
  }
}

}  // namespace kiln::testing

namespace kiln::testing {

// Boxed calls with arguments of the wrong kind (what a malformed remote program would send)
// raise kiln::Error for every op; none crashes.
TEST(Manifest, WrongArgumentKindsRaise) {
  for (const auto& e : manifest_names()) {
    OperatorHandle& op = Dispatcher::get().find_or_throw(e);
    int n = op.info().num_args;
    Stack nones(n);
    EXPECT_THROW(op.call_boxed(nones), Error) << e;
    Stack strings(n, IValue(std::string("x")));
    EXPECT_THROW(op.call_boxed(strings), Error) << e;
    Stack too_few;
    if (n > 0) EXPECT_THROW(op.call_boxed(too_few), Error) << e;
  }
}

}  // namespace kiln::testing
