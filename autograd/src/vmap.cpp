// func::vmap (functional.h): wraps the batched inputs at a new level, runs f, unwraps.
#include "kiln/autograd/batched.h"
#include "kiln/autograd/functional.h"
#include "kiln/generated/ops.h"

namespace kiln::func {
namespace {

using autograd::batched_bdim;
using autograd::batched_level;
using autograd::batched_value;

// `v` with dim `from` moved to `to` (a permute, so autograd records it).
Tensor move_dim(const Tensor& v, int64_t from, int64_t to) {
  if (from == to) return v;
  std::vector<int64_t> perm;
  for (int64_t d = 0; d < v.dim(); ++d)
    if (d != from) perm.push_back(d);
  perm.insert(perm.begin() + to, from);
  return v.permute(perm);
}

std::vector<Tensor> run_once(const MultiFn& f, const std::vector<Tensor>& xs,
                             const std::vector<std::optional<int64_t>>& dims,
                             const std::vector<int64_t>& out_dims, int64_t batch) {
  autograd::VmapLevelGuard guard(batch);
  std::vector<Tensor> wrapped;
  for (size_t i = 0; i < xs.size(); ++i)
    wrapped.push_back(dims[i] ? autograd::make_batched(xs[i], *dims[i], guard.level()) : xs[i]);
  std::vector<Tensor> outs = f(wrapped);
  KILN_CHECK(out_dims.empty() || out_dims.size() == outs.size(), Value, "vmap: out_dims has ",
             out_dims.size(), " entries but the function returned ", outs.size(), " outputs");
  for (size_t i = 0; i < outs.size(); ++i) {
    const Tensor& o = outs[i];
    KILN_CHECK(o.defined(), Value, "vmap: the function returned an undefined tensor (output ", i,
               ")");
    int64_t od = out_dims.empty() ? 0 : out_dims[i];
    const int64_t rank = o.dim() + 1;
    KILN_CHECK(od >= -rank && od < rank, Value, "vmap: out_dim ", od, " of output ", i,
               " is out of range for an output of ", rank - 1, " dims per example");
    if (od < 0) od += rank;
    if (batched_level(o) == guard.level()) {
      outs[i] = move_dim(batched_value(o), batched_bdim(o), od);
    } else {  // an output that does not depend on the batch: every example gets it
      DimVector sizes(o.sizes());
      sizes.insert(od, batch);
      outs[i] = o.unsqueeze(od).expand(IntArrayRef(sizes));
    }
  }
  return outs;
}

}  // namespace

MultiFn vmap(const MultiFn& f, std::vector<std::optional<int64_t>> in_dims,
             std::vector<int64_t> out_dims, std::optional<int64_t> chunk_size) {
  return [f, in_dims, out_dims, chunk_size](const std::vector<Tensor>& xs) {
    KILN_CHECK(in_dims.empty() || in_dims.size() == xs.size(), Value, "vmap: in_dims has ",
               in_dims.size(), " entries but the function got ", xs.size(), " inputs");
    std::vector<std::optional<int64_t>> dims(xs.size(), int64_t{0});
    int64_t batch = -1;
    for (size_t i = 0; i < xs.size(); ++i) {
      if (!in_dims.empty()) dims[i] = in_dims[i];
      if (!dims[i]) continue;
      const Tensor& x = xs[i];
      KILN_CHECK(x.defined(), Value, "vmap: input ", i, " is an undefined tensor");
      const int64_t d = *dims[i], r = x.dim();
      KILN_CHECK(d >= -r && d < r, Value, "vmap: in_dim ", d, " of input ", i,
                 " is out of range for a tensor of shape ", x.sizes(),
                 (r == 0 ? " (a 0-dim tensor cannot be batched; use in_dim None)" : ""));
      dims[i] = d < 0 ? d + r : d;
      const int64_t b = x.size(*dims[i]);
      KILN_CHECK(batch < 0 || b == batch, Value,
                 "vmap: expected all batched inputs to have the same batch size, but input ", i,
                 " has size ", b, " at in_dim ", *dims[i], " while an earlier input has ", batch);
      batch = b;
    }
    KILN_CHECK(batch >= 0, Value, "vmap: at least one input must be batched (every in_dim is None",
               xs.empty() ? ", and the function got no inputs)" : ")");
    if (!chunk_size || *chunk_size >= batch) return run_once(f, xs, dims, out_dims, batch);
    KILN_CHECK(*chunk_size > 0, Value, "vmap: chunk_size must be positive, got ", *chunk_size);
    std::vector<std::vector<Tensor>> pieces;
    for (int64_t start = 0; start < batch; start += *chunk_size) {
      const int64_t len = std::min(*chunk_size, batch - start);
      std::vector<Tensor> part = xs;
      for (size_t i = 0; i < xs.size(); ++i)
        if (dims[i]) part[i] = xs[i].narrow(*dims[i], start, len);
      pieces.push_back(run_once(f, part, dims, out_dims, len));
    }
    std::vector<Tensor> outs;
    for (size_t j = 0; j < pieces[0].size(); ++j) {
      std::vector<Tensor> parts;
      for (const auto& p : pieces) parts.push_back(p[j]);
      int64_t od = out_dims.empty() ? 0 : out_dims[j];
      outs.push_back(kiln::cat(parts, od < 0 ? od + parts[0].dim() : od));
    }
    return outs;
  };
}

Fn vmap(const Fn& f, std::vector<std::optional<int64_t>> in_dims, int64_t out_dim,
        std::optional<int64_t> chunk_size) {
  MultiFn multi = [f](const std::vector<Tensor>& xs) { return std::vector<Tensor>{f(xs)}; };
  MultiFn v = vmap(multi, std::move(in_dims), std::vector<int64_t>{out_dim}, chunk_size);
  return [v](const std::vector<Tensor>& xs) { return v(xs)[0]; };
}

UnaryFn vmap(const UnaryFn& f, int64_t in_dim, int64_t out_dim) {
  Fn v = vmap(Fn([f](const std::vector<Tensor>& xs) { return f(xs[0]); }),
              std::vector<std::optional<int64_t>>{in_dim}, out_dim);
  return [v](const Tensor& x) { return v({x}); };
}

}  // namespace kiln::func
