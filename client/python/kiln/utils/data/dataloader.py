"""DataLoader (torch.utils.data.DataLoader): batches of a dataset, collated by stacking.

    loader = DataLoader(TensorDataset(x, y), batch_size=32, shuffle=True,
                        generator=kiln.Generator().manual_seed(0))
    for xb, yb in loader: ...

num_workers > 0 fetches batches on that many threads (in order, a bounded number ahead), which
helps datasets whose __getitem__ waits on I/O.

state_dict() and load_state_dict() save and restore the position in a pass (torchdata's
StatefulDataLoader; See Note [DataLoader position]), so that a resumed run sees the batches the
uninterrupted one would have:

    state = {"loader": loader.state_dict(), ...}     # mid-pass, with the model's and the RNG's
    loader.load_state_dict(state["loader"])          # later: the next pass resumes there"""
import collections
import itertools
import numbers
from concurrent.futures import ThreadPoolExecutor

import numpy as _np

from kiln import _C
from kiln._C import Tensor
from kiln.utils.data.dataset import IterableDataset
from kiln.utils.data.sampler import BatchSampler, RandomSampler, SequentialSampler

_END = object()


def default_collate(batch):
    """Stacks a list of examples: tensors -> stack, NumPy arrays -> stacked tensor, numbers ->
    1-D tensor, str -> list, tuples/lists/dicts -> collated per field."""
    elem = batch[0]
    if isinstance(elem, Tensor):
        return _C.stack(list(batch), 0)
    if isinstance(elem, _np.ndarray):
        return _C.from_numpy(_np.stack(batch))
    if isinstance(elem, _np.generic):
        return _C.from_numpy(_np.array(batch))
    if isinstance(elem, bool):
        return _C.from_numpy(_np.array(batch, dtype=_np.bool_))
    if isinstance(elem, numbers.Integral):
        return _C.from_numpy(_np.array(batch, dtype=_np.int64))
    if isinstance(elem, numbers.Real):
        return _C.from_numpy(_np.array(batch, dtype=_np.float64))
    if isinstance(elem, (str, bytes)):
        return list(batch)
    if isinstance(elem, collections.abc.Mapping):
        return {k: default_collate([d[k] for d in batch]) for k in elem}
    if isinstance(elem, tuple) and hasattr(elem, "_fields"):  # namedtuple
        return type(elem)(*(default_collate(list(f)) for f in zip(*batch)))
    if isinstance(elem, collections.abc.Sequence):
        if any(len(e) != len(elem) for e in batch):
            raise RuntimeError("each element in list of batch should be of equal size")
        fields = [default_collate(list(f)) for f in zip(*batch)]
        return tuple(fields) if isinstance(elem, tuple) else fields
    raise TypeError(f"default_collate: batch must contain tensors, NumPy arrays, numbers, dicts "
                    f"or lists; found {type(elem).__name__}")


class DataLoader:
    def __init__(self, dataset, batch_size=1, shuffle=None, sampler=None, batch_sampler=None,
                 num_workers=0, collate_fn=None, pin_memory=False, drop_last=False, timeout=0,
                 worker_init_fn=None, generator=None, *, prefetch_factor=None,
                 persistent_workers=False):
        self.dataset, self.num_workers = dataset, num_workers
        self.prefetch_factor = 2 if prefetch_factor is None else prefetch_factor
        self.collate_fn = default_collate if collate_fn is None else collate_fn
        self.generator = generator
        if num_workers < 0:
            raise ValueError("num_workers option should be non-negative")
        self._iterable = isinstance(dataset, IterableDataset)
        if self._iterable:
            if shuffle or sampler is not None or batch_sampler is not None:
                raise ValueError("DataLoader with IterableDataset: expected unspecified shuffle, "
                                 "sampler and batch_sampler options")
        elif sampler is not None and shuffle:
            raise ValueError("sampler option is mutually exclusive with shuffle")
        if batch_sampler is not None:
            if batch_size != 1 or shuffle or sampler is not None or drop_last:
                raise ValueError("batch_sampler option is mutually exclusive with batch_size, "
                                 "shuffle, sampler, and drop_last")
            batch_size, drop_last = None, False
        elif sampler is None and not self._iterable:
            sampler = RandomSampler(dataset, generator=generator) if shuffle \
                else SequentialSampler(dataset)
        if batch_size is not None and batch_sampler is None and not self._iterable:
            batch_sampler = BatchSampler(sampler, batch_size, drop_last)
        self.batch_size, self.drop_last = batch_size, drop_last
        self.sampler, self.batch_sampler = sampler, batch_sampler
        self._yielded, self._order_rng, self._resume = 0, None, None

    def _index_batches(self):
        """Map-style: (fetch, keys) pairs, one per batch (or per example when batch_size=None)."""
        if self.batch_sampler is not None:
            return ((lambda b: self.collate_fn([self.dataset[i] for i in b])), self.batch_sampler)
        return ((lambda i: self.dataset[i]), self.sampler)

    def _iter_stream(self):
        if self.batch_size is None:
            yield from self.dataset
            return
        batch = []
        for ex in self.dataset:
            batch.append(ex)
            if len(batch) == self.batch_size:
                yield self.collate_fn(batch)
                batch = []
        if batch and not self.drop_last:
            yield self.collate_fn(batch)

    # Note [DataLoader position]: a pass draws its order (a sampler's permutation) at its first
    # batch, from the sampler's generator, else the default one. The position is the number of
    # batches the pass has yielded, and that generator's state (Philox seed and offset) just
    # before the draw. A pass after load_state_dict() sets the generator to that state, draws
    # the same order, and skips the batches already yielded: map-style ones without fetching
    # them, an IterableDataset's by fetching and dropping them. The default generator is then
    # put back as it was (the run's RNG state is restored on its own, from the same checkpoint).
    # A pass that ran to its end leaves position 0: the next one starts afresh. Samplers that
    # draw after their first index, or that keep other state of their own, are not replayed.
    def state_dict(self):
        state = {"batches_yielded": self._yielded, "order_rng": self._order_rng}
        if hasattr(self.sampler, "state_dict"):
            state["sampler"] = self.sampler.state_dict()
        return state

    def load_state_dict(self, state):
        def bad(what):
            raise ValueError(f"DataLoader.load_state_dict: {what} (expected the dict that "
                             f"DataLoader.state_dict() returns)")
        if not isinstance(state, dict):
            bad(f"got a {type(state).__name__}")
        unknown = set(state) - {"batches_yielded", "order_rng", "sampler"}
        if unknown or "batches_yielded" not in state or "order_rng" not in state:
            bad(f"keys {sorted(state)}")
        n, rng = state["batches_yielded"], state["order_rng"]
        if not isinstance(n, int) or isinstance(n, bool) or n < 0:
            bad(f"batches_yielded is {n!r}, not an integer >= 0")
        if rng is not None and (not isinstance(rng, (list, tuple)) or len(rng) != 2 or not all(
                isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 2**64 for v in rng)):
            bad(f"order_rng is {rng!r}, not None or [seed, offset]")
        if "sampler" in state:
            if not hasattr(self.sampler, "load_state_dict"):
                bad(f"it has a sampler state, but this loader's sampler is a "
                    f"{type(self.sampler).__name__}")
            self.sampler.load_state_dict(state["sampler"])
        self._resume = (n, None if rng is None else tuple(rng))

    def _order_generator(self):
        """(the generator the sampler draws its order from, whether it is the default one)"""
        sampler = self.sampler if self.sampler is not None else \
            getattr(self.batch_sampler, "sampler", None)
        g = getattr(sampler, "generator", None)
        return (g, False) if g is not None else (_C.default_generator(), True)

    def __iter__(self):
        resume, self._resume = self._resume, None
        return self._pass(*(resume or (0, None)))

    def _pass(self, skip, order_rng):
        gen, default = self._order_generator()
        now = gen.get_state()
        if order_rng is not None:
            gen.set_state(order_rng)
        self._order_rng, self._yielded = list(gen.get_state()), skip
        if self._iterable:
            batches = itertools.islice(self._iter_stream(), skip, None)
        else:
            fetch, keys = self._index_batches()
            keys = iter(keys)
            first = next(keys, _END)                  # the sampler draws its order here
            keys = itertools.islice(itertools.chain([] if first is _END else [first], keys),
                                    skip, None)
            batches = map(fetch, keys) if self.num_workers == 0 else self._threaded(fetch, keys)
        if order_rng is not None and default:
            gen.set_state(now)
        for batch in batches:
            self._yielded += 1
            yield batch
        self._yielded, self._order_rng = 0, None

    def _threaded(self, fetch, keys):
        ahead = self.num_workers * self.prefetch_factor
        with ThreadPoolExecutor(self.num_workers) as pool:
            pending = collections.deque()
            for k in keys:
                pending.append(pool.submit(fetch, k))
                if len(pending) >= ahead:
                    yield pending.popleft().result()
            while pending:
                yield pending.popleft().result()

    def __len__(self):
        if self._iterable:
            n = len(self.dataset)
            if self.batch_size is None:
                return n
            return n // self.batch_size if self.drop_last else -(-n // self.batch_size)
        return len(self.batch_sampler if self.batch_sampler is not None else self.sampler)
