"""kiln.utils.data.DistributedSampler (torch.utils.data.distributed.DistributedSampler): each
rank's share of a dataset, the shares disjoint and together covering it (padded by wrapping around
when the ranks do not divide it, unless drop_last). Call set_epoch(e) before each epoch for a new
shuffle, the same on every rank; num_replicas and rank default to the default group's (or
WORLD_SIZE/RANK, else 1 and 0). Its state_dict() is its epoch."""
import math
import os

from kiln import _C
from kiln.utils.data.sampler import Sampler

__all__ = ["DistributedSampler"]


def _default(kind):
    if _C._is_initialized():
        g = _C._default_group()
        return g.size() if kind == "size" else g.rank()
    name, fallback = ("WORLD_SIZE", 1) if kind == "size" else ("RANK", 0)
    v = os.environ.get(name)
    if v is None:
        return fallback
    try:
        return int(v)
    except ValueError:
        raise ValueError(f"DistributedSampler: ${name} is not an integer ('{v}')") from None


class DistributedSampler(Sampler):
    def __init__(self, dataset, num_replicas=None, rank=None, shuffle=True, seed=0, drop_last=False):
        num_replicas = _default("size") if num_replicas is None else num_replicas
        rank = _default("rank") if rank is None else rank
        if num_replicas < 1:
            raise ValueError(f"Invalid num_replicas {num_replicas}, expected >= 1")
        if rank >= num_replicas or rank < 0:
            raise ValueError(f"Invalid rank {rank}, rank should be in the interval [0, {num_replicas - 1}]")
        self.dataset, self.num_replicas, self.rank = dataset, num_replicas, rank
        self.shuffle, self.seed, self.drop_last, self.epoch = shuffle, seed, drop_last, 0
        n = len(dataset)
        if drop_last and n % num_replicas:
            self.num_samples = math.ceil((n - num_replicas) / num_replicas)
        else:
            self.num_samples = math.ceil(n / num_replicas)
        self.total_size = self.num_samples * num_replicas

    def __iter__(self):
        n = len(self.dataset)
        if self.shuffle:
            g = _C.Generator()
            g.manual_seed(self.seed + self.epoch)
            order = _C.randperm(n, generator=g).tolist()
        else:
            order = list(range(n))
        if not self.drop_last:
            pad = self.total_size - len(order)
            if pad > 0:
                order += (order * math.ceil(pad / len(order)))[:pad]
        else:
            order = order[:self.total_size]
        return iter(order[self.rank:self.total_size:self.num_replicas])

    def __len__(self):
        return self.num_samples

    def set_epoch(self, epoch):
        self.epoch = epoch

    # A DataLoader's state_dict() includes these (See Note [DataLoader position] in dataloader.py).
    def state_dict(self):
        return {"epoch": self.epoch}

    def load_state_dict(self, state):
        epoch = state.get("epoch") if isinstance(state, dict) else None
        if not isinstance(state, dict) or set(state) != {"epoch"} or not isinstance(epoch, int) \
                or isinstance(epoch, bool):
            raise ValueError(f"DistributedSampler.load_state_dict: expected {{'epoch': int}}, "
                             f"got {state!r}")
        self.epoch = epoch
