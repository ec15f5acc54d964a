"""Static post-training int8 quantization of an exported program, as torch.ao.quantization's
quantize_pt2e module names it: export, prepare (observers), calibrate, convert.

    prog = kiln.export(model.eval(), (x,), dynamic_shapes=({0: kiln.Dim("batch")},))
    prepared = prepare_pt2e(prog)            # finds the conv/linear layers to quantize
    for xb in calibration_batches:
        prepared(xb)                          # runs the float program, observing ranges
    qprog = convert_pt2e(prepared)            # a kiln.ExportedProgram, int8 inside
    qprog.save("model.int8.kprog")            # kiln-run-program runs it too
    print(error_report(prepared, x))          # per layer: quantized against float

The scheme is fixed (PyTorch's X86 default): weights int8 symmetric per output channel,
activations uint8 per tensor from the observed min/max. Conv/linear layers absorb what follows
them per channel (a bias, an eval-mode BatchNorm) and a ReLU, and run as conv2d_int8 /
linear_int8 (oneDNN). See Note [Post-training quantization] in kiln/quantization.h.
"""
from kiln import _C
from kiln._export import ExportedProgram, load_program
from kiln.ao.quantization import ErrorReport

__all__ = ["prepare_pt2e", "convert_pt2e", "error_report", "ObservedProgram", "ErrorReport"]


class ObservedProgram:
    """A float program with observers (prepare_pt2e's result). Call it like the program: it runs
    the float program and widens each value's observed range; it returns the float outputs."""

    def __init__(self, program):
        if not isinstance(program, ExportedProgram):
            program = load_program(program)
        self.program = program
        self._calibrator = _C._Calibrator(program._impl)

    @property
    def layers(self):
        """One line per layer that convert_pt2e quantizes, with what it folds."""
        return list(self._calibrator.layers)

    @property
    def batches_observed(self):
        return self._calibrator.batches

    def __call__(self, *args):
        out = self._calibrator.observe(list(args))
        return out[0] if len(out) == 1 else tuple(out)

    def __repr__(self):
        return (f"ObservedProgram({len(self.layers)} layers, {self.batches_observed} batches "
                f"observed)")


def prepare_pt2e(program):
    """The exported `program` (an ExportedProgram or a .kprog path) with observers; ValueError
    when it has no conv or linear layer to quantize."""
    return ObservedProgram(program)


def convert_pt2e(observed):
    """The int8 ExportedProgram of a calibrated ObservedProgram (ValueError before any
    calibration batch)."""
    if not isinstance(observed, ObservedProgram):
        raise TypeError(f"convert_pt2e: expects prepare_pt2e's result, got "
                        f"{type(observed).__name__}")
    data = observed._calibrator.convert()
    prog = ExportedProgram(_C._ExportedProgram.from_bytes(data, "<quantized program>"))
    prog._data = data
    return prog


def error_report(observed, *inputs):
    """Per quantized layer, the int8 program's value at the layer's output (dequantized) against
    the float program's, on `inputs`: max and mean absolute error and SQNR in dB."""
    if not isinstance(observed, ObservedProgram):
        raise TypeError(f"error_report: expects prepare_pt2e's result, got "
                        f"{type(observed).__name__}")
    return ErrorReport(tuple(r) for r in observed._calibrator.error_report(list(inputs)))
