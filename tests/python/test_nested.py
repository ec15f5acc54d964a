"""kiln.nested (the jagged layout; Note [Nested tensors] in kiln/nested.py): construction and
components, every supported op forward and backward against a per-sequence loop of the dense
op, bad input, and parity of examples/chargpt.py's GPT trained on a nested batch of
variable-length fortunes with the padded-and-masked batch (float32, relative 1e-5)."""
import os

import numpy as np
import pytest

import kiln
import kiln.nn as nn
import kiln.nn.functional as F

from examples_util import load_example

FORTUNES = "/usr/share/games/fortunes"


def close(a, b, rtol=1e-5, atol=1e-6):
    a, b = np.asarray(a.detach().numpy(), np.float64), np.asarray(b.detach().numpy(), np.float64)
    assert a.shape == b.shape
    np.testing.assert_allclose(a, b, rtol=rtol, atol=atol)


def seqs(lengths, *rest, seed=0, dtype=kiln.float64):
    g = kiln.Generator().manual_seed(seed)
    return [kiln.randn(n, *rest, generator=g, dtype=dtype) for n in lengths]


LENGTHS = [3, 0, 7, 1, 5]


# ---- the type ----------------------------------------------------------------------------------
def test_construction_and_components():
    parts = seqs(LENGTHS, 4)
    nt = kiln.nested.nested_tensor(parts, layout=kiln.jagged)
    assert nt.is_nested and not parts[0].is_nested and nt.layout is kiln.jagged
    assert nt.size() == (5, None, 4) and nt.shape == (5, None, 4) and nt.dim() == 3
    assert nt.size(1) is None and nt.size(-1) == 4
    assert nt.offsets().dtype is kiln.int64
    assert nt.offsets().tolist() == [0, 3, 3, 10, 11, 16]
    assert nt.lengths().tolist() == LENGTHS
    assert tuple(nt.values().shape) == (16, 4)
    for got, want in zip(nt.unbind(), parts):
        close(got, want)
    padded = nt.to_padded_tensor(-1.0)
    assert tuple(padded.shape) == (5, 7, 4)
    for b, p in enumerate(parts):
        close(padded[b, :LENGTHS[b]], p)
        assert (padded[b, LENGTHS[b]:].numpy() == -1).all()
    assert tuple(nt.to_padded_tensor(0.0, output_size=(5, 9, 4)).shape) == (5, 9, 4)


def test_nested_tensor_copies_and_as_nested_tensor_keeps_autograd():
    parts = [p.requires_grad_() for p in seqs([2, 3], 4)]
    leaf = kiln.nested.nested_tensor(parts, requires_grad=True)
    assert leaf.requires_grad and leaf.is_leaf
    (leaf * 2).to_padded_tensor(0.0).sum().backward()
    assert parts[0].grad is None
    close(leaf.grad.values(), kiln.full([5, 4], 2.0, dtype=kiln.float64))
    nt = kiln.nested.as_nested_tensor(parts)
    (nt * 3).values().sum().backward()
    for p in parts:
        close(p.grad, kiln.full(list(p.shape), 3.0, dtype=kiln.float64))


def test_bad_construction():
    with pytest.raises(ValueError, match="only dim 0 may differ"):
        kiln.nested.nested_tensor([kiln.randn(2, 3), kiln.randn(2, 4)])
    with pytest.raises(TypeError, match="dtype"):
        kiln.nested.nested_tensor([kiln.randn(2, 3), kiln.randn(2, 3, dtype=kiln.float64)])
    with pytest.raises(NotImplementedError, match="layout=kiln.jagged"):
        kiln.nested.nested_tensor([kiln.randn(2, 3)], layout="strided")
    v = kiln.randn(5, 2)
    cases = [([1, 3, 5], ValueError, r"start at 0, got offsets\[0\] = 1"),
             ([0, 4, 2, 5], ValueError, r"not decrease, got offsets\[1\] = 4 > offsets\[2\] = 2"),
             ([0, 2, 4], ValueError, r"end at the values' length 5, got offsets\[2\] = 4")]
    for off, err, msg in cases:
        with pytest.raises(err, match=msg):
            kiln.nested.nested_tensor_from_jagged(v, kiln.tensor(off))
    with pytest.raises(TypeError, match="int64, got .*int32"):
        kiln.nested.nested_tensor_from_jagged(v, kiln.tensor([0, 5], dtype=kiln.int32))


# ---- packed-values ops -------------------------------------------------------------------------
def per_seq(fn, nt):
    """fn applied to each sequence, packed again (the reference)."""
    return kiln.cat([fn(s) for s in nt.unbind()], 0)


def grads_match(make_nested, make_dense, parts, rtol=1e-10):
    """Gradients of sum(out * w) through the nested op and through the per-sequence loop."""
    a = [p.detach().clone().requires_grad_() for p in parts]
    b = [p.detach().clone().requires_grad_() for p in parts]
    out = make_nested(kiln.nested.as_nested_tensor(a)).values()
    ref = kiln.cat([make_dense(p) for p in b], 0)
    close(out, ref, rtol=rtol, atol=1e-12)
    w = kiln.randn(*out.shape, dtype=out.dtype)
    (out * w).sum().backward()
    (ref * w).sum().backward()
    for x, y in zip(a, b):
        if x.shape[0]:
            close(x.grad, y.grad, rtol=rtol, atol=1e-12)


def test_elementwise():
    parts = seqs(LENGTHS, 4, seed=1)
    other = kiln.nested.nested_tensor(seqs(LENGTHS, 4, seed=2))
    dense = kiln.randn(4, dtype=kiln.float64)
    grads_match(lambda nt: (nt * 2 + 1).tanh() - nt.exp() / 3,
                lambda s: (s * 2 + 1).tanh() - s.exp() / 3, parts)
    ov = list(other.unbind())
    it = iter(ov)
    grads_match(lambda nt: nt * other + F.relu(nt) - 1 / (2 + nt.sigmoid()),
                lambda s: s * next(it) + F.relu(s) - 1 / (2 + s.sigmoid()), parts)
    grads_match(lambda nt: F.gelu(nt + dense) * dense, lambda s: F.gelu(s + dense) * dense, parts)


def test_elementwise_bad_operands():
    a = kiln.nested.nested_tensor(seqs([2, 3], 4))
    b = kiln.nested.nested_tensor(seqs([3, 2], 4))
    with pytest.raises(ValueError, match=r"different offsets \[0, 2, 5\] and \[0, 3, 5\]"):
        a + b
    with pytest.raises(ValueError, match="broadcasts over the 1 dim"):
        a * kiln.randn(5, 4, dtype=kiln.float64)


def test_linear_layer_norm_embedding_softmax():
    parts = seqs(LENGTHS, 6, seed=3)
    lin, ln = nn.Linear(6, 5).double(), nn.LayerNorm(5).double()
    grads_match(lambda nt: ln(lin(nt)).softmax(-1), lambda s: ln(lin(s)).softmax(-1), parts)
    grads_match(lambda nt: F.layer_norm(F.linear(nt, lin.weight), [5]),
                lambda s: F.layer_norm(F.linear(s, lin.weight), [5]), parts)
    emb = nn.Embedding(10, 3)
    tokens = [kiln.randint(0, 10, (n,)) for n in LENGTHS]
    out = emb(kiln.nested.as_nested_tensor(tokens))
    close(out.values(), kiln.cat([emb(t) for t in tokens], 0))


def test_cross_entropy_over_packed_tokens():
    parts = seqs(LENGTHS, 7, seed=4)
    targets = [kiln.randint(0, 7, (n,)) for n in LENGTHS]
    tnt = kiln.nested.as_nested_tensor(targets)
    a = [p.detach().clone().requires_grad_() for p in parts]
    loss = F.cross_entropy(kiln.nested.as_nested_tensor(a), tnt)
    b = [p.detach().clone().requires_grad_() for p in parts]
    ref = sum(F.cross_entropy(p, t, reduction="sum") for p, t in zip(b, targets) if p.shape[0])
    ref = ref / sum(LENGTHS)
    close(loss, ref, rtol=1e-12)
    loss.backward()
    ref.backward()
    for x, y in zip(a, b):
        if x.shape[0]:
            close(x.grad, y.grad, rtol=1e-10, atol=1e-14)
    with pytest.raises(ValueError, match="different offsets"):
        F.cross_entropy(kiln.nested.as_nested_tensor(a), kiln.nested.as_nested_tensor(targets[::-1]))


# ---- attention ---------------------------------------------------------------------------------
def heads(nt, h):
    """(B, j, h * d) -> (B, h, j, d), as chargpt's Block does."""
    B, _, C = nt.shape
    return nt.reshape(B, None, h, C // h).transpose(1, 2)


@pytest.mark.parametrize("causal", [False, True])
def test_sdpa_matches_per_sequence_attention(causal):
    lengths = [5, 1, 70, 0, 12]  # 70 crosses the kernel's 64-row query block
    qs, ks, vs = seqs(lengths, 8, seed=5), seqs(lengths, 8, seed=6), seqs(lengths, 8, seed=7)

    def nested(q, k, v):
        q, k, v = (kiln.nested.as_nested_tensor(t) for t in (q, k, v))
        y = F.scaled_dot_product_attention(heads(q, 2), heads(k, 2), heads(v, 2),
                                           is_causal=causal)
        assert y.shape == (5, 2, None, 4)
        return y.transpose(1, 2).reshape(5, None, 8).values()

    def dense(q, k, v):  # (n, 8) each
        sp = [t.reshape(t.shape[0], 2, 4).transpose(0, 1) for t in (q, k, v)]
        return F.scaled_dot_product_attention(*sp, is_causal=causal).transpose(0, 1).reshape(-1, 8)

    ins = [[p.detach().clone().requires_grad_() for p in t] for t in (qs, ks, vs)]
    refs = [[p.detach().clone().requires_grad_() for p in t] for t in (qs, ks, vs)]
    out = nested(*ins)
    ref = kiln.cat([dense(q, k, v) for q, k, v in zip(*refs) if q.shape[0]], 0)
    close(out, ref, rtol=1e-10, atol=1e-12)
    w = kiln.randn(*out.shape, dtype=kiln.float64)
    (out * w).sum().backward()
    (ref * w).sum().backward()
    for got, want in zip(ins, refs):
        for x, y in zip(got, want):
            if x.shape[0]:
                close(x.grad, y.grad, rtol=1e-9, atol=1e-12)


def test_sdpa_bad_input():
    q = heads(kiln.nested.nested_tensor(seqs([2, 3], 4)), 2)
    k = heads(kiln.nested.nested_tensor(seqs([3, 2], 4)), 2)
    with pytest.raises(ValueError, match="different offsets"):
        F.scaled_dot_product_attention(q, k, q)
    with pytest.raises(ValueError, match=r"size \(B, H, None, D\)"):
        F.scaled_dot_product_attention(q.transpose(1, 2), q, q)
    with pytest.raises(NotImplementedError, match="attn_mask"):
        F.scaled_dot_product_attention(q, q, q, attn_mask=kiln.ones(2, 2))
    with pytest.raises(TypeError, match="key is dense"):
        F.scaled_dot_product_attention(q, kiln.randn(2, 2, 3, 2), q)
    v = kiln.randn(5, 2, 3)
    with pytest.raises(ValueError, match=r"offsets must end at the total length 5"):
        kiln._C._jagged_attention(v, v, v, kiln.tensor([0, 2, 4]))
    with pytest.raises(TypeError, match="expected int64 offsets"):
        kiln._C._jagged_attention(v, v, v, kiln.tensor([0, 2, 5], dtype=kiln.int32))


# ---- parity: chargpt's GPT on a nested batch vs the padded, masked batch -----------------------
def load_chargpt():
    return load_example("chargpt")


def fortunes(n, lo=8, hi=64):
    """n variable-length byte sequences: fortunes of lo..hi bytes (chargpt's data) where Debian's
    fortunes package is installed, else random bytes of random lengths."""
    if os.path.isdir(FORTUNES):
        text, _ = load_chargpt().read_fortunes(FORTUNES)
        picks = [f for f in bytes(text).split(b"\n%\n") if lo <= len(f) <= hi][:n]
        if len(picks) == n:
            return [np.frombuffer(f, np.uint8).astype(np.int64) for f in picks]
    rng = np.random.default_rng(0)
    return [rng.integers(0, 256, rng.integers(lo, hi + 1)) for _ in range(n)]


def nested_loss(model, batch):
    """The GPT of examples/chargpt.py on a nested batch: its own modules and Blocks, unchanged,
    with per-sequence positions; next-byte cross entropy over all packed tokens."""
    idx = kiln.nested.as_nested_tensor([kiln.from_numpy(s[:-1].copy()) for s in batch])
    pos = kiln.nested.as_nested_tensor([kiln.arange(len(s) - 1) for s in batch])
    tgt = kiln.nested.as_nested_tensor([kiln.from_numpy(s[1:].copy()) for s in batch])
    x = model.tok(idx) + model.pos(pos)
    return F.cross_entropy(model.head(model.ln(model.blocks(x))), tgt)


def padded_loss(model, batch):
    """The same batch padded to its longest sequence: causal attention keeps every real token
    from seeing the padding after it, and the padded targets are ignored."""
    L = max(len(s) for s in batch) - 1
    idx = np.zeros((len(batch), L), np.int64)
    tgt = np.full((len(batch), L), -100, np.int64)
    for b, s in enumerate(batch):
        idx[b, :len(s) - 1], tgt[b, :len(s) - 1] = s[:-1], s[1:]
    logits = model(kiln.from_numpy(idx))
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), kiln.from_numpy(tgt).reshape(-1),
                           ignore_index=-100)


def test_chargpt_nested_matches_padded():
    chargpt = load_chargpt()
    kiln.manual_seed(0)
    model = chargpt.GPT(vocab=256, block=64, layers=2, heads=2, width=32)
    batch = fortunes(12)
    assert len({len(s) for s in batch}) > 1
    opt_n = kiln.optim.SGD(model.parameters(), lr=0.1)
    for step in range(3):  # train on the nested batch; the padded loss and grads must agree
        model.zero_grad()
        ref = padded_loss(model, batch)
        ref.backward()
        ref_grads = {n: p.grad.detach().clone() for n, p in model.named_parameters()}
        model.zero_grad()
        loss = nested_loss(model, batch)
        loss.backward()
        np.testing.assert_allclose(loss.item(), ref.item(), rtol=1e-5)
        for n, p in model.named_parameters():
            g, r = p.grad.numpy(), ref_grads[n].numpy()
            scale = max(np.abs(r).max(), 1e-6)
            assert np.abs(g - r).max() <= 1e-5 * scale, (step, n, np.abs(g - r).max(), scale)
        opt_n.step()
