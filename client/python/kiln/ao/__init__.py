"""kiln.ao: int8 quantization with torch.ao's eager-mode names (issue 25).

    import kiln as torch
    q = torch.ao.quantization.quantize_dynamic(model, {torch.nn.Linear}, dtype=torch.qint8)
    with torch.no_grad():
        y = q(x)                                  # int8 weights, activations quantized per batch

    qat = torch.ao.quantization.prepare_qat(model)   # train it; then
    int8_model = torch.ao.quantization.convert(qat.eval())

The ops underneath are tensor/ops/quantized.toml's (Note [Quantization scheme] there).
"""
from kiln.ao import nn, quantization  # noqa: F401
