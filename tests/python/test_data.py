"""kiln.utils.data: datasets, samplers, collation and DataLoader behaviour."""
from collections import namedtuple

import numpy as np
import pytest

import kiln
from kiln.utils.data import (BatchSampler, ConcatDataset, DataLoader, Dataset, IterableDataset,
                             RandomSampler, SequentialSampler, Subset, TensorDataset,
                             default_collate, random_split)


class Squares(Dataset):
    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if not 0 <= i < self.n:
            raise IndexError(i)
        return {"x": float(i), "y": i * i, "name": f"s{i}"}


class Stream(IterableDataset):
    def __init__(self, n):
        self.n = n

    def __iter__(self):
        return iter(kiln.tensor([i, -i]) for i in range(self.n))


def test_tensor_dataset_and_batches():
    x, y = kiln.arange(20, dtype=kiln.float32).reshape([10, 2]), kiln.arange(10)
    ds = TensorDataset(x, y)
    assert len(ds) == 10 and ds[3][1].item() == 3
    batches = list(DataLoader(ds, batch_size=4))
    assert [b[0].shape for b in batches] == [(4, 2), (4, 2), (2, 2)]
    assert kiln.cat([b[1] for b in batches]).tolist() == list(range(10))
    assert np.array_equal(batches[0][0].numpy(), x.numpy()[:4])
    dl = DataLoader(ds, batch_size=4, drop_last=True)
    assert len(dl) == 2 and [b[1].shape[0] for b in dl] == [4, 4]
    with pytest.raises(ValueError, match="Size mismatch"):
        TensorDataset(x, kiln.arange(3))


def test_shuffle_is_a_seeded_permutation():
    ds = TensorDataset(kiln.arange(50))

    def order(loader):
        return kiln.cat([b[0] for b in loader]).tolist()
    a = order(DataLoader(ds, batch_size=8, shuffle=True, generator=kiln.Generator().manual_seed(3)))
    b = order(DataLoader(ds, batch_size=8, shuffle=True, generator=kiln.Generator().manual_seed(3)))
    assert a == b and sorted(a) == list(range(50)) and a != list(range(50))
    g = kiln.Generator().manual_seed(3)
    dl = DataLoader(ds, batch_size=8, shuffle=True, generator=g)
    e1, e2 = order(dl), order(dl)
    assert e1 == a and e2 != e1 and sorted(e2) == list(range(50))  # a new order per epoch


def test_collate_structures():
    batch = list(DataLoader(Squares(5), batch_size=3))[0]
    assert set(batch) == {"x", "y", "name"}
    assert batch["x"].dtype is kiln.float64 and batch["x"].tolist() == [0.0, 1.0, 2.0]
    assert batch["y"].dtype is kiln.int64 and batch["y"].tolist() == [0, 1, 4]
    assert batch["name"] == ["s0", "s1", "s2"]
    P = namedtuple("P", "a b")
    out = default_collate([P(kiln.ones(2), 1), P(kiln.zeros(2), 2)])
    assert isinstance(out, P) and out.a.shape == (2, 2) and out.b.tolist() == [1, 2]
    out = default_collate([[np.ones(3, np.float32), True], [np.zeros(3, np.float32), False]])
    assert isinstance(out, list) and out[0].shape == (2, 3) and out[1].dtype is kiln.bool
    with pytest.raises(TypeError, match="found object"):
        default_collate([object()])


def test_samplers_and_custom_collate():
    ds = Squares(7)
    assert list(SequentialSampler(ds)) == list(range(7))
    r = list(RandomSampler(ds, generator=kiln.Generator().manual_seed(0)))
    assert sorted(r) == list(range(7))
    rr = list(RandomSampler(ds, replacement=True, num_samples=20, generator=kiln.Generator()))
    assert len(rr) == 20 and all(0 <= i < 7 for i in rr)
    assert list(BatchSampler(range(5), 2, False)) == [[0, 1], [2, 3], [4]]
    dl = DataLoader(ds, sampler=[6, 0, 3], batch_size=2, collate_fn=lambda b: [e["y"] for e in b])
    assert list(dl) == [[36, 0], [9]]
    dl = DataLoader(ds, batch_sampler=[[1, 2], [5]], collate_fn=len)
    assert list(dl) == [2, 1] and len(dl) == 2
    dl = DataLoader(ds, batch_size=None)
    assert next(iter(dl))["y"] == 0 and len(dl) == 7
    with pytest.raises(ValueError, match="mutually exclusive with shuffle"):
        DataLoader(ds, sampler=[0], shuffle=True)
    with pytest.raises(ValueError, match="batch_size should be a positive integer"):
        DataLoader(ds, batch_size=0)


def test_iterable_dataset():
    dl = DataLoader(Stream(5), batch_size=2)
    got = [b.tolist() for b in dl]
    assert got == [[[0, 0], [1, -1]], [[2, -2], [3, -3]], [[4, -4]]]
    assert [b.shape[0] for b in DataLoader(Stream(5), batch_size=2, drop_last=True)] == [2, 2]
    with pytest.raises(ValueError, match="IterableDataset"):
        DataLoader(Stream(5), shuffle=True)


def test_threaded_workers_keep_order():
    ds = TensorDataset(kiln.arange(100))
    single = [b[0].tolist() for b in DataLoader(ds, batch_size=7)]
    threaded = [b[0].tolist() for b in DataLoader(ds, batch_size=7, num_workers=3)]
    assert threaded == single


def test_subset_concat_random_split():
    ds = Squares(10)
    sub = Subset(ds, [9, 2])
    assert len(sub) == 2 and sub[0]["y"] == 81
    cat = ConcatDataset([Squares(2), Squares(3)])
    assert len(cat) == 5 and cat[2]["y"] == 0 and cat[-1]["y"] == 4
    assert len(Squares(2) + Squares(2)) == 4
    a, b = random_split(ds, [7, 3], generator=kiln.Generator().manual_seed(0))
    assert len(a) == 7 and len(b) == 3
    assert sorted(a.indices + b.indices) == list(range(10))
    a, b = random_split(ds, [0.5, 0.5])
    assert len(a) == len(b) == 5
    with pytest.raises(ValueError, match="Sum of input lengths"):
        random_split(ds, [3, 3])


def _ids(batch):
    return batch[0].tolist()


@pytest.mark.parametrize("kind", ["default", "generator", "workers", "distributed", "iterable"])
def test_a_resumed_loader_sees_the_uninterrupted_batches(kind):
    """Two passes with RNG use between batches (as dropout would); the state is taken 3 batches
    into the second pass, restored in a fresh loader with other RNG values, and the rest of the
    run (its batches and its random numbers) is the same."""
    from kiln.utils.data import DistributedSampler
    ds = TensorDataset(kiln.arange(30))

    def make():
        if kind == "default":
            return DataLoader(ds, batch_size=4, shuffle=True)
        if kind == "generator":
            return DataLoader(ds, batch_size=4, shuffle=True,
                              generator=kiln.Generator().manual_seed(5))
        if kind == "workers":
            return DataLoader(ds, batch_size=4, shuffle=True, num_workers=2)
        if kind == "distributed":
            return DataLoader(ds, batch_size=4, sampler=DistributedSampler(ds, 2, 1, seed=3))
        return DataLoader(Stream(30), batch_size=4)

    def run(loader, passes, stop=None, start_pass=0):
        seen, state = [], None
        for p in range(start_pass, passes):
            if kind == "distributed":
                loader.sampler.set_epoch(p)
            for i, b in enumerate(loader):
                seen.append((_ids(b), kiln.randn(2).tolist()))
                if (p, i) == stop:
                    return seen, {"loader": loader.state_dict(),
                                  "rng": kiln.default_generator().get_state()}
        return seen, state

    kiln.manual_seed(0)
    whole, _ = run(make(), 3)
    kiln.manual_seed(0)
    first, state = run(make(), 3, stop=(1, 2))
    kiln.manual_seed(123)                              # other values, then the checkpoint's
    resumed = make()
    resumed.load_state_dict(state["loader"])
    kiln.default_generator().set_state(state["rng"])
    rest = []
    for p in range(1, 3):
        if kind == "distributed" and p > 1:
            resumed.sampler.set_epoch(p)
        rest += [(_ids(b), kiln.randn(2).tolist()) for b in resumed]
    assert first + rest == whole
    assert state["loader"]["batches_yielded"] == 3
    if kind == "distributed":
        assert state["loader"]["sampler"] == {"epoch": 1}


def test_loader_state_at_the_ends_of_a_pass():
    dl = DataLoader(TensorDataset(kiln.arange(8)), batch_size=4, shuffle=True)
    assert dl.state_dict() == {"batches_yielded": 0, "order_rng": None}
    it = iter(dl)
    next(it)
    mid = dl.state_dict()
    assert mid["batches_yielded"] == 1 and len(mid["order_rng"]) == 2
    list(it)
    assert dl.state_dict() == {"batches_yielded": 0, "order_rng": None}  # the next pass is new
    # A state taken after the last batch (before the loop ended) resumes to an empty pass.
    dl.load_state_dict({"batches_yielded": 2, "order_rng": mid["order_rng"]})
    assert list(dl) == []
    assert len(list(dl)) == 2


def test_loader_state_rejects_what_it_did_not_make():
    from kiln.utils.data import DistributedSampler
    dl = DataLoader(TensorDataset(kiln.arange(8)), batch_size=4)
    for bad, needle in [(3, "got a int"),
                        ({"batches_yielded": 1}, "keys"),
                        ({"batches_yielded": 1, "order_rng": None, "x": 1}, "keys"),
                        ({"batches_yielded": -1, "order_rng": None}, "batches_yielded is -1"),
                        ({"batches_yielded": True, "order_rng": None}, "batches_yielded is True"),
                        ({"batches_yielded": 1, "order_rng": [1]}, r"order_rng is \[1\]"),
                        ({"batches_yielded": 1, "order_rng": [1, -1]}, "order_rng is"),
                        ({"batches_yielded": 1, "order_rng": None, "sampler": {"epoch": 1}},
                         "SequentialSampler")]:
        with pytest.raises(ValueError, match=needle):
            dl.load_state_dict(bad)
    assert len(list(dl)) == 2                          # nothing was half-loaded
    ds = TensorDataset(kiln.arange(8))
    sampler = DistributedSampler(ds, 2, 0)
    with pytest.raises(ValueError, match="DistributedSampler.load_state_dict"):
        DataLoader(ds, sampler=sampler).load_state_dict(
            {"batches_yielded": 0, "order_rng": None, "sampler": {"epoch": "1"}})
