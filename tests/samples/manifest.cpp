// tests/samples/manifest.cpp: the op table's rows read from the generated manifest, the sample
// registry, samples in a dtype, and the manifest helpers of tests/samples/manifest.h.
#include "samples/manifest.h"

#include <map>

#include "kiln/generated/dtype_sets.h"
#include "samples/util.h"

namespace kiln::testing {

std::map<std::string, SampleFn>& op_sample_registry() {
  static std::map<std::string, SampleFn> r;
  return r;
}

// rules.toml's [dtype_sets], generated (kiln/generated/dtype_sets.h).
std::vector<ScalarType> dtypes_of_set(const std::string& set_name) {
  const DTypeSet* set = dtype_sets::by_name(set_name);
  KILN_CHECK(set != nullptr, Value, "unknown dtype set ", set_name);
  return set->to_vector();
}

const char* backend_name(Backend b) {
  switch (b) {
    case Backend::CPU:
      return "cpu";
    case Backend::CUDA:
      return "cuda";
    case Backend::Meta:
      return "meta";
  }
  return "?";
}

bool ManifestRow::claims_dtype(Backend b, ScalarType t) const {
  for (ScalarType c : claimed(b))
    if (c == t) return true;
  return false;
}

namespace {

// See Note [Manifest claims]: the generated manifest's typed kind and per-backend claims.
std::vector<ManifestRow> read_manifest() {
  struct Raw {
    const char* name;
    OpKind kind;
    OpDTypes dtypes;
  };
  static const Raw raw[] = {
#define KILN_MANIFEST_OP(name, handle, kind, tags, dtypes) {name, kind, dtypes},
#include "kiln/generated/manifest.inc"
#undef KILN_MANIFEST_OP
  };
  std::vector<ManifestRow> rows;
  for (const Raw& r : raw) {
    ManifestRow row{
        r.name, &Dispatcher::get().find_or_throw(r.name), r.kind == OpKind::Composite, {}};
    row.claims[static_cast<int>(Backend::CPU)] = r.dtypes.cpu.to_vector();
    row.claims[static_cast<int>(Backend::CUDA)] = r.dtypes.cuda.to_vector();
    row.claims[static_cast<int>(Backend::Meta)] = r.dtypes.meta.to_vector();
    rows.push_back(std::move(row));
  }
  return rows;
}

}  // namespace

const std::vector<ManifestRow>& manifest() {
  static const std::vector<ManifestRow> rows = read_manifest();
  return rows;
}

const ManifestRow* manifest_row(std::string_view name) {
  for (const ManifestRow& r : manifest())
    if (r.name == name) return &r;
  return nullptr;
}

std::vector<std::string> manifest_names() {
  std::vector<std::string> names;
  for (const ManifestRow& r : manifest()) names.push_back(r.name);
  return names;
}

namespace {

// The index of an out= variant's `out` argument in its sample; -1 for other ops.
int out_index(const OpInfo& info, const Stack& sample) {
  if (!info.is_out) return -1;
  for (int i = 0; i < info.num_args && i < static_cast<int>(sample.size()); ++i)
    if (info.args[i].is_mutable && sample[i].is_tensor()) return i;
  return -1;
}

// "exp_" -> "exp", "round_.decimals" -> "round.decimals", "exp.out" -> "exp"; "" otherwise.
std::string functional_name(const OpInfo& info) {
  const std::string name = info.name;
  if (info.is_out) {
    const size_t dot = name.rfind(".out");
    return dot != std::string::npos && dot + 4 == name.size() ? name.substr(0, dot) : "";
  }
  if (!info.is_inplace) return "";
  const size_t dot = name.find('.');
  const std::string base = name.substr(0, dot);
  if (base.empty() || base.back() != '_') return "";
  return base.substr(0, base.size() - 1) + (dot == std::string::npos ? "" : name.substr(dot));
}

// A dataless Meta tensor with t's dtype and layout.
Tensor to_meta(const Tensor& t) {
  if (!t.defined()) return t;
  auto storage = Storage::create_dataless(t.impl()->storage()->nbytes(), Device(DeviceType::Meta));
  Tensor m(TensorImpl::make(storage, t.dtype(), t.sizes(), t.strides(), t.storage_offset()));
  m.impl()->set_wrapped_number(t.impl()->is_wrapped_number());
  return m;
}

}  // namespace

// See Note [Sample dtypes].
std::optional<ScalarType> functional_result_dtype(const OpInfo& info, const Stack& sample) {
  const std::string fname = functional_name(info);
  const OperatorHandle* f = fname.empty() ? nullptr : Dispatcher::get().find(fname);
  if (f == nullptr) return std::nullopt;
  const int out = out_index(info, sample);
  Stack s;
  for (int i = 0; i < static_cast<int>(sample.size()); ++i) {
    const IValue& v = sample[i];
    if (i == out) continue;
    if (v.is_tensor()) {
      s.emplace_back(to_meta(v.to_tensor()));
    } else if (v.is_tensor_list()) {
      std::vector<Tensor> ts;
      for (const Tensor& t : v.to_tensor_list()) ts.push_back(to_meta(t));
      s.emplace_back(std::move(ts));
    } else {
      s.push_back(v);
    }
  }
  try {
    f->call_boxed(s);
  } catch (const Error&) {
    return std::nullopt;
  }
  const std::vector<Tensor> outs = outputs_of(s);
  if (outs.empty() || !outs[0].defined()) return std::nullopt;
  return outs[0].dtype();
}

// See Note [Sample dtypes].
std::optional<Stack> sample_in_dtype(const Stack& sample, ScalarType d, const OpInfo& info) {
  auto data = [](const Tensor& t) {
    return is_floating(t.dtype()) && !t.impl()->is_wrapped_number();
  };
  const int out = out_index(info, sample);
  std::optional<ScalarType> first;
  bool any_floating = false;
  for (int i = 0; i < static_cast<int>(sample.size()); ++i) {
    const IValue& v = sample[i];
    if (i == out) continue;
    if (v.is_tensor()) {
      if (!first) first = v.to_tensor().dtype();
      any_floating = any_floating || data(v.to_tensor());
    } else if (v.is_tensor_list()) {
      for (const Tensor& t : v.to_tensor_list()) {
        if (!first) first = t.dtype();
        any_floating = any_floating || data(t);
      }
    }
  }
  if (!first) {  // a factory: its dtype argument
    for (int i = 0; i < info.num_args && i < static_cast<int>(sample.size()); ++i) {
      if (info.args[i].role != ArgRole::Dtype) continue;
      Stack result = sample;
      result[i] = d;
      return result;
    }
    return std::nullopt;
  }
  if (!any_floating && *first != d) return std::nullopt;
  auto cast = [&](const Tensor& t) {
    return data(t) && t.dtype() != d ? copy_tensor(t, d, t.device()) : t;
  };
  Stack result;
  for (const IValue& v : sample) {
    if (v.is_tensor()) {
      result.emplace_back(cast(v.to_tensor()));
    } else if (v.is_tensor_list()) {
      std::vector<Tensor> ts;
      for (const Tensor& t : v.to_tensor_list()) ts.push_back(cast(t));
      result.emplace_back(std::move(ts));
    } else {
      result.push_back(v);
    }
  }
  if (std::optional<ScalarType> r; out >= 0 && (r = functional_result_dtype(info, result))) {
    const Tensor& o = result[out].to_tensor();
    result[out] = IValue(copy_tensor(o, *r, o.device()));
  }
  return result;
}

std::optional<Stack> non_contiguous_variant(const Stack& sample) {
  bool changed = false;
  auto nc = [&](const Tensor& t) {
    if (!t.defined() || !is_floating(t.dtype()) || t.impl()->is_wrapped_number() ||
        t.numel() <= 1 || !t.is_contiguous())
      return t;
    changed = true;
    return non_contiguous(t);
  };
  Stack out;
  for (const IValue& v : sample) {
    if (v.is_tensor()) {
      out.emplace_back(nc(v.to_tensor()));
    } else if (v.is_tensor_list()) {
      std::vector<Tensor> ts;
      for (const Tensor& t : v.to_tensor_list()) ts.push_back(nc(t));
      out.emplace_back(std::move(ts));
    } else {
      out.push_back(v);
    }
  }
  if (!changed) return std::nullopt;
  return out;
}

Tensor copy_tensor(const Tensor& t, ScalarType dtype, Device device) {
  if (!t.defined()) return t;
  const int64_t elems = static_cast<int64_t>(t.impl()->storage()->nbytes() / t.element_size());
  Tensor c;
  if (t.is_contiguous() && t.storage_offset() == 0 && elems == t.numel()) {
    c = empty_strided(t.sizes(), t.strides(), dtype, device);
    if (t.numel() > 0) c.copy_(t);
  } else {  // the whole storage, viewed as `t` views it
    Tensor base = empty({elems}, dtype, device);
    if (elems > 0) base.copy_(t.as_strided({elems}, {1}, 0));
    c = base.as_strided(t.sizes(), t.strides(), t.storage_offset());
  }
  c.impl()->set_wrapped_number(t.impl()->is_wrapped_number());
  return c;
}

Generator copy_generator(const Generator& g) {
  Generator out;
  out.set_state(g.get_state());
  return out;
}

Stack clone_stack(const Stack& s) {
  auto copy = [](const Tensor& t) { return copy_tensor(t, t.dtype(), t.device()); };
  Stack out;
  for (const IValue& v : s) {
    if (v.is_tensor()) {
      out.emplace_back(copy(v.to_tensor()));
    } else if (v.is_tensor_list()) {
      std::vector<Tensor> ts;
      for (const Tensor& t : v.to_tensor_list()) ts.push_back(copy(t));
      out.emplace_back(std::move(ts));
    } else if (v.is<Generator>()) {
      out.emplace_back(copy_generator(v.get<Generator>()));
    } else {
      out.push_back(v);
    }
  }
  return out;
}

bool differentiable(const OpInfo& info) {
  bool has_tensor_arg = false;
  for (int i = 0; i < info.num_args; ++i)
    has_tensor_arg = has_tensor_arg || is_tensor_type(info.args[i].arg_type);
  return has_tensor_arg && !info.is_out && std::string(info.derivative) != "non_differentiable";
}

bool mutates_self(const OpInfo& info) {
  return !info.is_out && info.num_args > 0 && info.args[0].is_mutable &&
         info.args[0].arg_type == ArgType::Tensor;
}

std::vector<Tensor> floating_tensors(const Stack& s) {
  std::vector<Tensor> r;
  for (const IValue& v : s) {
    if (v.is_tensor() && is_floating(v.to_tensor().dtype())) r.push_back(v.to_tensor());
    if (v.is_tensor_list())
      for (const Tensor& t : v.to_tensor_list())
        if (is_floating(t.dtype())) r.push_back(t);
  }
  return r;
}

Stack substitute(const Stack& s, const std::vector<Tensor>& xs) {
  Stack out;
  size_t k = 0;
  for (const IValue& v : s) {
    if (v.is_tensor() && is_floating(v.to_tensor().dtype())) {
      out.emplace_back(xs[k++]);
    } else if (v.is_tensor_list()) {
      std::vector<Tensor> ts;
      for (const Tensor& t : v.to_tensor_list()) ts.push_back(is_floating(t.dtype()) ? xs[k++] : t);
      out.emplace_back(std::move(ts));
    } else {
      out.push_back(v);
    }
  }
  return out;
}

std::vector<Tensor> run_on(const OperatorHandle& op, const Stack& sample,
                           const std::vector<Tensor>& xs) {
  Stack s = substitute(sample, xs);
  if (mutates_self(op.info()) && s[0].is_tensor()) s[0] = IValue(s[0].to_tensor().clone());
  op.call_boxed(s);
  return outputs_of(s);
}

std::vector<Stack> differentiable_samples(const std::string& name) {
  std::vector<Stack> out;
  const auto& reg = op_sample_registry();
  const bool functional = name.back() != '_' && name.find('.') == std::string::npos;
  for (const std::string& variant : {name, name + "_", name + ".out"}) {
    auto it = reg.find(variant);
    if (it == reg.end() || (variant != name && !functional)) continue;
    for (Stack s : it->second()) {
      if (variant == name + ".out") s.pop_back();
      out.push_back(std::move(s));
    }
  }
  if (name == "max.dim" || name == "min.dim") out.push_back({random({3, 4}), int64_t{-1}, false});
  if (name == "pow" || name == "pow_") {
    out.push_back({random({2, 3}, kFloat64, 0.5, 2, 61), random({2, 3}, kFloat64, -1.5, 1.5, 62)});
    out.push_back({random({2, 3}, kFloat64, 0.5, 2, 63), random({3}, kFloat64, -1.5, 1.5, 64)});
  }
  return out;
}

}  // namespace kiln::testing
