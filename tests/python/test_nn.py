"""kiln.nn: module mechanics, every layer against NumPy or its functional form, init, clipping."""
import math
from collections import OrderedDict

import numpy as np
import pytest

import kiln
import kiln.nn as nn
import kiln.nn.functional as F


def T(a, **kw):
    return kiln.tensor(np.asarray(a, dtype=np.float32), **kw)


def A(t):
    return t.detach().numpy()


def close(t, ref, tol=1e-5):
    np.testing.assert_allclose(A(t), ref, rtol=tol, atol=tol)


# ---- module mechanics ----------------------------------------------------------------------------
class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 3)
        self.scale = nn.Parameter(kiln.ones(3))
        self.register_buffer("count", kiln.zeros([]))
        self.register_buffer("scratch", kiln.zeros(2), persistent=False)
        self.plain = 5

    def forward(self, x):
        return self.fc(x) * self.scale


def test_registration_and_iteration():
    m = Net()
    assert [n for n, _ in m.named_parameters()] == ["scale", "fc.weight", "fc.bias"]
    assert [n for n, _ in m.named_buffers()] == ["count", "scratch"]
    assert [n for n, _ in m.named_modules()] == ["", "fc"]
    assert list(m.children()) == [m.fc] and len(list(m.modules())) == 2
    assert m.plain == 5 and "plain" not in m._parameters
    assert isinstance(m.scale, nn.Parameter) and isinstance(m.scale, kiln.Tensor)
    assert m.scale.requires_grad and m.scale.is_leaf
    # one object per parameter: identity and .grad go through
    p = m.scale
    assert m.scale is p and next(m.parameters()) is p
    m(kiln.randn(2, 4)).sum().backward()
    assert m.scale.grad is not None and p.grad.shape == (3,)
    with pytest.raises(AttributeError, match="no attribute 'nothing'"):
        m.nothing
    with pytest.raises(TypeError, match="cannot assign 'Tensor' as parameter 'scale'"):
        m.scale = kiln.ones(3)
    m.scale = None
    assert [n for n, _ in m.named_parameters()] == ["fc.weight", "fc.bias"]
    del m.fc
    assert list(m.children()) == []


def test_shared_parameters_counted_once():
    lin = nn.Linear(2, 2)
    seq = nn.Sequential(lin, lin)
    assert len(list(seq.parameters())) == 2
    assert [n for n, _ in seq.named_parameters(remove_duplicate=False)] == [
        "0.weight", "0.bias", "1.weight", "1.bias"]


def test_state_dict_roundtrip_and_errors():
    a, b = Net(), Net()
    sd = a.state_dict()
    assert list(sd) == ["scale", "count", "fc.weight", "fc.bias"]  # scratch is not persistent
    assert not sd["fc.weight"].requires_grad
    r = b.load_state_dict(sd)
    assert r.missing_keys == [] and r.unexpected_keys == []
    close(b.fc.weight, A(a.fc.weight))
    bad = dict(sd)
    del bad["fc.bias"]
    bad["extra"] = kiln.zeros(1)
    with pytest.raises(RuntimeError, match='Missing key\\(s\\) in state_dict: "fc.bias"') as e:
        b.load_state_dict(bad)
    assert 'Unexpected key(s) in state_dict: "extra"' in str(e.value)
    r = b.load_state_dict(bad, strict=False)
    assert r.missing_keys == ["fc.bias"] and r.unexpected_keys == ["extra"]
    bad = dict(sd, scale=kiln.zeros(4))
    with pytest.raises(RuntimeError, match="size mismatch for scale"):
        b.load_state_dict(bad)


def test_train_eval_apply_zero_grad_to():
    m = nn.Sequential(nn.Linear(3, 3), nn.Dropout(0.5), nn.BatchNorm1d(3))
    assert all(x.training for x in m.modules())
    m.eval()
    assert not any(x.training for x in m.modules())
    m.train()
    seen = []
    m.apply(lambda mod: seen.append(type(mod).__name__))
    assert seen == ["Linear", "Dropout", "BatchNorm1d", "Sequential"]
    m(kiln.randn(4, 3)).sum().backward()
    w = m[0].weight
    m.zero_grad(set_to_none=False)
    assert float(w.grad.abs().sum()) == 0
    m.zero_grad()
    assert w.grad is None
    m.to(float)  # Tensor.to's parser: Python's float is float64
    assert m[0].weight is w and w.dtype is kiln.float64 and w.requires_grad
    with pytest.raises(TypeError, match="floating point"):
        m.to(kiln.int32)
    with pytest.raises(TypeError, match="invalid argument"):
        m.to([1])
    assert m[2].running_mean.dtype is kiln.float64
    assert m[2].num_batches_tracked.dtype is kiln.int64  # not floating: kept
    assert m(kiln.randn(4, 3, dtype=kiln.float64)).dtype is kiln.float64


def test_repr_like_torch():
    m = nn.Sequential(nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
                      nn.Linear(16, 10, bias=False))
    assert repr(m) == (
        "Sequential(\n"
        "  (0): Conv2d(1, 16, kernel_size=(3, 3), stride=(1, 1), padding=(1, 1))\n"
        "  (1): ReLU()\n"
        "  (2): MaxPool2d(kernel_size=2, stride=2, padding=0, dilation=1, ceil_mode=False)\n"
        "  (3): Flatten(start_dim=1, end_dim=-1)\n"
        "  (4): Linear(in_features=16, out_features=10, bias=False)\n"
        ")")
    assert repr(nn.LayerNorm(8)) == "LayerNorm((8,), eps=1e-05, elementwise_affine=True)"
    assert repr(nn.Parameter(kiln.zeros(1))).startswith("Parameter containing:\ntensor(")


def test_containers():
    seq = nn.Sequential(OrderedDict(a=nn.ReLU(), b=nn.Tanh()))
    assert [n for n, _ in seq.named_children()] == ["a", "b"] and isinstance(seq[-1], nn.Tanh)
    assert len(seq[:1]) == 1
    ml = nn.ModuleList([nn.Linear(2, 2) for _ in range(3)])
    ml.append(nn.ReLU())
    ml.insert(0, nn.Tanh())
    assert len(ml) == 5 and isinstance(ml[0], nn.Tanh) and isinstance(ml[-1], nn.ReLU)
    del ml[0]
    assert [n for n, _ in ml.named_children()] == ["0", "1", "2", "3"]
    assert len(list(ml.parameters())) == 6
    md = nn.ModuleDict({"x": nn.Linear(2, 3)})
    md["y"] = nn.ReLU()
    assert list(md.keys()) == ["x", "y"] and "x" in md
    assert [n for n, _ in md.named_parameters()] == ["x.weight", "x.bias"]


# ---- layers vs NumPy -------------------------------------------------------------------------------
def test_linear_and_default_init():
    kiln.manual_seed(0)
    lin = nn.Linear(50, 7)
    bound = 1 / math.sqrt(50)
    assert float(lin.weight.abs().max()) <= bound and float(lin.bias.abs().max()) <= bound
    assert float(lin.weight.abs().max()) > 0.8 * bound
    x = kiln.randn(3, 50)
    close(lin(x), A(x) @ A(lin.weight).T + A(lin.bias), 1e-4)


def test_bilinear():
    m = nn.Bilinear(3, 4, 2)
    x1, x2 = kiln.randn(5, 3), kiln.randn(5, 4)
    ref = np.einsum("ni,oij,nj->no", A(x1), A(m.weight), A(x2)) + A(m.bias)
    close(m(x1, x2), ref, 1e-4)


def np_conv2d(x, w, b, stride, pad):
    x = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    N, C, H, W = x.shape
    O, _, kh, kw = w.shape
    Ho, Wo = (H - kh) // stride + 1, (W - kw) // stride + 1
    out = np.zeros((N, O, Ho, Wo), np.float64)
    for i in range(Ho):
        for j in range(Wo):
            patch = x[:, :, i * stride:i * stride + kh, j * stride:j * stride + kw]
            out[:, :, i, j] = np.einsum("nchw,ochw->no", patch, w)
    return out + b.reshape(1, -1, 1, 1)


def test_conv1d_conv2d_conv_transpose2d():
    c = nn.Conv2d(3, 4, 3, stride=2, padding=1)
    x = kiln.randn(2, 3, 7, 6)
    close(c(x), np_conv2d(A(x), A(c.weight), A(c.bias), 2, 1), 1e-4)
    c1 = nn.Conv1d(2, 3, 3, padding=1)
    x1 = kiln.randn(2, 2, 9)
    ref = np_conv2d(np.pad(A(x1), ((0, 0), (0, 0), (1, 1)))[:, :, None, :],
                    A(c1.weight)[:, :, None, :], A(c1.bias), 1, 0)[:, :, 0, :]
    close(c1(x1), ref, 1e-4)
    ct = nn.ConvTranspose2d(3, 2, 3, stride=2)
    assert tuple(ct.weight.shape) == (3, 2, 3, 3)
    xt = kiln.randn(1, 3, 4, 4)
    y = ct(xt)
    ref = np.zeros((1, 2, 9, 9))
    xa, wa = A(xt), A(ct.weight)
    for i in range(4):
        for j in range(4):
            ref[:, :, 2 * i:2 * i + 3, 2 * j:2 * j + 3] += np.einsum("nc,cohw->nohw", xa[:, :, i, j], wa)
    close(y, ref + A(ct.bias).reshape(1, -1, 1, 1), 1e-4)
    with pytest.raises(ValueError, match="divisible by groups"):
        nn.Conv2d(3, 4, 3, groups=2)


def test_pooling():
    x = kiln.randn(2, 3, 6, 6)
    a = A(x).reshape(2, 3, 3, 2, 3, 2)
    close(nn.MaxPool2d(2)(x), a.max(axis=(3, 5)))
    close(nn.AvgPool2d(2)(x), a.mean(axis=(3, 5)))
    close(nn.AdaptiveAvgPool2d(1)(x), A(x).mean(axis=(2, 3), keepdims=True))
    v, i = F.max_pool2d(x, 2, return_indices=True)
    assert i.dtype is kiln.int64 and v.shape == (2, 3, 3, 3)


def test_batchnorm_train_and_eval():
    bn = nn.BatchNorm1d(3)
    x = kiln.randn(8, 3) * 2 + 1
    y = bn(x)
    a = A(x)
    close(y, (a - a.mean(0)) / np.sqrt(a.var(0) + 1e-5), 1e-4)
    close(bn.running_mean, 0.1 * a.mean(0), 1e-5)
    close(bn.running_var, 0.9 + 0.1 * a.var(0, ddof=1), 1e-5)
    assert bn.num_batches_tracked.item() == 1
    bn.eval()
    close(bn(x), (a - A(bn.running_mean)) / np.sqrt(A(bn.running_var) + 1e-5), 1e-4)
    bn2 = nn.BatchNorm2d(2, momentum=None)
    bn2(kiln.randn(2, 2, 3, 3))
    with pytest.raises(ValueError, match="expected 4D input"):
        bn2(kiln.randn(2, 2))


def test_norms():
    x = kiln.randn(4, 6)
    a = A(x)
    ln = nn.LayerNorm(6)
    close(ln(x), (a - a.mean(-1, keepdims=True)) / np.sqrt(a.var(-1, keepdims=True) + 1e-5), 1e-4)
    rms = nn.RMSNorm(6, eps=1e-6)
    close(rms(x), a / np.sqrt((a * a).mean(-1, keepdims=True) + 1e-6), 1e-4)
    gn = nn.GroupNorm(2, 4)
    x4 = kiln.randn(2, 4, 3)
    g = A(x4).reshape(2, 2, 6)
    ref = ((g - g.mean(-1, keepdims=True)) / np.sqrt(g.var(-1, keepdims=True) + 1e-5)).reshape(2, 4, 3)
    close(gn(x4), ref, 1e-4)
    assert [n for n, _ in nn.LayerNorm(6, bias=False).named_parameters()] == ["weight"]


def test_embedding_dropout_flatten_identity():
    emb = nn.Embedding(10, 3, padding_idx=-1)
    assert emb.padding_idx == 9 and float(emb.weight[9].abs().sum()) == 0
    idx = kiln.tensor([[1, 9], [4, 4]])
    close(emb(idx), A(emb.weight)[np.array([[1, 9], [4, 4]])])
    close(F.embedding(idx, emb.weight), A(emb(idx)))
    d = nn.Dropout(0.25)
    x = kiln.ones(1000)
    y = A(d(x))
    assert np.allclose(y[y > 0], 1 / 0.75) and 0.6 < (y > 0).mean() < 0.9
    d.eval()
    close(d(x), A(x))
    assert nn.Flatten()(kiln.zeros(2, 3, 4)).shape == (2, 12)
    assert nn.Identity(54, unused=1)(x) is x


def test_activations():
    x = kiln.randn(3, 5)
    a = A(x).astype(np.float64)
    close(nn.ReLU()(x), np.maximum(a, 0))
    close(nn.Tanh()(x), np.tanh(a))
    close(nn.Sigmoid()(x), 1 / (1 + np.exp(-a)))
    close(nn.SiLU()(x), a / (1 + np.exp(-a)))
    erf = np.vectorize(math.erf)
    close(nn.GELU()(x), 0.5 * a * (1 + erf(a / math.sqrt(2))), 1e-4)
    close(nn.GELU("tanh")(x), 0.5 * a * (1 + np.tanh(math.sqrt(2 / math.pi) * (a + 0.044715 * a ** 3))), 1e-4)
    sm = np.exp(a) / np.exp(a).sum(1, keepdims=True)
    close(nn.Softmax(dim=1)(x), sm)
    close(nn.LogSoftmax(dim=-1)(x), np.log(sm), 1e-4)
    close(F.softmax(x), sm)  # implicit dim 1 for 2-D, as PyTorch
    close(nn.LeakyReLU(0.1)(x), np.where(a > 0, a, 0.1 * a))
    y = x.clone()
    nn.ReLU(inplace=True)(y)
    close(y, np.maximum(a, 0))


def test_losses():
    logits, target = kiln.randn(6, 4), kiln.tensor([0, 3, 1, 1, 2, 0])
    lg, t = A(logits).astype(np.float64), np.array([0, 3, 1, 1, 2, 0])
    logp = lg - np.log(np.exp(lg).sum(1, keepdims=True))
    close(nn.CrossEntropyLoss()(logits, target), -logp[np.arange(6), t].mean(), 1e-5)
    close(nn.CrossEntropyLoss(reduction="sum")(logits, target), -logp[np.arange(6), t].sum(), 1e-4)
    close(nn.NLLLoss()(T(logp), target), -logp[np.arange(6), t].mean(), 1e-5)
    w = np.array([1.0, 2.0, 0.5, 1.0])
    ce_w = nn.CrossEntropyLoss(weight=T(w))(logits, target)
    close(ce_w, (-logp[np.arange(6), t] * w[t]).sum() / w[t].sum(), 1e-5)
    x, y = kiln.randn(5, 3), kiln.randn(5, 3)
    d = A(x) - A(y)
    close(nn.MSELoss()(x, y), (d ** 2).mean())
    close(nn.L1Loss(reduction="none")(x, y), np.abs(d))
    sl1 = np.where(np.abs(d) < 0.5, 0.5 * d ** 2 / 0.5, np.abs(d) - 0.25)
    close(nn.SmoothL1Loss(beta=0.5)(x, y), sl1.mean())
    hub = np.where(np.abs(d) < 2, 0.5 * d ** 2, 2 * (np.abs(d) - 1))
    close(nn.HuberLoss(delta=2.0)(x, y), hub.mean())
    p, q = kiln.rand(5), kiln.rand(5)
    pa, qa = A(p), A(q)
    close(nn.BCELoss()(p, q), -(qa * np.log(pa) + (1 - qa) * np.log(1 - pa)).mean(), 1e-5)
    z = kiln.randn(5)
    sz = 1 / (1 + np.exp(-A(z)))
    close(nn.BCEWithLogitsLoss()(z, q), -(qa * np.log(sz) + (1 - qa) * np.log(1 - sz)).mean(), 1e-5)
    lp = np.log(pa / pa.sum())
    qa2 = qa / qa.sum()
    close(nn.KLDivLoss(reduction="sum")(T(lp), T(qa2)), (qa2 * (np.log(qa2) - lp)).sum(), 1e-5)
    with pytest.raises(ValueError, match="reduction must be one of"):
        nn.MSELoss(reduction="avg")


def np_attention(q, k, v, mask=None):
    s = q @ np.swapaxes(k, -1, -2) / math.sqrt(q.shape[-1])
    if mask is not None:
        s = s + mask
    w = np.exp(s - s.max(-1, keepdims=True))
    w /= w.sum(-1, keepdims=True)
    return w @ v, w


def test_multihead_attention_vs_numpy():
    E, H, N, L, S = 8, 2, 3, 4, 5
    mha = nn.MultiheadAttention(E, H)
    with kiln.no_grad():
        mha.in_proj_bias.normal_()
        mha.out_proj.bias.normal_()
    q, k, v = kiln.randn(L, N, E), kiln.randn(S, N, E), kiln.randn(S, N, E)
    kpm = kiln.tensor([[False] * 4 + [True]] * N)
    out, w = mha(q, k, v, key_padding_mask=kpm)
    W, b = A(mha.in_proj_weight), A(mha.in_proj_bias)

    def proj(x, i, n):  # (n, N, E) -> (N, H, n, D)
        y = x.transpose(1, 0, 2) @ W[i * E:(i + 1) * E].T + b[i * E:(i + 1) * E]
        return y.reshape(N, n, H, E // H).transpose(0, 2, 1, 3)
    mask = np.where(A(kpm), -np.inf, 0.0)[:, None, None, :]
    o, wr = np_attention(proj(A(q), 0, L), proj(A(k), 1, S), proj(A(v), 2, S), mask)
    o = o.transpose(0, 2, 1, 3).reshape(N, L, E) @ A(mha.out_proj.weight).T + A(mha.out_proj.bias)
    close(out, o.transpose(1, 0, 2), 1e-4)
    close(w, wr.mean(1), 1e-5)
    # self-attention without masks and weights takes the fused kernel: same values
    x = kiln.randn(N, L, E)
    mha.batch_first = True
    fused, none = mha(x, x, x, need_weights=False)
    explicit, _ = mha(x, x, x, need_weights=True)
    assert none is None
    close(fused, A(explicit), 1e-4)
    causal, _ = mha(x, x, x, need_weights=False, is_causal=True)
    masked, _ = mha(x, x, x, attn_mask=kiln.ones(L, L, dtype=kiln.bool).triu(1))
    close(causal, A(masked), 1e-4)
    assert mha(x, x, x, attn_mask=kiln.ones(L, L, dtype=kiln.bool).triu(1),
               need_weights=False)[1] is None  # the written-out path, weights not returned


def test_transformer_layers():
    kiln.manual_seed(0)
    enc = nn.TransformerEncoderLayer(8, 2, dim_feedforward=16, dropout=0.0, batch_first=True)
    x = kiln.randn(2, 5, 8)
    sa = enc.self_attn(x, x, x, need_weights=False)[0]
    h = enc.norm1(x + sa)
    ref = enc.norm2(h + enc.linear2(F.relu(enc.linear1(h))))
    close(enc(x), A(ref), 1e-5)
    assert len(list(enc.parameters())) == 12
    dec = nn.TransformerDecoderLayer(8, 2, 16, 0.0, activation="gelu", norm_first=True)
    tgt, mem = kiln.randn(4, 2, 8), kiln.randn(6, 2, 8)
    y = dec(tgt, mem, tgt_is_causal=True)
    assert y.shape == (4, 2, 8)
    y.sum().backward()
    assert dec.multihead_attn.in_proj_weight.grad is not None
    with pytest.raises(RuntimeError, match="activation should be relu/gelu"):
        nn.TransformerEncoderLayer(8, 2, activation="elu")


def test_functional_forms_match_modules():
    x = kiln.randn(2, 3, 6, 6)
    c = nn.Conv2d(3, 4, 3)
    close(F.conv2d(x, c.weight, c.bias), A(c(x)))
    close(F.avg_pool2d(x, 3, 1, 1), A(nn.AvgPool2d(3, 1, 1)(x)))
    close(F.layer_norm(x, (6,)), A(nn.LayerNorm(6)(x)))
    close(F.group_norm(x, 3), A(nn.GroupNorm(3, 3)(x)))
    close(F.batch_norm(x, None, None, training=True), A(nn.BatchNorm2d(3, affine=False,
                                                                   track_running_stats=False)(x)))
    close(F.normalize(x, dim=1), A(x) / np.linalg.norm(A(x), axis=1, keepdims=True), 1e-5)
    q, k, v = kiln.randn(2, 2, 4, 8), kiln.randn(2, 2, 4, 8), kiln.randn(2, 2, 4, 8)
    keep = kiln.ones(4, 4, dtype=kiln.bool).tril()
    close(F.scaled_dot_product_attention(q, k, v, attn_mask=keep),
          A(F.scaled_dot_product_attention(q, k, v, is_causal=True)), 1e-5)
    assert F.one_hot(kiln.tensor([1, 0]), 3).tolist() == [[0, 1, 0], [1, 0, 0]]


# ---- init and clipping -----------------------------------------------------------------------------
def test_init():
    kiln.manual_seed(1)
    w = kiln.empty(200, 300)
    nn.init.kaiming_uniform_(w, nonlinearity="relu")
    b = math.sqrt(6 / 300)
    assert float(w.abs().max()) <= b and abs(float(w.std()) - b / math.sqrt(3)) < 0.005
    nn.init.xavier_normal_(w)
    assert abs(float(w.std()) - math.sqrt(2 / 500)) < 0.003
    nn.init.trunc_normal_(w, mean=1.0, std=2.0, a=-1.0, b=2.0)
    a = A(w)
    assert a.min() >= -1.0 and a.max() <= 2.0 and a.min() < -0.99 and a.max() > 1.99
    nn.init.orthogonal_(w, gain=2.0)
    close(kiln.tensor(A(w) @ A(w).T), 4 * np.eye(200), 1e-4)
    assert nn.init.calculate_gain("leaky_relu", 0.2) == pytest.approx(math.sqrt(2 / 1.04))
    nn.init.zeros_(w)
    assert float(w.abs().sum()) == 0
    p = nn.Parameter(kiln.empty(3, 4))
    nn.init.normal_(p)
    assert p.is_leaf and p.requires_grad


def test_clip_grad():
    a, b = nn.Parameter(kiln.zeros(3)), nn.Parameter(kiln.zeros(4))
    a.grad, b.grad = T([3.0, 0, 0]), T([0, 4.0, 0, 0])
    total = nn.utils.clip_grad_norm_([a, b], 1.0)
    assert float(total) == pytest.approx(5.0)
    close(a.grad, [0.6, 0, 0], 1e-5)
    close(b.grad, [0, 0.8, 0, 0], 1e-5)
    total = nn.utils.clip_grad_norm_([a, b], 10.0, norm_type="inf")
    assert float(total) == pytest.approx(0.8, rel=1e-5)
    close(b.grad, [0, 0.8, 0, 0], 1e-5)
    nn.utils.clip_grad_value_([a, b], 0.7)
    close(b.grad, [0, 0.7, 0, 0])
