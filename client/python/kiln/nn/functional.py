"""kiln.nn.functional: the functional forms of the layers and losses (torch.nn.functional), with
PyTorch's signatures, over the op table's functions.

    import kiln.nn.functional as F
    y = F.relu(F.linear(x, w, b))
    loss = F.cross_entropy(logits, target, label_smoothing=0.1)
"""
import math

from kiln import _C
from kiln import nested as _nested
from kiln.nested import NestedTensor as _Nested

__all__ = [
    "linear", "bilinear", "conv1d", "conv2d", "conv_transpose2d", "max_pool2d", "avg_pool2d",
    "adaptive_avg_pool2d", "batch_norm", "layer_norm", "rms_norm", "group_norm", "embedding",
    "dropout", "relu", "relu_", "gelu", "silu", "softplus", "tanh", "sigmoid", "softmax",
    "log_softmax",
    "leaky_relu", "normalize", "pad", "interpolate", "one_hot", "scaled_dot_product_attention",
    "cross_entropy", "nll_loss", "mse_loss", "l1_loss", "smooth_l1_loss", "huber_loss",
    "binary_cross_entropy", "binary_cross_entropy_with_logits", "kl_div",
]

# Note [Nested dispatch]: the functions below that a transformer on packed sequences needs
# (linear, layer_norm, the activations, dropout, embedding, softmax, scaled_dot_product_attention,
# cross_entropy) and the layers that call them send a kiln.nested.NestedTensor input to
# kiln.nested, which applies the op to its values (or, for attention, runs the fused kernel
# that takes the offsets); See Note [Nested tensors] in kiln/nested.py. A dense input pays one
# class comparison.
def linear(input, weight, bias=None):
    if input.__class__ is _Nested:
        return _nested.linear(input, weight, bias)
    return _C.linear(input, weight, bias)


conv1d = _C.conv1d
conv2d = _C.conv2d
adaptive_avg_pool2d = _C.adaptive_avg_pool2d
tanh = _C.tanh
sigmoid = _C.sigmoid
one_hot = _C.one_hot
pad = _C.pad
interpolate = _C.interpolate


def bilinear(input1, input2, weight, bias=None):
    """input1: (*, I), input2: (*, J), weight: (O, I, J), bias: (O) -> (*, O);
    y_o = input1ᵀ W_o input2 + b_o."""
    if weight.ndim != 3:
        raise ValueError(f"bilinear: weight must be (out, in1, in2), got shape {tuple(weight.shape)}")
    O, I, J = weight.shape
    if input1.ndim < 1 or input2.ndim != input1.ndim or input1.shape[-1] != I \
            or input2.shape[-1] != J or input1.shape[:-1] != input2.shape[:-1]:
        raise ValueError(f"bilinear: input sizes {tuple(input1.shape)} and {tuple(input2.shape)} "
                         f"do not match weight {tuple(weight.shape)}")
    x1, x2 = input1.reshape([-1, I]), input2.reshape([-1, J])
    t = x1.matmul(weight.permute([1, 0, 2]).reshape([I, O * J])).reshape([-1, O, J])
    y = (t * x2.unsqueeze(1)).sum([2])
    if bias is not None:
        y = y + bias
    return y.reshape(list(input1.shape[:-1]) + [O])


def conv_transpose2d(input, weight, bias=None, stride=1, padding=0, output_padding=0, groups=1,
                     dilation=1):
    return _C.conv_transpose2d(input, weight, bias, stride, padding, output_padding, groups,
                               dilation)


def max_pool2d(input, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False,
               return_indices=False):
    stride = [] if stride is None else stride
    if return_indices:
        return tuple(_C.max_pool2d_with_indices(input, kernel_size, stride, padding, dilation,
                                                ceil_mode))
    return _C.max_pool2d(input, kernel_size, stride, padding, dilation, ceil_mode)


def avg_pool2d(input, kernel_size, stride=None, padding=0, ceil_mode=False,
               count_include_pad=True, divisor_override=None):
    return _C.avg_pool2d(input, kernel_size, [] if stride is None else stride, padding, ceil_mode,
                         count_include_pad, divisor_override)


def batch_norm(input, running_mean, running_var, weight=None, bias=None, training=False,
               momentum=0.1, eps=1e-5):
    return _C.batch_norm(input, weight, bias, running_mean, running_var, training,
                         0.0 if momentum is None else momentum, eps)


def layer_norm(input, normalized_shape, weight=None, bias=None, eps=1e-5):
    if input.__class__ is _Nested:
        return _nested.layer_norm(input, normalized_shape, weight, bias, eps)
    return _C.layer_norm(input, normalized_shape, weight, bias, eps)


def rms_norm(input, normalized_shape, weight=None, eps=None):
    return _C.rms_norm(input, normalized_shape, weight, eps)


def group_norm(input, num_groups, weight=None, bias=None, eps=1e-5):
    return _C.group_norm(input, num_groups, weight, bias, eps)


def embedding(input, weight, padding_idx=None, max_norm=None, norm_type=2.0,
              scale_grad_by_freq=False, sparse=False):
    if max_norm is not None:
        raise NotImplementedError("embedding: max_norm is not supported in Kiln")
    if padding_idx is not None and padding_idx < 0:
        padding_idx += weight.shape[0]
    if input.__class__ is _Nested:
        return _nested.embedding(input, weight, -1 if padding_idx is None else padding_idx,
                                 scale_grad_by_freq, sparse)
    return _C.embedding(weight, input, -1 if padding_idx is None else padding_idx,
                        scale_grad_by_freq, sparse)


def dropout(input, p=0.5, training=True, inplace=False):
    if p < 0 or p > 1:
        raise ValueError(f"dropout probability has to be between 0 and 1, but got {p}")
    if input.__class__ is _Nested:
        return input.apply_values(_C.dropout, p, training)
    out = _C.dropout(input, p, training)
    return input.copy_(out) if inplace else out


def relu(input, inplace=False):
    if input.__class__ is _Nested:
        return input.relu()
    return _C.relu_(input) if inplace else _C.relu(input)


relu_ = _C.relu_


def gelu(input, approximate="none"):
    if input.__class__ is _Nested:
        return input.gelu(approximate=approximate)
    return _C.gelu(input, approximate=approximate)


def silu(input, inplace=False):
    if input.__class__ is _Nested:
        return input.silu()
    return _C.silu_(input) if inplace else _C.silu(input)


def softplus(input, beta=1.0, threshold=20.0):
    """log(1 + exp(beta x)) / beta, and x itself where beta x > threshold."""
    return _C.softplus(input, beta, threshold)


def leaky_relu(input, negative_slope=0.01, inplace=False):
    out = _C.where(input > 0, input, input * negative_slope)
    return input.copy_(out) if inplace else out


# Set by kiln.distributed.tensor.parallel.loss_parallel() while it is active: log_softmax,
# cross_entropy and nll_loss of DTensor inputs go there (Note [Vocab-parallel cross entropy]).
_loss_parallel = None


def _softmax_dim(ndim):
    return 0 if ndim in (0, 1, 3) else 1  # PyTorch's implicit choice


def softmax(input, dim=None, _stacklevel=3, dtype=None):
    if input.__class__ is _Nested:
        return input.softmax(-1 if dim is None else dim, dtype)
    return _C.softmax(input, _softmax_dim(input.ndim) if dim is None else dim, dtype)


def log_softmax(input, dim=None, _stacklevel=3, dtype=None):
    if input.__class__ is _Nested:
        return input.log_softmax(-1 if dim is None else dim, dtype)
    dim = _softmax_dim(input.ndim) if dim is None else dim
    if _loss_parallel is not None and _C._is_dtensor(input):
        return _loss_parallel.log_softmax(input, dim, dtype)
    return _C.log_softmax(input, dim, dtype)


def normalize(input, p=2.0, dim=1, eps=1e-12):
    return input / _C.norm(input, p, [dim], True).clamp(min=eps)


def _attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
               need_weights=False):
    """(softmax(q kᵀ · scale + mask) v, the softmax weights if need_weights else None) over the
    last two dims; a bool attn_mask keeps its True entries, a float one is added. Without a mask
    and weights this is the fused kernel, else it is written out (MultiheadAttention's path)."""
    if attn_mask is None and not need_weights:
        return _C.scaled_dot_product_attention(query, key, value, dropout_p, is_causal,
                                               scale=scale), None
    L, S = query.shape[-2], key.shape[-2]
    s = 1 / math.sqrt(query.shape[-1]) if scale is None else scale
    scores = query.matmul(key.transpose(-2, -1)) * s
    if attn_mask is not None:
        if attn_mask.dtype is _C.bool:
            scores = scores.masked_fill(attn_mask.logical_not(), -math.inf)
        else:
            scores = scores + attn_mask
    if is_causal:
        future = _C.ones([L, S], dtype=_C.bool, device=query.device).triu(1)
        scores = scores.masked_fill(future, -math.inf)
    weights = _C.softmax(scores, -1)
    if dropout_p > 0:
        weights = _C.dropout(weights, dropout_p, True)
    return weights.matmul(value), (weights if need_weights else None)


def scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0,
                                 is_causal=False, scale=None):
    """softmax(q kᵀ · scale + mask) v over the last two dims; a bool attn_mask keeps its True
    entries (PyTorch's convention here), a float one is added. Without a mask this is the
    fused kernel. Nested (jagged) inputs: each sequence attends only to itself."""
    if query.__class__ is _Nested:
        return _nested.scaled_dot_product_attention(query, key, value, attn_mask, dropout_p,
                                                     is_causal, scale)
    return _attention(query, key, value, attn_mask, dropout_p, is_causal, scale)[0]


# ---- losses (size_average / reduce: PyTorch's deprecated positional slots) ------------------
def _reduction(size_average, reduce, reduction):
    if size_average is None and reduce is None:
        return reduction
    size_average = True if size_average is None else size_average
    reduce = True if reduce is None else reduce
    return ("mean" if size_average else "sum") if reduce else "none"


def cross_entropy(input, target, weight=None, size_average=None, ignore_index=-100, reduce=None,
                  reduction="mean", label_smoothing=0.0):
    reduction = _reduction(size_average, reduce, reduction)
    if input.__class__ is _Nested:
        return _nested.cross_entropy(input, target, weight, reduction, ignore_index,
                                     label_smoothing)
    if _loss_parallel is not None and _C._is_dtensor(input):
        return _loss_parallel.cross_entropy(input, target, weight, reduction, ignore_index,
                                            label_smoothing)
    return _C.cross_entropy(input, target, weight, reduction, ignore_index, label_smoothing)


def nll_loss(input, target, weight=None, size_average=None, ignore_index=-100, reduce=None,
             reduction="mean"):
    reduction = _reduction(size_average, reduce, reduction)
    if _loss_parallel is not None and _C._is_dtensor(input):
        return _loss_parallel.nll_loss(input, target, weight, reduction, ignore_index)
    return _C.nll_loss(input, target, weight, reduction, ignore_index)


def mse_loss(input, target, size_average=None, reduce=None, reduction="mean"):
    return _C.mse_loss(input, target, _reduction(size_average, reduce, reduction))


def l1_loss(input, target, size_average=None, reduce=None, reduction="mean"):
    return _C.l1_loss(input, target, _reduction(size_average, reduce, reduction))


def smooth_l1_loss(input, target, size_average=None, reduce=None, reduction="mean", beta=1.0):
    return _C.smooth_l1_loss(input, target, _reduction(size_average, reduce, reduction), beta)


def huber_loss(input, target, reduction="mean", delta=1.0):
    return _C.smooth_l1_loss(input, target, reduction, delta) * delta


def binary_cross_entropy(input, target, weight=None, size_average=None, reduce=None,
                         reduction="mean"):
    return _C.binary_cross_entropy(input, target, weight,
                                   _reduction(size_average, reduce, reduction))


def binary_cross_entropy_with_logits(input, target, weight=None, size_average=None, reduce=None,
                                     reduction="mean", pos_weight=None):
    return _C.binary_cross_entropy_with_logits(input, target, weight, pos_weight,
                                               _reduction(size_average, reduce, reduction))


def kl_div(input, target, size_average=None, reduce=None, reduction="mean", log_target=False):
    return _C.kl_div(input, target, _reduction(size_average, reduce, reduction), log_target)
