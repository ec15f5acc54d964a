// The Batched key's kernels: one boxed kernel per batching rule of the op table, registered for
// every row by its `batching` rule (Note [Batching rules] in batched.h). The rules of nn.toml,
// loss.toml, conv.toml, pool.toml and attention.toml are in batched_rules_nn.cpp.
#include <algorithm>
#include <iostream>
#include <mutex>
#include <set>
#include <string>

#include "batched_rules.h"

namespace kiln::autograd {
namespace {

using namespace batching;

// ---- pointwise (and copy_) ---------------------------------------------------------------------

bool promotes(const Call& c, int i) {
  return c.info().args[i].role != ArgRole::Mask;
}

Result pointwise(Call& c) {
  const bool inplace = c.info().is_inplace;
  if (inplace) check_inplace_self(c);
  std::vector<int> tensor_args;
  int64_t rank = 0;
  for (int i = 0; i < c.info().num_args; ++i) {
    if (c.args[i].is_tensor_list()) return std::nullopt;
    if (!c.args[i].is_tensor()) continue;
    tensor_args.push_back(i);
    rank = std::max(rank, c.args[i].to_tensor().dim());
  }
  // Note [Batched type promotion]: a logically 0-dim example is a dimensioned tensor physically,
  // and 0-dim tensors lose to dimensioned ones in promotion; compute in the logical result type.
  std::vector<Tensor> logical, physical;
  Stack args = c.args;
  for (int i : tensor_args) {
    const Tensor& t = c.args[i].to_tensor();
    if (c.batched(t)) args[i] = pad_after_batch(front(t), rank);
    if (!promotes(c, i)) continue;
    logical.push_back(t);
    physical.push_back(args[i].to_tensor());
  }
  if (!logical.empty()) {
    ScalarType want = result_type(logical), got = result_type(physical);
    if (want != got) {
      for (int i : tensor_args) {
        if (!promotes(c, i) || (inplace && i == 0)) continue;
        const Tensor& t = args[i].to_tensor();
        if (!t.impl()->is_wrapped_number() && t.dtype() != want) args[i] = t.to(want);
      }
    }
  }
  Stack outs = run(c.op, std::move(args));
  if (inplace) return Stack{c.args[0]};
  return wrap_outputs(c, std::move(outs));
}

// ---- reduction and softmax ---------------------------------------------------------------------

Result reduction(Call& c) {
  const Tensor& self = c.args[0].to_tensor();
  if (!c.batched(self)) return std::nullopt;
  for (int i = 1; i < c.info().num_args; ++i)
    if (c.args[i].is_tensor() || c.args[i].is_tensor_list()) return std::nullopt;
  Tensor v = front(self);
  const int64_t rank = self.dim();
  const int dim_i = c.index(ArgRole::Dim);
  if (dim_i < 0) {  // max() / min(): the dim variant over the flattened example
    const bool max = c.is<ops::max>();
    if (!max && !c.is<ops::min>()) return std::nullopt;
    Tensor flat = rank == 0 ? v.unsqueeze(1) : v.flatten(1);
    Stack outs = run(max ? ops::max_dim::handle() : ops::min_dim::handle(),
                     Stack{flat, int64_t{1}, false});
    return wrap_outputs(c, Stack{outs[0]});
  }
  const bool scalar = rank == 0;  // reduce a (B, 1) view instead, then drop that dim
  if (scalar) v = v.unsqueeze(1);
  Stack args = c.args;
  args[0] = v;
  const ArgType type = c.info().args[dim_i].arg_type;
  const int keep_i = c.index(ArgRole::Keepdim);
  const bool keepdim = keep_i >= 0 && c.args[keep_i].get<bool>("keepdim");
  bool flattened_argmax = false;
  if (type == ArgType::Int) {
    args[dim_i] = wrap_dim(c, c.args[dim_i].to_int(), rank) + 1;
  } else if (type == ArgType::OptionalInt) {
    if (c.args[dim_i].is_none()) {  // argmax/argmin over the flattened example
      args[0] = scalar ? v : v.flatten(1);
      args[dim_i] = int64_t{1};
      if (keep_i >= 0) args[keep_i] = false;
      flattened_argmax = true;
    } else {
      args[dim_i] = wrap_dim(c, c.args[dim_i].to_int(), rank) + 1;
    }
  } else if (type == ArgType::IntList || type == ArgType::OptionalIntList) {
    std::vector<int64_t> dims;
    if (!c.args[dim_i].is_none()) dims = c.args[dim_i].get<std::vector<int64_t>>("dim");
    if (dims.empty()) {
      for (int64_t d = 1; d <= std::max<int64_t>(rank, 1); ++d) dims.push_back(d);
    } else {
      for (int64_t& d : dims) d = wrap_dim(c, d, rank) + 1;
    }
    args[dim_i] = dims;
  } else {
    return std::nullopt;
  }
  Stack outs = run(c.op, std::move(args));
  for (IValue& o : outs) {
    if (!o.is_tensor()) return std::nullopt;
    Tensor t = o.to_tensor();
    if (scalar && t.dim() == 2) t = t.squeeze(std::vector<int64_t>{1});
    if (flattened_argmax && keepdim) {
      std::vector<int64_t> sizes(rank + 1, 1);
      sizes[0] = c.batch;
      t = t.reshape(sizes);
    }
    o = t;
  }
  return wrap_outputs(c, std::move(outs));
}

// ---- views and shape ops -----------------------------------------------------------------------

Result view(Call& c) {
  const Tensor& self = c.args[0].to_tensor();
  if (!c.batched(self)) return std::nullopt;
  for (int i = 1; i < c.info().num_args; ++i)
    if (c.args[i].is_tensor() || c.args[i].is_tensor_list()) return std::nullopt;
  const int64_t rank = self.dim();
  Tensor v = front(self);
  Stack args = c.args;
  args[0] = v;
  if (c.is<ops::alias>()) return wrap_outputs(c, run(c.op, std::move(args)));
  if (c.is<ops::t>()) {
    if (rank > 2) return std::nullopt;
    return wrap_outputs(c, Stack{rank < 2 ? v.alias() : v.transpose(1, 2)});
  }
  if (c.is<ops::expand>()) {
    std::vector<int64_t> size = c.args[1].get<std::vector<int64_t>>("size");
    if (static_cast<int64_t>(size.size()) < rank) return std::nullopt;
    size.insert(size.begin(), c.batch);
    return wrap_outputs(c, Stack{pad_after_batch(v, size.size() - 1).expand(size)});
  }
  if (c.is<ops::flatten>() && rank == 0) return wrap_outputs(c, Stack{v.unsqueeze(1)});
  if (c.is<ops::squeeze>()) {
    std::vector<int64_t> dims;
    if (c.args[1].is_none()) {
      for (int64_t d = 0; d < rank; ++d)
        if (self.size(d) == 1) dims.push_back(d + 1);
    } else {
      for (int64_t d : c.args[1].get<std::vector<int64_t>>("dim"))
        dims.push_back(wrap_dim(c, d, rank) + 1);
      if (dims.empty()) return std::nullopt;
    }
    if (dims.empty()) return wrap_outputs(c, Stack{v.alias()});
    args[1] = dims;
    return wrap_outputs(c, run(c.op, std::move(args)));
  }
  const bool unsqueeze = c.is<ops::unsqueeze>();
  if (rank == 0 && !c.is<ops::view>() && !c.is<ops::reshape>() && !unsqueeze &&
      !c.is<ops::permute>())
    return std::nullopt;  // dims of a 0-dim example: let the loop raise or handle them
  for (int i = 1; i < c.info().num_args; ++i) {
    const ArgRole role = c.info().args[i].role;
    const ArgType type = c.info().args[i].arg_type;
    if (c.args[i].is_none()) continue;
    if (type == ArgType::Int && role == ArgRole::Dim) {
      const int64_t r = unsqueeze ? rank + 1 : rank;
      args[i] = wrap_dim(c, c.args[i].to_int(), r) + 1;
    } else if (role == ArgRole::Size) {
      std::vector<int64_t> s = c.args[i].get<std::vector<int64_t>>("size");
      s.insert(s.begin(), c.batch);
      args[i] = s;
    } else if (role == ArgRole::Dims) {
      std::vector<int64_t> s{0};
      for (int64_t d : c.args[i].get<std::vector<int64_t>>("dims"))
        s.push_back(wrap_dim(c, d, rank) + 1);
      args[i] = s;
    } else if (role == ArgRole::Sizes) {
      continue;  // unflatten's sizes (of the one dim they replace), split_with_sizes' pieces
    } else if (type == ArgType::Int || type == ArgType::OptionalInt) {
      continue;  // indices, starts, lengths, sizes of splits: per example, unchanged
    } else {
      return std::nullopt;  // as_strided's geometry and anything else: the loop
    }
  }
  return wrap_outputs(c, run(c.op, std::move(args)));
}

// ---- matmul family -----------------------------------------------------------------------------

// matmul of two arguments (at least one batched at the call's level), physical and batched.
Result matmul_of(Call& c, const Tensor& a, const Tensor& b) {
  const bool ab = c.batched(a), bb = c.batched(b);
  int64_t ra = a.dim(), rb = b.dim();
  if (ra == 0 || rb == 0) return std::nullopt;
  Tensor x = ab ? front(a) : a, y = bb ? front(b) : b;
  const bool row_a = ab && ra == 1, col_b = bb && rb == 1;
  if (row_a) x = x.unsqueeze(1), ra = 2;  // (B, k) -> (B, 1, k)
  if (col_b) y = y.unsqueeze(2), rb = 2;  // (B, k) -> (B, k, 1)
  const int64_t r = std::max(ra, rb);
  if (ab) x = pad_after_batch(x, r);
  if (bb) y = pad_after_batch(y, r);
  Tensor out = kiln::matmul(x, y);
  const bool b_has_cols = !(rb == 1 && !bb);
  if (col_b) out = out.squeeze(std::vector<int64_t>{-1});
  if (row_a) out = out.squeeze(std::vector<int64_t>{(b_has_cols && !col_b) ? -2 : -1});
  return wrap_outputs(c, Stack{out});
}

Result matmul_rule(Call& c) {
  const bool mm = c.is<ops::mm>(), matmul = c.is<ops::matmul>();
  if (mm || matmul || c.is<ops::bmm>()) {
    const Tensor &a = c.args[0].to_tensor(), &b = c.args[1].to_tensor();
    const int64_t want = mm ? 2 : 3;
    if (!matmul && (a.dim() != want || b.dim() != want)) return std::nullopt;
    return matmul_of(c, a, b);
  }
  // The others decompose into logical ops on the BatchedTensors (each hits its own rule).
  if (c.is<ops::addmm>()) {
    const Tensor &self = c.args[0].to_tensor(), &m1 = c.args[1].to_tensor(),
                 &m2 = c.args[2].to_tensor();
    if (m1.dim() != 2 || m2.dim() != 2) return std::nullopt;
    const Scalar beta = c.args[3].to_scalar(), alpha = c.args[4].to_scalar();
    Tensor prod = kiln::matmul(m1, m2);
    if (beta.to<double>() == 0) {
      Tensor out = kiln::mul(prod, scalar_to_tensor(alpha));
      if (!c.batched(out)) out = make_batched(front_or_expand(c, out), 0, c.level);
      return Stack{out};
    }
    Tensor s = beta.to<double>() == 1 ? self : kiln::mul(self, scalar_to_tensor(beta));
    return Stack{kiln::add(s, prod, alpha)};
  }
  if (c.is<ops::linear>()) {
    const Tensor &x = c.args[0].to_tensor(), &w = c.args[1].to_tensor();
    Tensor out = kiln::matmul(x, w.dim() == 2 ? w.t() : w);
    if (!c.args[2].is_none()) out = kiln::add(out, c.args[2].to_tensor());
    return Stack{out};
  }
  return std::nullopt;
}

// ---- ops whose only batched argument is self: creation (*_like), random, copies -----------------

Result on_self(Call& c) {
  const Tensor& self = c.args[0].to_tensor();
  if (!c.batched(self)) return std::nullopt;
  for (int i = 1; i < c.info().num_args; ++i)
    if (c.args[i].is_tensor() || c.args[i].is_tensor_list()) return std::nullopt;
  Stack args = c.args;
  args[0] = front(self);
  Stack outs = run(c.op, std::move(args));
  if (c.info().is_inplace) return Stack{c.args[0]};
  return wrap_outputs(c, std::move(outs));
}

Result copy_rule(Call& c) {
  if (c.info().is_inplace) return pointwise(c);  // copy_(self, src): src broadcasts into self
  return on_self(c);
}

// ---- cat / stack -------------------------------------------------------------------------------

Result cat_rule(Call& c) {
  if (!c.args[0].is_tensor_list()) return std::nullopt;
  const std::vector<Tensor>& ts = c.args[0].to_tensor_list();
  if (ts.empty()) return std::nullopt;
  const bool stack = c.is<ops::stack>();
  int64_t rank = 0;
  for (const Tensor& t : ts) rank = std::max(rank, t.dim());
  // cat skips 1-d empty members among higher-rank ones (PyTorch's legacy rule); they still
  // take part in type promotion.
  auto skipped = [&](const Tensor& t) {
    return !stack && rank != 1 && t.dim() == 1 && t.size(0) == 0;
  };
  std::vector<Tensor> phys;
  for (const Tensor& t : ts) {
    if (skipped(t)) continue;
    if (t.dim() != rank) return std::nullopt;  // a rank error: the loop raises it
    phys.push_back(front_or_expand(c, t));
  }
  if (phys.empty()) return std::nullopt;
  const ScalarType want = result_type(TensorList(ts));
  if (result_type(TensorList(phys)) != want)
    for (Tensor& t : phys) t = t.to(want);
  Stack args = c.args;
  args[0] = phys;
  args[1] = wrap_dim(c, c.args[1].to_int(), stack ? rank + 1 : rank) + 1;
  return wrap_outputs(c, run(c.op, std::move(args)));
}

// ---- gather / scatter / index_select -----------------------------------------------------------

Result index_rule(Call& c) {
  const Tensor& self = c.args[0].to_tensor();
  const int64_t rank = self.dim();
  if (rank == 0) return std::nullopt;
  const int64_t dim = wrap_dim(c, c.args[1].to_int(), rank) + 1;
  if (c.is<ops::index_select>()) {
    const Tensor& index = c.args[2].to_tensor();
    if (!c.batched(index))
      return wrap_outputs(c, Stack{kiln::index_select(front(self), dim, index)});
    // A different index per example: gather along dim with the index broadcast over the rest.
    Tensor idx = front(index);
    if (idx.dim() == 1) idx = idx.unsqueeze(1);
    if (idx.dim() != 2) return std::nullopt;
    Tensor src = front_or_expand(c, self);
    std::vector<int64_t> view(src.dim(), 1);
    view[0] = c.batch;
    view[dim] = idx.size(1);
    DimVector target(src.sizes());
    target[dim] = idx.size(1);
    return wrap_outputs(
        c, Stack{kiln::gather(src, dim, idx.reshape(view).expand(IntArrayRef(target)))});
  }
  const bool inplace = c.info().is_inplace;
  if (inplace) check_inplace_self(c);
  Stack args = c.args;
  args[1] = dim;
  for (int i = 0; i < c.info().num_args; ++i) {
    if (c.args[i].is_tensor_list()) return std::nullopt;
    if (!c.args[i].is_tensor()) continue;
    const Tensor& t = c.args[i].to_tensor();
    if (t.dim() != rank) return std::nullopt;
    args[i] = front_or_expand(c, t);
  }
  Stack outs = run(c.op, std::move(args));
  if (inplace) return Stack{c.args[0]};
  return wrap_outputs(c, std::move(outs));
}

// ---- the per-example loop ----------------------------------------------------------------------

std::mutex g_fallback_mutex;
std::set<const OperatorHandle*>& fallback_ops() {
  static std::set<const OperatorHandle*> s;
  return s;
}

// Warned once per op and process; the recorded set can be cleared (tests), the warnings not.
void note_fallback(const OperatorHandle& op) {
  static std::set<const OperatorHandle*> warned;
  std::lock_guard<std::mutex> lock(g_fallback_mutex);
  fallback_ops().insert(&op);
  if (warned.insert(&op).second)
    std::cerr << "vmap: no batching rule for " << op.name()
              << "; using the slow per-example loop\n";
}

Stack per_example(Call& c) {
  note_fallback(c.op);
  if (c.info().is_inplace) check_inplace_self(c);
  KILN_CHECK(c.batch > 0, NotImplemented, "vmap: ", c.name(),
             " has no batching rule, and its per-example loop needs at least one example");
  Stack phys = c.args;
  for (IValue& v : phys) {
    if (v.is_tensor() && c.batched(v.to_tensor())) {
      v = front(v.to_tensor());
    } else if (v.is_tensor_list()) {
      std::vector<Tensor> ts;
      for (const Tensor& t : v.to_tensor_list()) ts.push_back(c.batched(t) ? front(t) : t);
      v = ts;
    }
  }
  std::vector<Stack> per;
  for (int64_t b = 0; b < c.batch; ++b) {
    Stack args = phys;
    for (int i = 0; i < c.info().num_args; ++i) {
      if (c.args[i].is_tensor() && c.batched(c.args[i].to_tensor())) {
        args[i] = phys[i].to_tensor().select(0, b);
      } else if (c.args[i].is_tensor_list()) {
        const auto& orig = c.args[i].to_tensor_list();
        std::vector<Tensor> ts = phys[i].to_tensor_list();
        for (size_t j = 0; j < ts.size(); ++j)
          if (c.batched(orig[j])) ts[j] = ts[j].select(0, b);
        args[i] = ts;
      }
    }
    per.push_back(run(c.op, std::move(args)));
  }
  if (c.info().is_inplace) return Stack{c.args[0]};
  Stack outs;
  for (size_t j = 0; j < per[0].size(); ++j) {
    if (per[0][j].is_tensor()) {
      std::vector<Tensor> ts;
      for (const Stack& s : per) ts.push_back(s[j].to_tensor());
      outs.push_back(make_batched(kiln::stack(ts, 0), 0, c.level));
    } else if (per[0][j].is_tensor_list()) {
      std::vector<Tensor> list;
      for (size_t k = 0; k < per[0][j].to_tensor_list().size(); ++k) {
        std::vector<Tensor> ts;
        for (const Stack& s : per) ts.push_back(s[j].to_tensor_list()[k]);
        list.push_back(make_batched(kiln::stack(ts, 0), 0, c.level));
      }
      outs.push_back(list);
    } else {
      outs.push_back(per[0][j]);
    }
  }
  return outs;
}

Result fallback_rule(Call&) { return std::nullopt; }

// out= variants: the functional op (batched by its own rule), copied into `out`.
Result out_variant(Call& c) {
  const OperatorHandle* f = c.info().functional;
  const int out_i = c.info().num_args - 1;  // the generator appends out= last
  if (f == nullptr || out_i < 0) return std::nullopt;
  Stack args;
  for (int i = 0; i < c.info().num_args; ++i)
    if (i != out_i) args.push_back(c.args[i]);
  Stack r = run(*f, std::move(args));
  if (r.size() != 1 || !r[0].is_tensor()) return std::nullopt;
  const Tensor& out = c.args[out_i].to_tensor();
  const Tensor& result = r[0].to_tensor();
  KILN_CHECK(out.sizes() == result.sizes(), NotImplemented, "vmap: ", c.name(),
             ": out= is not resized inside vmap; pass an out of the result's shape ",
             result.sizes(), " (got ", out.sizes(), ")");
  out.copy_(result);
  return Stack{out};
}

// ---- the kernels -------------------------------------------------------------------------------

using Rule = Result (*)(Call&);

template <Rule R>
void batched_kernel(const OperatorHandle& op, DispatchKeySet, Stack& stack) {
  const int n = op.info().num_args;
  Call c{op, Stack(stack.end() - n, stack.end())};
  stack.resize(stack.size() - n);
  auto visit = [&](const Tensor& t) {
    if (!t.defined()) return;
    const int64_t l = batched_level(t);
    if (l <= c.level) return;
    c.level = l;
  };
  for (const IValue& v : c.args) {
    if (v.is_tensor())
      visit(v.to_tensor());
    else if (v.is_tensor_list())
      for (const Tensor& t : v.to_tensor_list()) visit(t);
  }
  KILN_ASSERT(c.level > 0, op.name(), ": Batched kernel without a BatchedTensor argument");
  auto batch_of = [&](const Tensor& t) {
    if (c.batched(t)) c.batch = batched_value(t).size(batched_bdim(t));
  };
  for (const IValue& v : c.args) {
    if (v.is_tensor()) batch_of(v.to_tensor());
    if (v.is_tensor_list())
      for (const Tensor& t : v.to_tensor_list()) batch_of(t);
  }
  Result out = c.info().is_out ? out_variant(c) : R(c);
  if (!out) out = per_example(c);
  for (IValue& v : *out) stack.push_back(std::move(v));
}

BoxedKernel kernel_for(BatchingRule rule) {
  switch (rule) {
    case BatchingRule::Pointwise: return &batched_kernel<pointwise>;
    case BatchingRule::Reduction:
    case BatchingRule::Softmax: return &batched_kernel<reduction>;
    case BatchingRule::View: return &batched_kernel<view>;
    case BatchingRule::Matmul: return &batched_kernel<matmul_rule>;
    case BatchingRule::Creation:
    case BatchingRule::Random: return &batched_kernel<on_self>;
    case BatchingRule::Copy: return &batched_kernel<copy_rule>;
    case BatchingRule::Cat: return &batched_kernel<cat_rule>;
    case BatchingRule::Index: return &batched_kernel<index_rule>;
    case BatchingRule::Conv: return &batched_kernel<conv_rule>;
    case BatchingRule::Pool: return &batched_kernel<pool_rule>;
    case BatchingRule::Rowwise: return &batched_kernel<rowwise_rule>;
    case BatchingRule::Fallback: return &batched_kernel<fallback_rule>;
    case BatchingRule::Composite: break;  // registers nothing (see KILN_LIBRARY below)
  }
  KILN_ASSERT(false, "no Batched kernel for batching rule ", to_string(rule));
  return nullptr;
}

}  // namespace

KILN_LIBRARY(Batched, m) {
  // Rule "composite": the row's decomposition, registered for every key, stays the Batched
  // kernel too, so each op of it hits its own rule.
  for (OperatorHandle* op : Dispatcher::get().ops())
    if (op->info().batching != BatchingRule::Composite)
      Dispatcher::get().register_kernel(*op, m.key(), nullptr, kernel_for(op->info().batching));
}

}  // namespace kiln::autograd

namespace kiln::func {

std::vector<std::string> vmap_fallback_ops() {
  std::lock_guard<std::mutex> lock(autograd::g_fallback_mutex);
  std::set<std::string> names;  // sorted by name, as before
  for (const OperatorHandle* op : autograd::fallback_ops()) names.insert(op->name());
  return {names.begin(), names.end()};
}

void clear_vmap_fallback_ops() {
  std::lock_guard<std::mutex> lock(autograd::g_fallback_mutex);
  autograd::fallback_ops().clear();
}

}  // namespace kiln::func
