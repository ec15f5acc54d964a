// DeviceMesh (kiln/dist/device_mesh.h): mesh state, sub-meshes, flattening and the creation of
// the per-dim process groups (See Note [Mesh groups]).
#include "kiln/dist/device_mesh.h"

#include <algorithm>
#include <atomic>
#include <map>
#include <mutex>
#include <numeric>
#include <sstream>

#include "kiln/dist/remote.h"

namespace kiln::dist {

namespace {

// A flattened mesh as its root remembers it (See Note [Mesh groups]).
struct FlatEntry {
  std::vector<int64_t> root_dims;
  std::vector<int> ranks;
  ProcessGroupPtr group;
};

struct RootState {
  int64_t id = 0;  // See DeviceMesh::root_id()
  std::string device_type;
  std::vector<int64_t> shape;
  std::vector<int> ranks;  // row-major
  std::mutex mu;
  std::map<std::string, FlatEntry, std::less<>> flattened;
  // block_group()'s: this rank's group of k consecutive ranks, by (root dims, k).
  std::map<std::pair<std::vector<int64_t>, int64_t>, ProcessGroupPtr> block_groups;
};

std::string join(const std::vector<std::string>& names, const char* sep) {
  std::string s;
  for (const auto& n : names) s += (s.empty() ? "" : sep) + n;
  return s;
}

std::string quoted(const std::vector<std::string>& names) {
  std::string s;
  for (const auto& n : names) s += (s.empty() ? "'" : ", '") + n + "'";
  return "(" + s + ")";
}

int world_rank() { return default_group()->rank(); }

// The coordinates of `index` (row-major) in `shape`.
std::vector<int64_t> unravel(int64_t index, const std::vector<int64_t>& shape) {
  std::vector<int64_t> c(shape.size());
  for (size_t i = shape.size(); i-- > 0;) {
    c[i] = index % shape[i];
    index /= shape[i];
  }
  return c;
}

// Every block of `root` that varies only along `dims` (increasing), each as its ranks in
// row-major order over `dims`; the blocks come in row-major order over the other dims.
std::vector<std::vector<int>> blocks(const RootState& root, const std::vector<int64_t>& dims) {
  std::map<std::vector<int64_t>, std::vector<int>> by_rest;  // ordered: the same on every rank
  for (size_t i = 0; i < root.ranks.size(); ++i) {
    std::vector<int64_t> c = unravel(static_cast<int64_t>(i), root.shape), rest;
    for (size_t d = 0; d < c.size(); ++d)
      if (std::find(dims.begin(), dims.end(), static_cast<int64_t>(d)) == dims.end())
        rest.push_back(c[d]);
    by_rest[rest].push_back(root.ranks[i]);  // i increases row-major, so dims stay row-major
  }
  std::vector<std::vector<int>> out;
  for (auto& [rest, ranks] : by_rest) out.push_back(std::move(ranks));
  return out;
}

// The group of this rank among `blocks` (every rank creates every one: Note [Mesh groups]).
ProcessGroupPtr make_groups(const std::vector<std::vector<int>>& bs) {
  ProcessGroupPtr world = default_group();
  ProcessGroupPtr mine;
  for (const auto& ranks : bs) {
    if (ranks == world->ranks()) return world;
    ProcessGroupPtr g = new_group(ranks);
    if (g) mine = g;
  }
  return mine;
}

}  // namespace

struct MeshState {
  std::string device_type;
  std::vector<int64_t> shape;
  std::vector<std::string> names;
  std::vector<int> ranks;
  std::vector<ProcessGroupPtr> groups;          // per mesh dim; null where not a member
  std::vector<std::vector<int64_t>> root_dims;  // per mesh dim: the root dims it spans
  std::shared_ptr<RootState> root;
};

namespace {

// The root dims a mesh spans, in its dims' order.
std::vector<int64_t> flat_root_dims(const MeshState& m) {
  std::vector<int64_t> dims;
  for (const auto& rd : m.root_dims) dims.insert(dims.end(), rd.begin(), rd.end());
  return dims;
}

}  // namespace

const MeshState& DeviceMesh::state() const {
  KILN_CHECK(state_ != nullptr, Value, "DeviceMesh: the mesh is undefined");
  return *state_;
}

const std::string& DeviceMesh::device_type() const { return state().device_type; }
int64_t DeviceMesh::root_id() const { return state().root->id; }
const std::vector<std::vector<int64_t>>& DeviceMesh::root_dims() const { return state().root_dims; }
int64_t DeviceMesh::ndim() const { return static_cast<int64_t>(state().shape.size()); }
const std::vector<int64_t>& DeviceMesh::shape() const { return state().shape; }
const std::vector<std::string>& DeviceMesh::dim_names() const { return state().names; }
const std::vector<int>& DeviceMesh::ranks() const { return state().ranks; }
int64_t DeviceMesh::size() const { return static_cast<int64_t>(state().ranks.size()); }

int64_t DeviceMesh::size(int64_t dim) const {
  const int64_t n = ndim();
  KILN_CHECK(dim >= -n && dim < n, Index, "DeviceMesh.size: dim ", dim,
             " out of range for a mesh of ", n, " dims");
  return state().shape[dim < 0 ? dim + n : dim];
}

std::vector<int64_t> DeviceMesh::coordinate() const {
  const auto& r = state().ranks;
  auto it = std::find(r.begin(), r.end(), world_rank());
  if (it == r.end()) return {};
  return unravel(it - r.begin(), state().shape);
}

int64_t DeviceMesh::local_rank(int64_t dim) const {
  std::vector<int64_t> c = coordinate();
  KILN_CHECK(!c.empty(), Value, "DeviceMesh: rank ", world_rank(), " is not in ", str());
  size(dim);  // range check
  return c[dim < 0 ? dim + ndim() : dim];
}

int64_t DeviceMesh::dim_index(std::string_view name) const {
  const auto& names = state().names;
  auto it = std::find(names.begin(), names.end(), name);
  KILN_CHECK(it != names.end(), Value, "DeviceMesh: no mesh dim named '", name,
             "' (the mesh's dims: ", names.empty() ? "unnamed" : quoted(names), ")");
  return it - names.begin();
}

ProcessGroupPtr DeviceMesh::group(int64_t dim) const {
  size(dim);  // range check
  ProcessGroupPtr g = state().groups[dim < 0 ? dim + ndim() : dim];
  KILN_CHECK(g != nullptr, Value, "DeviceMesh: rank ", world_rank(), " is not in ", str());
  return g;
}

ProcessGroupPtr DeviceMesh::group(std::string_view dim_name) const {
  return group(dim_index(dim_name));
}

ProcessGroupPtr DeviceMesh::block_group(int64_t dim, int64_t k) const {
  const int64_t n = size(dim);  // range check
  if (dim < 0) dim += ndim();
  KILN_CHECK(k > 0 && n % k == 0, Value, "DeviceMesh.block_group: ", k,
             " is not a positive divisor of the size ", n, " of mesh dim ", dim, " of ", str());
  if (k == n) return group(dim);
  const MeshState& s = state();
  KILN_CHECK(!coordinate().empty(), Value, "DeviceMesh: rank ", world_rank(), " is not in ", str());
  RootState& root = *s.root;
  std::lock_guard<std::mutex> lock(root.mu);
  auto [it, fresh] = root.block_groups.try_emplace({s.root_dims[dim], k});
  if (!fresh) return it->second;
  // Every block of the root along the dim's root dims, in the same order on every rank, cut into
  // runs of k (See Note [Mesh groups]).
  std::vector<std::vector<int>> runs;
  for (const std::vector<int>& b : blocks(root, s.root_dims[dim]))
    for (size_t i = 0; i < b.size(); i += k) runs.emplace_back(b.begin() + i, b.begin() + i + k);
  it->second = make_groups(runs);
  return it->second;
}

DeviceMesh DeviceMesh::submesh(const std::vector<std::string>& names) const {
  const MeshState& s = state();
  KILN_CHECK(!names.empty(), Value, "DeviceMesh: a sub-mesh needs at least one dim name");
  if (names.size() == 1 && s.root) {  // a flattened mesh, by the name it was given
    std::lock_guard<std::mutex> lock(s.root->mu);
    auto it = s.root->flattened.find(names[0]);
    if (it != s.root->flattened.end() &&
        std::find(s.names.begin(), s.names.end(), names[0]) == s.names.end()) {
      auto m = std::make_shared<MeshState>();
      m->device_type = s.device_type;
      m->shape = {static_cast<int64_t>(it->second.ranks.size())};
      m->names = {names[0]};
      m->ranks = it->second.ranks;
      m->groups = {it->second.group};
      m->root_dims = {it->second.root_dims};
      m->root = s.root;
      return DeviceMesh(std::move(m));
    }
  }
  std::vector<int64_t> dims;
  for (const auto& n : names) {
    const int64_t d = dim_index(n);
    KILN_CHECK(dims.empty() || d > dims.back(), Value, "DeviceMesh: sub-mesh dims ", quoted(names),
               " must be distinct and in the mesh's order ", quoted(s.names));
    dims.push_back(d);
  }
  std::vector<int64_t> me = coordinate();
  KILN_CHECK(!me.empty(), Value, "DeviceMesh: rank ", world_rank(), " is not in ", str());
  auto m = std::make_shared<MeshState>();
  m->device_type = s.device_type;
  m->root = s.root;
  for (int64_t d : dims) {
    m->shape.push_back(s.shape[d]);
    m->names.push_back(s.names[d]);
    m->groups.push_back(s.groups[d]);
    m->root_dims.push_back(s.root_dims[d]);
  }
  for (size_t i = 0; i < s.ranks.size(); ++i) {
    std::vector<int64_t> c = unravel(static_cast<int64_t>(i), s.shape);
    bool same = true;
    for (size_t d = 0; d < c.size(); ++d)
      if (std::find(dims.begin(), dims.end(), static_cast<int64_t>(d)) == dims.end())
        same = same && c[d] == me[d];
    if (same) m->ranks.push_back(s.ranks[i]);
  }
  return DeviceMesh(std::move(m));
}

DeviceMesh DeviceMesh::flatten(std::string name) const {
  const MeshState& s = state();
  if (name.empty()) name = join(s.names, "_");
  KILN_CHECK(!name.empty(), Value, "DeviceMesh.flatten: an unnamed mesh needs a name");
  if (ndim() == 1 && (s.names.empty() || s.names[0] == name)) return *this;
  const std::vector<int64_t> dims = flat_root_dims(s);
  KILN_CHECK(std::is_sorted(dims.begin(), dims.end()), Value, "DeviceMesh.flatten: ", str(),
             " orders its dims unlike its root mesh (concat_meshes), so it cannot be flattened");
  RootState& root = *s.root;
  {
    std::lock_guard<std::mutex> lock(root.mu);
    auto it = root.flattened.find(name);
    if (it != root.flattened.end()) {
      KILN_CHECK(it->second.root_dims == dims, Value, "DeviceMesh.flatten: the name '", name,
                 "' is taken by another flattened mesh");
    } else {
      auto bs = blocks(root, dims);
      FlatEntry e{dims, {}, make_groups(bs)};
      for (auto& b : bs)
        if (std::find(b.begin(), b.end(), world_rank()) != b.end()) e.ranks = b;
      root.flattened.emplace(name, std::move(e));
    }
  }
  return DeviceMesh(state_).submesh({name});
}

bool DeviceMesh::operator==(const DeviceMesh& o) const {
  if (state_ == o.state_) return true;
  if (!state_ || !o.state_) return false;
  const MeshState &a = *state_, &b = *o.state_;
  return a.device_type == b.device_type && a.shape == b.shape && a.ranks == b.ranks &&
         a.names == b.names;
}

std::string DeviceMesh::str() const {
  if (!state_) return "DeviceMesh(undefined)";
  const MeshState& s = *state_;
  std::ostringstream os;
  os << "DeviceMesh('" << s.device_type << "', ";
  // Nested brackets, row-major: a "[" opens wherever the trailing coordinates are all 0.
  for (size_t i = 0; i < s.ranks.size(); ++i) {
    std::vector<int64_t> c = unravel(static_cast<int64_t>(i), s.shape);
    size_t open = 0;
    while (open < c.size() &&
           std::all_of(c.end() - open - 1, c.end(), [](int64_t v) { return v == 0; }))
      ++open;
    os << (i ? ", " : "") << std::string(open, '[') << s.ranks[i];
    size_t close = 0;
    for (size_t d = c.size(); d-- > 0 && c[d] == s.shape[d] - 1;) ++close;
    os << std::string(close, ']');
  }
  if (!s.names.empty()) os << ", mesh_dim_names=" << quoted(s.names);
  os << ")";
  return os.str();
}

std::ostream& operator<<(std::ostream& os, const DeviceMesh& mesh) { return os << mesh.str(); }

DeviceMesh init_device_mesh(std::string_view device_type, const std::vector<int64_t>& shape,
                            const std::vector<std::string>& dim_names) {
  KILN_CHECK(device_type == "cpu" || device_type == "cuda" || device_type.starts_with("remote"),
             Value, "init_device_mesh: unknown device type '", device_type,
             "' (expected 'cpu', 'cuda', or 'remote:N' for the gang of a kiln.connect session)");
#ifndef KILN_HAVE_NCCL
  KILN_CHECK(device_type != "cuda", Value,
             "init_device_mesh('cuda'): this build has no NCCL backend (it needs CUDA and NCCL)");
#endif
  KILN_CHECK(!shape.empty(), Value, "init_device_mesh: the mesh shape is empty");
  for (int64_t s : shape)
    KILN_CHECK(s > 0, Value, "init_device_mesh: mesh sizes must be positive, got shape ",
               IntArrayRef(shape));
  KILN_CHECK(dim_names.empty() || dim_names.size() == shape.size(), Value,
             "init_device_mesh: mesh_dim_names ", quoted(dim_names), " must name each of the ",
             shape.size(), " dims of mesh shape ", IntArrayRef(shape));
  for (size_t i = 0; i < dim_names.size(); ++i) {
    KILN_CHECK(!dim_names[i].empty(), Value, "init_device_mesh: mesh dim ", i,
               " has an empty name");
    KILN_CHECK(std::count(dim_names.begin(), dim_names.end(), dim_names[i]) == 1, Value,
               "init_device_mesh: mesh dim name '", dim_names[i], "' is repeated in ",
               quoted(dim_names));
  }
  if (device_type.starts_with("remote"))
    return detail::remote_hooks().init_mesh(device_type, shape, dim_names);
  if (!is_initialized()) {
    InitOptions o;
    o.backend = device_type == "cuda" ? "nccl" : "ucx";
    init_process_group(o);
  }
  return detail::make_root_mesh(std::string(device_type), shape, dim_names);
}

DeviceMesh detail::make_root_mesh(std::string device_type, const std::vector<int64_t>& shape,
                                  const std::vector<std::string>& dim_names) {
  static std::atomic<int64_t> next_root{1};
  const int world = default_group()->size();
  int64_t n = 1;
  for (int64_t s : shape)
    KILN_CHECK(s > 0 && !__builtin_mul_overflow(n, s, &n), Value, "init_device_mesh: mesh shape ",
               IntArrayRef(shape), " has more ranks than int64 counts");
  KILN_CHECK(n == world, Value, "init_device_mesh: mesh shape ", IntArrayRef(shape), " has ", n,
             " ranks but the world size is ", world);
  auto root = std::make_shared<RootState>();
  root->id = next_root++;
  root->device_type = std::move(device_type);
  root->shape = shape;
  root->ranks.resize(world);
  std::iota(root->ranks.begin(), root->ranks.end(), 0);
  auto m = std::make_shared<MeshState>();
  m->device_type = root->device_type;
  m->shape = shape;
  m->names = dim_names;
  m->ranks = root->ranks;
  m->root = root;
  for (int64_t d = 0; d < static_cast<int64_t>(shape.size()); ++d) {
    m->root_dims.push_back({d});
    m->groups.push_back(make_groups(blocks(*root, {d})));
  }
  return DeviceMesh(std::move(m));
}

DeviceMesh concat_meshes(const DeviceMesh& outer, const DeviceMesh& inner) {
  KILN_CHECK(outer.defined() && inner.defined(), Value, "concat_meshes: a mesh is undefined");
  const MeshState &a = *outer.state_, &b = *inner.state_;
  KILN_CHECK(a.root == b.root, Value, "concat_meshes: ", outer.str(), " and ", inner.str(),
             " come from different root meshes");
  std::vector<int64_t> me_a = outer.coordinate(), me_b = inner.coordinate();
  KILN_CHECK(!me_a.empty() && !me_b.empty(), Value, "concat_meshes: rank ", world_rank(),
             " is not in both ", outer.str(), " and ", inner.str());
  const std::vector<int64_t> da = flat_root_dims(a), db = flat_root_dims(b);
  for (int64_t d : db)
    KILN_CHECK(std::find(da.begin(), da.end(), d) == da.end(), Value,
               "concat_meshes: ", outer.str(), " and ", inner.str(),
               " share a dim of their root mesh");
  auto m = std::make_shared<MeshState>();
  m->device_type = a.device_type;
  m->root = a.root;
  for (const MeshState* x : {&a, &b}) {
    m->shape.insert(m->shape.end(), x->shape.begin(), x->shape.end());
    m->names.insert(m->names.end(), x->names.begin(), x->names.end());
    m->groups.insert(m->groups.end(), x->groups.begin(), x->groups.end());
    m->root_dims.insert(m->root_dims.end(), x->root_dims.begin(), x->root_dims.end());
  }
  if (a.names.empty() != b.names.empty()) m->names.clear();
  // The rank at (i, j): this rank's root coordinate with outer's root dims taken from outer's
  // rank i and inner's from inner's rank j (both meshes pass through this rank).
  const RootState& root = *a.root;
  auto root_coord = [&](int rank) {
    auto it = std::find(root.ranks.begin(), root.ranks.end(), rank);
    return unravel(it - root.ranks.begin(), root.shape);
  };
  const std::vector<int64_t> mine = root_coord(world_rank());
  for (int ra : a.ranks)
    for (int rb : b.ranks) {
      std::vector<int64_t> c = mine, ca = root_coord(ra), cb = root_coord(rb);
      for (int64_t d : da) c[d] = ca[d];
      for (int64_t d : db) c[d] = cb[d];
      int64_t index = 0;
      for (size_t d = 0; d < c.size(); ++d) index = index * root.shape[d] + c[d];
      m->ranks.push_back(root.ranks[index]);
    }
  return DeviceMesh(std::move(m));
}

DeviceMesh mesh_on_root(const DeviceMesh& root, const std::vector<std::string>& names,
                        const std::vector<std::vector<int64_t>>& root_dims) {
  const MeshState& r = root.state();
  KILN_CHECK(r.root_dims.size() == r.shape.size() && r.ranks == r.root->ranks, Value,
             "mesh_on_root: ", root.str(), " is not a root mesh");
  KILN_CHECK(!root_dims.empty() && (names.empty() || names.size() == root_dims.size()), Value,
             "mesh_on_root: ", root_dims.size(), " mesh dims with ", names.size(), " names");
  const int64_t n = static_cast<int64_t>(r.shape.size());
  DeviceMesh out;
  for (size_t d = 0; d < root_dims.size(); ++d) {
    const std::vector<int64_t>& rd = root_dims[d];
    KILN_CHECK(!rd.empty() && std::is_sorted(rd.begin(), rd.end()) &&
                   std::adjacent_find(rd.begin(), rd.end()) == rd.end() && rd.front() >= 0 &&
                   rd.back() < n,
               Value, "mesh_on_root: mesh dim ", d, " spans root dims ", IntArrayRef(rd),
               ", not distinct increasing dims of ", root.str());
    const std::string name = names.empty() ? "" : names[d];
    auto m = std::make_shared<MeshState>();
    m->device_type = r.device_type;
    m->root = r.root;
    m->names = names.empty() ? std::vector<std::string>{} : std::vector<std::string>{name};
    m->root_dims = {rd};
    ProcessGroupPtr group;
    std::vector<std::vector<int>> bs = blocks(*r.root, rd);
    if (rd.size() == 1) {
      group = r.groups[rd[0]];
    } else {  // a flattened dim, made once per name as flatten() does (See Note [Mesh groups])
      KILN_CHECK(!name.empty(), Value, "mesh_on_root: a flattened mesh dim needs a name");
      std::lock_guard<std::mutex> lock(r.root->mu);
      auto it = r.root->flattened.find(name);
      if (it == r.root->flattened.end()) {
        FlatEntry e{rd, {}, make_groups(bs)};
        for (auto& b : bs)
          if (std::find(b.begin(), b.end(), world_rank()) != b.end()) e.ranks = b;
        it = r.root->flattened.emplace(name, std::move(e)).first;
      }
      KILN_CHECK(it->second.root_dims == rd, Value, "mesh_on_root: the name '", name,
                 "' is taken by another flattened mesh");
      group = it->second.group;
    }
    for (auto& b : bs)
      if (std::find(b.begin(), b.end(), world_rank()) != b.end()) m->ranks = b;
    m->shape = {static_cast<int64_t>(m->ranks.size())};
    m->groups = {group};
    DeviceMesh dim_mesh(std::move(m));
    out = out.defined() ? concat_meshes(out, dim_mesh) : dim_mesh;
  }
  return out;
}

}  // namespace kiln::dist
