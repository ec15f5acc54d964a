// DeviceMesh across processes (tests/sharding/harness.h): a 2x2 mesh's coordinates, groups,
// sub-meshes and flattening on 4 ranks, and init_device_mesh's errors.
#include "kiln/dist/device_mesh.h"

#include "harness.h"
#include "kiln/kiln.h"
#include "test_util.h"

namespace kiln::testing {
namespace {

using dist::DeviceMesh;
using dist::init_device_mesh;

// The sum over `group` of every member's world rank.
double rank_sum(const dist::ProcessGroupPtr& group) {
  Tensor t = full({1}, static_cast<double>(rank()));
  return all_reduce(t, "sum", group->name()).item<double>();
}

KILN_RANK_SCENARIO(mesh_2x2) {
  const int r = rank();
  DeviceMesh mesh = init_device_mesh("cpu", {2, 2}, {"dp", "tp"});
  EXPECT_EQ(mesh.ndim(), 2);
  EXPECT_EQ(mesh.size(), 4);
  EXPECT_EQ(mesh.size(0), 2);
  EXPECT_EQ(mesh.size(-1), 2);
  EXPECT_EQ(mesh.dim_names(), (std::vector<std::string>{"dp", "tp"}));
  EXPECT_EQ(mesh.coordinate(), (std::vector<int64_t>{r / 2, r % 2}));
  EXPECT_EQ(mesh.local_rank(1), r % 2);
  EXPECT_EQ(mesh.str(), "DeviceMesh('cpu', [[0, 1], [2, 3]], mesh_dim_names=('dp', 'tp'))");
  // Along "tp" the ranks differ in the last coordinate; along "dp" in the first.
  EXPECT_EQ(mesh.group("tp")->ranks(), (std::vector<int>{r / 2 * 2, r / 2 * 2 + 1}));
  EXPECT_EQ(mesh.group("dp")->ranks(), (std::vector<int>{r % 2, r % 2 + 2}));
  EXPECT_EQ(rank_sum(mesh.group("tp")), (r / 2 * 2) * 2 + 1);
  EXPECT_EQ(rank_sum(mesh.group(0)), (r % 2) * 2 + 2);

  DeviceMesh tp = mesh["tp"];
  EXPECT_EQ(tp.ndim(), 1);
  EXPECT_EQ(tp.ranks(), mesh.group("tp")->ranks());
  EXPECT_EQ(tp.group(0), mesh.group("tp"));  // reused, not created again
  EXPECT_EQ(tp.coordinate(), (std::vector<int64_t>{r % 2}));
  EXPECT_EQ(mesh["dp"].ranks(), mesh.group("dp")->ranks());
  EXPECT_TRUE(mesh.submesh({"dp", "tp"}) == mesh);
  EXPECT_TRUE(mesh["dp"] != mesh["tp"]);

  DeviceMesh flat = mesh.submesh({"dp", "tp"}).flatten();
  EXPECT_EQ(flat.dim_names(), (std::vector<std::string>{"dp_tp"}));
  EXPECT_EQ(flat.ranks(), (std::vector<int>{0, 1, 2, 3}));
  EXPECT_EQ(flat.coordinate(), (std::vector<int64_t>{r}));
  EXPECT_EQ(rank_sum(flat.group(0)), 6);
  EXPECT_EQ(mesh["dp_tp"].group(0), flat.group(0));   // the root remembers it
  EXPECT_EQ(mesh.flatten().group(0), flat.group(0));  // no new group the second time
  // A flattened 1-d dim is that dim under a new name, with its own group of the same ranks.
  DeviceMesh dp = mesh["dp"].flatten("data");
  EXPECT_EQ(dp.ranks(), mesh.group("dp")->ranks());
  EXPECT_EQ(rank_sum(dp.group(0)), (r % 2) * 2 + 2);

  // (tp, dp): the transposed mesh, with the same groups; concat of (dp, tp) is the mesh itself.
  DeviceMesh tp_dp = concat_meshes(mesh["tp"], mesh["dp"]);
  EXPECT_EQ(tp_dp.str(), "DeviceMesh('cpu', [[0, 2], [1, 3]], mesh_dim_names=('tp', 'dp'))");
  EXPECT_EQ(tp_dp.coordinate(), (std::vector<int64_t>{r % 2, r / 2}));
  EXPECT_EQ(tp_dp.group("tp"), mesh.group("tp"));
  EXPECT_EQ(tp_dp.group("dp"), mesh.group("dp"));
  EXPECT_TRUE(concat_meshes(mesh["dp"], mesh["tp"]) == mesh);
  expect_error(ErrorKind::Value, "orders its dims unlike its root mesh", [&] { tp_dp.flatten(); });
  expect_error(ErrorKind::Value, "share a dim of their root mesh",
               [&] { concat_meshes(mesh["tp"], mesh); });
  expect_error(ErrorKind::Value, "come from different root meshes",
               [&] { concat_meshes(mesh["tp"], init_device_mesh("cpu", {4})); });

  expect_error(ErrorKind::Value, "no mesh dim named 'pp' (the mesh's dims: ('dp', 'tp'))",
               [&] { mesh["pp"]; });
  expect_error(ErrorKind::Value, "must be distinct and in the mesh's order", [&] {
    mesh.submesh({"tp", "dp"});
  });
  expect_error(ErrorKind::Index, "dim 2 out of range for a mesh of 2 dims", [&] { mesh.size(2); });
  expect_error(ErrorKind::Value, "mesh shape [3] has 3 ranks but the world size is 4",
               [] { init_device_mesh("cpu", {3}); });
  expect_error(ErrorKind::Value, "mesh dim name 'x' is repeated in ('x', 'x')", [] {
    init_device_mesh("cpu", {2, 2}, {"x", "x"});
  });
  expect_error(ErrorKind::Value, "mesh_dim_names ('x') must name each of the 2 dims", [] {
    init_device_mesh("cpu", {2, 2}, {"x"});
  });
  expect_error(ErrorKind::Value, "mesh sizes must be positive, got shape [4, 0]", [] {
    init_device_mesh("cpu", {4, 0});
  });
  expect_error(ErrorKind::Value, "unknown device type 'tpu'", [] { init_device_mesh("tpu", {4}); });
  // A 1-d mesh over the whole world uses the default group.
  EXPECT_EQ(init_device_mesh("cpu", {4}).group(0), dist::default_group());
}

TEST(DeviceMesh, TwoByTwo) { expect_all_pass(run_ranks("mesh_2x2", 4)); }

}  // namespace
}  // namespace kiln::testing
