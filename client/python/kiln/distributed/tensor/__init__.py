"""kiln.distributed.tensor: DTensor (torch.distributed.tensor), over kiln::dist's DTensor
(sharding/include/kiln/dist/dtensor.h). A DTensor is a kiln.Tensor whose ops run on this rank's
shard; it has the methods to_local, full_tensor, redistribute and the properties placements and
device_mesh.

    from kiln.distributed.tensor import distribute_tensor, DTensor, Shard, Replicate
    x = distribute_tensor(kiln.randn(8, 4), mesh, [Shard(0)])
    y = (x * 2 + 1).redistribute(mesh, [Replicate()])
    y.full_tensor()                        # the (8, 4) result on every rank
    DTensor.from_local(local, mesh, [Shard(0)])
"""
from kiln import _C
from kiln._C import Tensor
from kiln.distributed.device_mesh import DeviceMesh

__all__ = ["DTensor", "Placement", "Shard", "Replicate", "Partial", "distribute_tensor",
           "fallback_ops"]

Placement = _C._Placement


def Shard(dim):  # noqa: N802 (PyTorch's class names)
    return _C._shard(dim)


def Replicate():  # noqa: N802
    return _C._replicate()


def Partial(reduce_op="sum"):  # noqa: N802
    return _C._partial(reduce_op)


def _placements(mesh, placements):
    if placements is None:
        return [Replicate()] * mesh.ndim
    return list(placements)


def _mesh(t):
    return DeviceMesh(_C._dtensor_mesh(t))


class _DTensorMeta(type):
    def __instancecheck__(cls, obj):
        return isinstance(obj, Tensor) and _C._is_dtensor(obj)


class DTensor(metaclass=_DTensorMeta):
    """isinstance(t, DTensor) is true for DTensors; DTensor.from_local makes one."""

    @staticmethod
    def from_local(local_tensor, device_mesh, placements=None, *, run_check=False, shape=None,
                   stride=None):
        """A DTensor from this rank's shard. Without `shape` the global shape assumes even
        shards; pass shape (and stride) for uneven ones."""
        return _C._dtensor_from_local(local_tensor, device_mesh._c,
                                      _placements(device_mesh, placements),
                                      None if shape is None else list(shape),
                                      None if stride is None else list(stride))


def distribute_tensor(tensor, device_mesh, placements=None):
    """Splits `tensor` (the same on every rank) by `placements` and keeps this rank's piece."""
    return _C._distribute_tensor(tensor, device_mesh._c, _placements(device_mesh, placements))


def fallback_ops():
    """The ops that ran replicated because they have no sharding rule yet (warned once each)."""
    return list(_C._dtensor_fallback_ops())


def _redistribute(self, device_mesh=None, placements=None):
    mesh = device_mesh if device_mesh is not None else _mesh(self)
    return _C._dtensor_redistribute(self, mesh._c, _placements(mesh, placements))


Tensor.to_local = lambda self: _C._dtensor_to_local(self)
Tensor.full_tensor = lambda self: _C._dtensor_full_tensor(self)
Tensor.redistribute = _redistribute
Tensor.placements = property(lambda self: tuple(_C._dtensor_placements(self)))
Tensor.device_mesh = property(_mesh)
