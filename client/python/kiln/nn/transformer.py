"""MultiheadAttention and the Transformer encoder/decoder layers (torch.nn's signatures, parameter
names and initialisation). Attention is kiln.nn.functional's: the fused kernel without masks
and need_weights=False, else the written-out path softmax(q kᵀ/√d + mask) v, the masks combined
into one additive float mask (True entries of a bool mask are excluded, as in PyTorch's
MultiheadAttention)."""
import math

from kiln import _C
from kiln.nn import functional as F
from kiln.nn import init
from kiln.nn.layers import Dropout, LayerNorm, Linear
from kiln.nn.module import Module
from kiln.nn.parameter import Parameter

__all__ = ["MultiheadAttention", "TransformerEncoderLayer", "TransformerDecoderLayer"]


def _additive(mask, dtype):
    if mask.dtype is _C.bool:
        return _C.zeros(list(mask.shape), dtype=dtype, device=mask.device).masked_fill(mask, -math.inf)
    return mask.to(dtype)


class MultiheadAttention(Module):
    def __init__(self, embed_dim, num_heads, dropout=0.0, bias=True, add_bias_kv=False,
                 add_zero_attn=False, kdim=None, vdim=None, batch_first=False, device=None,
                 dtype=None):
        super().__init__()
        if num_heads <= 0 or embed_dim % num_heads:
            raise ValueError(f"MultiheadAttention: embed_dim ({embed_dim}) must be divisible by "
                             f"num_heads ({num_heads})")
        if add_bias_kv or add_zero_attn or (kdim not in (None, embed_dim)) \
                or (vdim not in (None, embed_dim)):
            raise NotImplementedError("MultiheadAttention: add_bias_kv, add_zero_attn and "
                                      "kdim/vdim != embed_dim are not supported in Kiln")
        self.embed_dim, self.num_heads, self.head_dim = embed_dim, num_heads, embed_dim // num_heads
        self.kdim = self.vdim = embed_dim
        self.dropout, self.batch_first = dropout, batch_first
        self.in_proj_weight = Parameter(_C.empty([3 * embed_dim, embed_dim], dtype=dtype, device=device))
        if bias:
            self.in_proj_bias = Parameter(_C.zeros([3 * embed_dim], dtype=dtype, device=device))
        else:
            self.register_parameter("in_proj_bias", None)
        self.out_proj = Linear(embed_dim, embed_dim, bias, device, dtype)
        init.xavier_uniform_(self.in_proj_weight)
        if bias:
            init.zeros_(self.out_proj.bias)

    def extra_repr(self):
        return f"embed_dim={self.embed_dim}, num_heads={self.num_heads}, dropout={self.dropout}, " \
               f"batch_first={self.batch_first}"

    def forward(self, query, key, value, key_padding_mask=None, need_weights=True, attn_mask=None,
                average_attn_weights=True, is_causal=False):
        """query: (L, N, E) ((N, L, E) if batch_first, (L, E) unbatched), key/value: (S, N, E) ->
        (output like query, weights (N, L, S) averaged over heads, or (N, H, L, S), or None)."""
        E, H, D = self.embed_dim, self.num_heads, self.head_dim
        if query.ndim not in (2, 3) or key.ndim != query.ndim or value.ndim != query.ndim:
            raise ValueError("MultiheadAttention: query, key and value must all be 2-D or 3-D, got "
                             f"{tuple(query.shape)}, {tuple(key.shape)} and {tuple(value.shape)}")
        if query.shape[-1] != E or key.shape[-1] != E or value.shape[-1] != E:
            raise ValueError(f"MultiheadAttention: expected embedding size {E}, got query "
                             f"{tuple(query.shape)}, key {tuple(key.shape)}, value {tuple(value.shape)}")
        unbatched = query.ndim == 2

        def batched(t):
            return t.unsqueeze(0) if unbatched else (t if self.batch_first else t.transpose(0, 1))
        q, k, v = batched(query), batched(key), batched(value)
        N, L, S = q.shape[0], q.shape[1], k.shape[1]
        if k.shape[0] != N or v.shape[:2] != (N, S):
            raise ValueError(f"MultiheadAttention: key {tuple(key.shape)} and value "
                             f"{tuple(value.shape)} do not match query {tuple(query.shape)}")

        def heads(t, n):
            return t.reshape([N, n, H, D]).transpose(1, 2)
        w, b = self.in_proj_weight, self.in_proj_bias
        if query is key and key is value:  # self-attention: one (E -> 3E) projection
            qh, kh, vh = _C.linear(q, w, b).chunk(3, -1)
            qh, kh, vh = heads(qh, L), heads(kh, S), heads(vh, S)
        else:
            ws = w.chunk(3, 0)
            bs = b.chunk(3, 0) if b is not None else (None, None, None)
            qh = heads(_C.linear(q, ws[0], bs[0]), L)
            kh = heads(_C.linear(k, ws[1], bs[1]), S)
            vh = heads(_C.linear(v, ws[2], bs[2]), S)

        mask = None
        if attn_mask is not None:
            m = attn_mask
            if tuple(m.shape) not in ((L, S), (N * H, L, S)):
                raise ValueError(f"MultiheadAttention: attn_mask must be ({L}, {S}) or "
                                 f"({N * H}, {L}, {S}), got shape {tuple(m.shape)}")
            mask = _additive(m, q.dtype)
            if m.ndim == 3:
                mask = mask.reshape([N, H, L, S])
        if key_padding_mask is not None:
            want = (S,) if unbatched else (N, S)
            if tuple(key_padding_mask.shape) != want:
                raise ValueError(f"MultiheadAttention: key_padding_mask must be {want}, got shape "
                                 f"{tuple(key_padding_mask.shape)}")
            kpm = _additive(key_padding_mask, q.dtype).reshape([N, 1, 1, S])
            mask = kpm if mask is None else mask + kpm
        causal = is_causal and attn_mask is None
        p = self.dropout if self.training else 0.0
        o, weights = F._attention(qh, kh, vh, mask, p, causal, need_weights=need_weights)
        out = self.out_proj(o.transpose(1, 2).reshape([N, L, E]))
        out = out.squeeze([0]) if unbatched else (out if self.batch_first else out.transpose(0, 1))
        if weights is not None:
            if average_attn_weights:
                weights = weights.mean([1])
            if unbatched:
                weights = weights.squeeze([0])
        return out, weights


def _activation(activation):
    if callable(activation):
        return activation
    if activation == "relu":
        return _C.relu
    if activation == "gelu":
        return _C.gelu
    raise RuntimeError(f"activation should be relu/gelu, not {activation}")


class TransformerEncoderLayer(Module):
    def __init__(self, d_model, nhead, dim_feedforward=2048, dropout=0.1, activation="relu",
                 layer_norm_eps=1e-5, batch_first=False, norm_first=False, bias=True, device=None,
                 dtype=None):
        super().__init__()
        self.self_attn = MultiheadAttention(d_model, nhead, dropout, bias, batch_first=batch_first,
                                            device=device, dtype=dtype)
        self.linear1 = Linear(d_model, dim_feedforward, bias, device, dtype)
        self.dropout = Dropout(dropout)
        self.linear2 = Linear(dim_feedforward, d_model, bias, device, dtype)
        self.norm_first = norm_first
        self.norm1 = LayerNorm(d_model, layer_norm_eps, bias=bias, device=device, dtype=dtype)
        self.norm2 = LayerNorm(d_model, layer_norm_eps, bias=bias, device=device, dtype=dtype)
        self.dropout1 = Dropout(dropout)
        self.dropout2 = Dropout(dropout)
        self.activation = _activation(activation)

    def _sa(self, x, mask, kpm, is_causal):
        return self.dropout1(self.self_attn(x, x, x, key_padding_mask=kpm, need_weights=False,
                                            attn_mask=mask, is_causal=is_causal)[0])

    def _ff(self, x):
        return self.dropout2(self.linear2(self.dropout(self.activation(self.linear1(x)))))

    def forward(self, src, src_mask=None, src_key_padding_mask=None, is_causal=False):
        x = src
        if self.norm_first:
            x = x + self._sa(self.norm1(x), src_mask, src_key_padding_mask, is_causal)
            return x + self._ff(self.norm2(x))
        x = self.norm1(x + self._sa(x, src_mask, src_key_padding_mask, is_causal))
        return self.norm2(x + self._ff(x))


class TransformerDecoderLayer(Module):
    def __init__(self, d_model, nhead, dim_feedforward=2048, dropout=0.1, activation="relu",
                 layer_norm_eps=1e-5, batch_first=False, norm_first=False, bias=True, device=None,
                 dtype=None):
        super().__init__()

        def mha():
            return MultiheadAttention(d_model, nhead, dropout, bias, batch_first=batch_first,
                                      device=device, dtype=dtype)

        def norm():
            return LayerNorm(d_model, layer_norm_eps, bias=bias, device=device, dtype=dtype)
        self.self_attn = mha()
        self.multihead_attn = mha()
        self.linear1 = Linear(d_model, dim_feedforward, bias, device, dtype)
        self.dropout = Dropout(dropout)
        self.linear2 = Linear(dim_feedforward, d_model, bias, device, dtype)
        self.norm_first = norm_first
        self.norm1, self.norm2, self.norm3 = norm(), norm(), norm()
        self.dropout1, self.dropout2, self.dropout3 = Dropout(dropout), Dropout(dropout), Dropout(dropout)
        self.activation = _activation(activation)

    def _sa(self, x, mask, kpm, is_causal):
        return self.dropout1(self.self_attn(x, x, x, key_padding_mask=kpm, need_weights=False,
                                            attn_mask=mask, is_causal=is_causal)[0])

    def _ca(self, x, mem, mask, kpm, is_causal):
        return self.dropout2(self.multihead_attn(x, mem, mem, key_padding_mask=kpm,
                                                 need_weights=False, attn_mask=mask,
                                                 is_causal=is_causal)[0])

    def _ff(self, x):
        return self.dropout3(self.linear2(self.dropout(self.activation(self.linear1(x)))))

    def forward(self, tgt, memory, tgt_mask=None, memory_mask=None, tgt_key_padding_mask=None,
                memory_key_padding_mask=None, tgt_is_causal=False, memory_is_causal=False):
        x = tgt
        if self.norm_first:
            x = x + self._sa(self.norm1(x), tgt_mask, tgt_key_padding_mask, tgt_is_causal)
            x = x + self._ca(self.norm2(x), memory, memory_mask, memory_key_padding_mask,
                             memory_is_causal)
            return x + self._ff(self.norm3(x))
        x = self.norm1(x + self._sa(x, tgt_mask, tgt_key_padding_mask, tgt_is_causal))
        x = self.norm2(x + self._ca(x, memory, memory_mask, memory_key_padding_mask,
                                    memory_is_causal))
        return self.norm3(x + self._ff(x))
