"""kiln.ao.nn: the quantized modules (quantized, quantized.dynamic) and their QAT forms (qat)."""
from kiln.ao.nn import qat, quantized  # noqa: F401
