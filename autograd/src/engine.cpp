// Note [Engine] in engine.h.
#include "kiln/autograd/engine.h"

#include <queue>
#include <unordered_map>
#include <unordered_set>

#include "batched_internal.h"
#include "kiln/autograd/anomaly.h"
#include "kiln/autograd/grad_mode.h"
#include "kiln/generated/ops.h"
#include "kiln/operators.h"

namespace kiln::autograd {
namespace {

struct Capture {
  uint32_t input_nr;
  size_t index;
};

struct GraphTask {
  std::unordered_map<Node*, int> deps;
  std::unordered_map<Node*, variable_list> buffers;
  std::unordered_map<Node*, std::vector<Capture>> captures;  // grad(): where inputs' grads arrive
  std::unordered_map<Node*, bool> needed;                     // grad(): nodes worth running
  bool capture_mode = false;
  DeferredWeightGrad* split = nullptr;  // backward_input(): Note [Split backward]
  bool keep_graph = false;
  variable_list captured;
  std::vector<std::function<void()>> callbacks;  // queue_callback()
};

// The graph tasks running on this thread, innermost last (a hook may call backward()).
thread_local std::vector<GraphTask*> running_tasks;

void accumulate(variable_list& buf, size_t i, Tensor g) {
  if (!buf[i].defined()) buf[i] = std::move(g);
  else buf[i] = buf[i] + g;
}

Tensor checked_grad(Tensor g, const InputMetadata& m, const Node& from, size_t i) {
  KILN_CHECK(g.sizes() == IntArrayRef(m.sizes), Runtime, "Function ", from.name(),
             " returned an invalid gradient at index ", i, " - got ", g.sizes(),
             " but expected shape compatible with ", IntArrayRef(m.sizes));
  if (g.dtype() != m.dtype) g = g.to(m.dtype);
  return g;
}

// Tensor hooks of the node's inputs (a leaf's for AccumulateGrad), in registration order.
void run_tensor_pre_hooks(const HookTable* h, variable_list& buf) {
  if (h == nullptr || h->tensor_pre.empty()) return;
  auto hooks = h->tensor_pre;  // a hook may register or remove hooks
  for (auto& th : hooks) {
    if (th.input_nr >= buf.size() || !buf[th.input_nr].defined()) continue;
    Tensor r = th.fn(buf[th.input_nr]);
    if (r.defined()) buf[th.input_nr] = std::move(r);
  }
}

void check_hook_result(const variable_list& r, size_t n, const Node& node, const char* kind) {
  KILN_CHECK(r.size() == n, Runtime, "hook '", kind, "' of ", node.name(), " returned ", r.size(),
             " gradients, expected ", n);
}

std::string anomaly_trace(const Node& node) {
  const std::string& st = node.creation_stack();
  if (st.empty())
    return "\n(no forward trace: anomaly mode was off when the node was created)";
  return "\nTraceback of forward call that caused the error (" + std::string(node.name()) +
         " was created here):\n" + st;
}

// Anomaly mode: the node's gradients must not hold NaN.
void check_nan(const Node& node, const variable_list& out) {
  for (size_t i = 0; i < out.size(); ++i) {
    if (!out[i].defined() || !is_floating(out[i].dtype())) continue;
    NoGradGuard ng;
    if (kiln::ne(out[i], out[i]).any().item<bool>())
      KILN_FAIL(Runtime, "Function '", node.name(), "' returned nan values in its ", i,
                "th output.", anomaly_trace(node));
  }
}

// Runs node pre-hooks, the node, and node post-hooks (Note [Hook order] in engine.h).
variable_list call_node(Node& node, variable_list&& buf) {
  HookTable* h = node.hooks();
  if (h != nullptr && !h->pre.empty()) {
    auto hooks = h->pre;
    for (auto& [id, fn] : hooks) {
      variable_list r = fn(buf);
      if (r.empty()) continue;
      check_hook_result(r, buf.size(), node, "pre-hook");
      buf = std::move(r);
    }
  }
  const bool post = h != nullptr && !h->post.empty();
  variable_list inputs_copy;
  if (post) inputs_copy = buf;
  variable_list out;
  if (AnomalyMode::is_enabled()) {
    try {
      out = node.apply(std::move(buf));
    } catch (const Error& e) {
      if (std::string(e.what()).find("Traceback of forward call") != std::string::npos) throw;
      throw Error(e.kind(), std::string(e.what()) + "\n(raised in the backward of " + node.name() +
                                ")" + anomaly_trace(node));
    }
    check_nan(node, out);
  } else {
    out = node.apply(std::move(buf));
  }
  if (post) {
    auto hooks = h->post;
    for (auto& [id, fn] : hooks) {
      variable_list r = fn(out, inputs_copy);
      if (r.empty()) continue;
      check_hook_result(r, out.size(), node, "post-hook");
      out = std::move(r);
    }
  }
  return out;
}

// Counts incoming edges of every node reachable from the roots.
void count_dependencies(GraphTask& task, const std::vector<Node*>& roots) {
  std::vector<Node*> stack;
  std::unordered_set<Node*> seen;
  for (Node* r : roots)
    if (seen.insert(r).second) stack.push_back(r);
  while (!stack.empty()) {
    Node* n = stack.back();
    stack.pop_back();
    for (const Edge& e : n->next_edges()) {
      if (!e.valid()) continue;
      task.deps[e.fn.get()]++;
      if (seen.insert(e.fn.get()).second) stack.push_back(e.fn.get());
    }
  }
}

// grad(): a node is worth running when some path from it reaches a capture.
bool compute_needed(GraphTask& task, Node* n) {
  auto it = task.needed.find(n);
  if (it != task.needed.end()) return it->second;
  task.needed[n] = false;  // the graph is acyclic; this only guards the recursion
  bool need = false;
  for (const Edge& e : n->next_edges()) {
    if (!e.valid()) continue;
    Node* c = e.fn.get();
    // Evaluated for every child (a captured node may itself lead to further captures).
    const bool below = compute_needed(task, c);
    if (below || task.captures.count(c)) need = true;
  }
  task.needed[n] = need;
  return need;
}

// backward_input(): the outputs of `node` whose edges lead to no captured input (they lead to
// parameters), which it leaves for backward_weight().
std::vector<size_t> skipped_edges(GraphTask& task, const Node& node) {
  std::vector<size_t> r;
  for (size_t i = 0; i < node.num_outputs(); ++i) {
    const Edge& e = node.next_edge(i);
    if (e.valid() && !task.needed[e.fn.get()] && !task.captures.count(e.fn.get())) r.push_back(i);
  }
  return r;
}

// Applies `node` with the edges in `masked` made invalid for the call (its formulas then skip
// those gradients: they compute an output only where should_compute_output holds).
variable_list apply_masked(Node& node, variable_list&& grads, const std::vector<size_t>& masked,
                           bool hooks) {
  std::vector<Edge>& edges = node.mutable_next_edges();
  std::vector<Edge> saved;
  for (size_t i : masked) saved.push_back(std::exchange(edges[i], Edge()));
  struct Restore {
    std::vector<Edge>& edges;
    const std::vector<size_t>& masked;
    std::vector<Edge>& saved;
    ~Restore() {
      for (size_t k = 0; k < masked.size(); ++k) edges[masked[k]] = std::move(saved[k]);
    }
  } restore{edges, masked, saved};
  return hooks ? call_node(node, std::move(grads)) : node.apply(std::move(grads));
}

void execute_nodes(GraphTask& task, const std::vector<Edge>& roots,
                   const variable_list& root_grads, bool create_graph) {
  AutoGradMode mode(create_graph);
  std::vector<Node*> root_nodes;
  for (size_t i = 0; i < roots.size(); ++i) {
    Node* n = roots[i].fn.get();
    auto& buf = task.buffers[n];
    buf.resize(n->num_inputs());
    accumulate(buf, roots[i].input_nr, root_grads[i]);
    root_nodes.push_back(n);
  }
  count_dependencies(task, root_nodes);
  if (task.capture_mode)
    for (Node* r : root_nodes) compute_needed(task, r);

  auto later_first = [](const std::shared_ptr<Node>& a, const std::shared_ptr<Node>& b) {
    return a->sequence_nr() < b->sequence_nr();
  };
  std::priority_queue<std::shared_ptr<Node>, std::vector<std::shared_ptr<Node>>, decltype(later_first)>
      ready(later_first);
  std::unordered_set<Node*> queued;
  for (const Edge& r : roots)
    if (task.deps[r.fn.get()] == 0 && queued.insert(r.fn.get()).second) ready.push(r.fn);

  while (!ready.empty()) {
    std::shared_ptr<Node> node = ready.top();
    ready.pop();
    variable_list buf = std::move(task.buffers[node.get()]);
    task.buffers.erase(node.get());
    buf.resize(node->num_inputs());
    run_tensor_pre_hooks(node->hooks(), buf);
    run_tensor_pre_hooks(node->leaf_hooks(), buf);
    for (auto& [nr, meta] : node->retained_grads()) {
      if (nr >= buf.size() || !buf[nr].defined()) continue;
      if (!meta->grad_.defined()) meta->grad_ = create_graph ? buf[nr] : buf[nr].detach().clone();
      else meta->grad_ = meta->grad_ + buf[nr];
    }
    if (task.capture_mode) {
      auto c = task.captures.find(node.get());
      if (c != task.captures.end())
        for (const Capture& cap : c->second)
          if (cap.input_nr < buf.size() && buf[cap.input_nr].defined()) {
            Tensor& dst = task.captured[cap.index];
            dst = dst.defined() ? dst + buf[cap.input_nr] : buf[cap.input_nr];
          }
      if (!task.needed[node.get()]) continue;
    }
    bool any = false;
    for (const Tensor& g : buf) any = any || g.defined();
    variable_list out;
    if (any) {
      for (size_t i = 0; i < buf.size(); ++i) {
        const InputMetadata& m = node->input_metadata(i);
        if (!buf[i].defined()) {  // a multi-output node: the unused outputs get zeros
          buf[i] = m.zeros ? Tensor(m.zeros()) : kiln::zeros(IntArrayRef(m.sizes), m.dtype, m.device);
        } else {
          buf[i] = checked_grad(std::move(buf[i]), m, *node, i);
        }
      }
      std::vector<size_t> weight_edges;
      if (task.split) weight_edges = skipped_edges(task, *node);
      if (weight_edges.empty()) {
        out = call_node(*node, std::move(buf));
        if (!task.keep_graph) node->release_variables();
      } else {
        task.split->items.push_back({node, buf, weight_edges});
        out = apply_masked(*node, std::move(buf), weight_edges, /*hooks=*/true);
      }
    }
    out.resize(node->num_outputs());
    for (size_t i = 0; i < node->num_outputs(); ++i) {
      const Edge& e = node->next_edge(i);
      if (!e.valid()) continue;
      Node* next = e.fn.get();
      if (out[i].defined()) {
        auto& nbuf = task.buffers[next];
        nbuf.resize(next->num_inputs());
        accumulate(nbuf, e.input_nr,
                   checked_grad(std::move(out[i]), next->input_metadata(e.input_nr), *node, i));
      }
      if (--task.deps[next] == 0 && queued.insert(next).second) ready.push(e.fn);
    }
  }
}

void execute(GraphTask& task, const std::vector<Edge>& roots, const variable_list& root_grads,
             bool create_graph) {
  running_tasks.push_back(&task);
  struct Pop {
    ~Pop() { running_tasks.pop_back(); }
  } pop;
  execute_nodes(task, roots, root_grads, create_graph);
  for (size_t i = 0; i < task.callbacks.size(); ++i) {
    auto fn = std::move(task.callbacks[i]);  // fn may queue more (and so grow the vector)
    fn();
  }
}

// Root edges and their gradients (implicit ones only for one-element outputs).
void prepare_roots(const variable_list& tensors, const variable_list& grads,
                   std::vector<Edge>& edges, variable_list& root_grads) {
  KILN_CHECK(grads.empty() || grads.size() == tensors.size(), Runtime, "got ", grads.size(),
             " gradients for ", tensors.size(), " tensors");
  for (size_t i = 0; i < tensors.size(); ++i) {
    const Tensor& t = tensors[i].check_defined("backward(): an output");
    Edge e = gradient_edge(t);
    KILN_CHECK(e.valid(), Runtime, "element ", i,
               " of tensors does not require grad and does not have a grad_fn");
    Tensor g = grads.empty() ? Tensor() : grads[i];
    if (!g.defined()) {
      KILN_CHECK(t.numel() == 1, Runtime,
                 "grad can be implicitly created only for scalar outputs (got an output of shape ",
                 t.sizes(), ")");
      // Below Autograd too: ones_like is composite, and its decomposition at the Autograd key
      // would make a plain tensor for a wrapper below it (a DTensor loss needs a DTensor).
      NoGradGuard ng;
      ExcludeDispatchKeyGuard below(DispatchKey::Autograd);
      g = kiln::ones_like(t);
    } else {
      KILN_CHECK(g.sizes() == t.sizes(), Runtime, "Mismatch in shape: grad_output[", i,
                 "] has a shape of ", g.sizes(), " and output[", i, "] has a shape of ", t.sizes());
    }
    edges.push_back(std::move(e));
    root_grads.push_back(std::move(g));
  }
}

// grad() and backward_input(): the gradients of `inputs` are captured where they arrive (an
// input's grad_fn slot, or its AccumulateGrad), not accumulated.
void capture_inputs(GraphTask& task, const variable_list& inputs, const char* what) {
  task.capture_mode = true;
  task.captured.resize(inputs.size());
  for (size_t i = 0; i < inputs.size(); ++i) {
    const Tensor& t = inputs[i].check_defined(what);
    AutogradMeta* m = meta_of(t);
    KILN_CHECK(m != nullptr && m->requires_grad(), Runtime,
               "One of the differentiated Tensors (input ", i, ") does not require grad");
    refresh_grad_fn(t, *m);
    std::shared_ptr<Node> fn = m->grad_fn_ ? m->grad_fn_ : m->grad_accumulator_.lock();
    if (fn) task.captures[fn.get()].push_back(Capture{m->grad_fn_ ? m->output_nr_ : 0, i});
  }
}

}  // namespace

void queue_callback(std::function<void()> fn) {
  KILN_CHECK(!running_tasks.empty(), Runtime,
             "queue_callback(): no backward pass is running on this thread");
  running_tasks.back()->callbacks.push_back(std::move(fn));
}

void backward(const variable_list& tensors, const variable_list& grad_tensors,
              std::optional<bool> retain_graph, bool create_graph) {
  KILN_CHECK(!any_batched(tensors), NotImplemented,
             "backward() of a tensor batched by vmap: use func::grad or func::vjp inside vmap");
  if (create_graph)
    KILN_WARN_ONCE("Using backward() with create_graph=true creates a reference cycle between a leaf "
                   "and its .grad (the gradient's graph saves the leaf), which leaks memory. Prefer "
                   "autograd::grad(..., create_graph=true); otherwise reset the leaves' .grad "
                   "(set_grad(Tensor())) after use to break the cycle.");
  std::vector<Edge> edges;
  variable_list root_grads;
  prepare_roots(tensors, grad_tensors, edges, root_grads);
  GraphTask task;
  task.keep_graph = retain_graph.value_or(create_graph);
  execute(task, edges, root_grads, create_graph);
}

variable_list grad(const variable_list& outputs, const variable_list& inputs,
                   const variable_list& grad_outputs, std::optional<bool> retain_graph,
                   bool create_graph, bool allow_unused) {
  // Autograd records plain tensors only (Note [vmap and autograd] in batched.h); cotangents may
  // stay batched (their logical shape is checked), outputs and inputs are translated.
  if (any_batched(outputs) || any_batched(inputs))
    return grad_of_batched(outputs, inputs, grad_outputs, retain_graph, create_graph,
                           allow_unused);
  std::vector<Edge> edges;
  variable_list root_grads;
  prepare_roots(outputs, grad_outputs, edges, root_grads);
  GraphTask task;
  task.keep_graph = retain_graph.value_or(create_graph);
  capture_inputs(task, inputs, "grad(): an input");
  execute(task, edges, root_grads, create_graph);
  for (size_t i = 0; i < inputs.size(); ++i) {
    KILN_CHECK(allow_unused || task.captured[i].defined(), Runtime,
               "One of the differentiated Tensors (input ", i,
               ") appears to not have been used in the graph. Set allow_unused=True if this is the "
               "desired behavior.");
  }
  return task.captured;
}

variable_list backward_input(const variable_list& outputs, const variable_list& inputs,
                             const variable_list& grad_outputs, DeferredWeightGrad& deferred) {
  KILN_CHECK(deferred.empty(), Value,
             "backward_input(): `deferred` still holds the weight part of an earlier backward; "
             "run backward_weight() on it first");
  KILN_CHECK(!any_batched(outputs) && !any_batched(inputs), NotImplemented,
             "backward_input() of tensors batched by vmap");
  std::vector<Edge> edges;
  variable_list root_grads;
  prepare_roots(outputs, grad_outputs, edges, root_grads);
  GraphTask task;
  task.split = &deferred;
  capture_inputs(task, inputs, "backward_input(): an input");
  // Nothing leads to the inputs (a first pipeline stage): every node is weight work.
  if (task.captures.empty()) {
    for (size_t i = 0; i < edges.size(); ++i) {
      Node* n = edges[i].fn.get();
      variable_list g(n->num_inputs());
      g[edges[i].input_nr] = root_grads[i];
      deferred.items.push_back({edges[i].fn, std::move(g), {}});
    }
    return task.captured;
  }
  execute(task, edges, root_grads, /*create_graph=*/false);
  return task.captured;
}

void backward_weight(DeferredWeightGrad& deferred) {
  std::vector<Edge> roots;
  variable_list grads;
  std::vector<std::shared_ptr<Node>> keep;  // the roots' nodes outlive the kept ones' release
  for (auto& item : deferred.items) {
    Node& n = *item.node;
    if (item.weight_edges.empty()) {  // a whole root (see backward_input): runs as backward()
      for (size_t i = 0; i < item.grads.size(); ++i)
        if (item.grads[i].defined()) {
          roots.push_back(Edge{item.node, static_cast<uint32_t>(i)});
          grads.push_back(item.grads[i]);
        }
      continue;
    }
    std::vector<size_t> others;
    for (size_t i = 0, w = 0; i < n.num_outputs(); ++i) {
      if (w < item.weight_edges.size() && item.weight_edges[w] == i)
        ++w;
      else
        others.push_back(i);
    }
    variable_list out = [&] {
      AutoGradMode mode(false);
      return apply_masked(n, std::move(item.grads), others, /*hooks=*/false);
    }();
    out.resize(n.num_outputs());
    for (size_t i : item.weight_edges) {
      const Edge& e = n.next_edge(i);
      if (!out[i].defined()) continue;
      roots.push_back(e);
      grads.push_back(checked_grad(std::move(out[i]), e.fn->input_metadata(e.input_nr), n, i));
    }
    keep.push_back(item.node);
  }
  deferred.items.clear();
  for (auto& n : keep) n->release_variables();
  if (roots.empty()) return;
  GraphTask task;
  execute(task, roots, grads, /*create_graph=*/false);
}

bool is_backward_running() { return !running_tasks.empty(); }

}  // namespace kiln::autograd
