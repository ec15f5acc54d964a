"""kiln.distributed.device_mesh: DeviceMesh and init_device_mesh (torch.distributed.device_mesh),
over kiln::dist::DeviceMesh (sharding/include/kiln/dist/device_mesh.h).

    # kiln run --nproc 4 .venv/bin/python train.py
    from kiln.distributed.device_mesh import init_device_mesh
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    mesh["tp"].get_group()           # the process group along "tp" that holds this rank
    mesh["dp", "tp"]._flatten()      # one dim "dp_tp" over all four ranks

Every rank must create meshes, sub-meshes' flattenings and groups in the same order (each makes
process groups that every rank joins).
"""
from kiln import _C

__all__ = ["DeviceMesh", "init_device_mesh"]


class DeviceMesh:
    """An n-d array of ranks with one process group per mesh dim."""

    def __init__(self, c_mesh):
        self._c = c_mesh

    @property
    def device_type(self):
        return self._c.device_type

    @property
    def ndim(self):
        return self._c.ndim

    @property
    def shape(self):
        return tuple(self._c.shape)

    @property
    def mesh_dim_names(self):
        names = self._c.dim_names
        return tuple(names) if names else None

    @property
    def mesh(self):
        """The world ranks, as nested lists of the mesh's shape."""
        ranks = list(self._c.ranks)
        for n in reversed(self.shape[1:]):
            ranks = [ranks[i:i + n] for i in range(0, len(ranks), n)]
        return ranks

    def _dim(self, mesh_dim):
        if mesh_dim is None:
            if self.ndim != 1:
                raise RuntimeError(f"Found the DeviceMesh have {self.ndim} dimensions; "
                                   "pass mesh_dim for a mesh of more than one dim")
            return 0
        return self._c.dim_index(mesh_dim) if isinstance(mesh_dim, str) else mesh_dim

    def size(self, mesh_dim=None):
        return self._c.numel() if mesh_dim is None else self._c.size(self._dim(mesh_dim))

    def get_coordinate(self):
        """This rank's index along each mesh dim; None when this rank is not in the mesh."""
        c = self._c.coordinate()
        return list(c) if c else None

    def get_local_rank(self, mesh_dim=None):
        return self._c.local_rank(self._dim(mesh_dim))

    def get_group(self, mesh_dim=None):
        return self._c.group(self._dim(mesh_dim))

    def __getitem__(self, names):
        names = [names] if isinstance(names, str) else list(names)
        return DeviceMesh(self._c.submesh(names))

    def _flatten(self, mesh_dim_name=None):
        return DeviceMesh(self._c.flatten(mesh_dim_name or ""))

    def __eq__(self, other):
        return isinstance(other, DeviceMesh) and self._c == other._c

    def __hash__(self):
        return hash((self.device_type, self.shape, tuple(self._c.ranks), self.mesh_dim_names))

    def __repr__(self):
        return repr(self._c)


def init_device_mesh(device_type, mesh_shape, *, mesh_dim_names=None):
    """A mesh of `mesh_shape` over ranks 0..N-1, row-major. Initialises the default process group
    from the launch environment when none exists ("cpu": UCX; "cuda": NCCL where built). A
    kiln.connect session's device ("remote:N", or the session's .device itself) lays the mesh
    over the session's gang of workers (Note [Remote DTensor] in kiln/dist/remote.h)."""
    return DeviceMesh(_C._init_device_mesh(str(device_type), list(mesh_shape),
                                           list(mesh_dim_names or [])))
