"""kiln: PyTorch-style tensors, autograd and training on Kiln's runtime, in-process.

    import kiln
    x = kiln.randn(4, 3, requires_grad=True)
    loss = (x * 2).relu().sum()
    loss.backward()                # x.grad
    with kiln.no_grad():
        x -= 0.1 * x.grad

Every op of Kiln's op table is kiln.<op> (and kiln.Tensor.<op> where the C++ Tensor has the
method), bound from the table with its keyword names and defaults.
"""
from kiln import _C
from kiln._C import *  # noqa: F401,F403  the ops, dtypes, device, Generator, Tensor
from kiln._C import Tensor, __version__  # noqa: F401
from kiln import _tensor  # noqa: F401  Python-level Tensor methods (operators, indexing, numpy)
from kiln._overloads import *  # noqa: F401,F403  nonzero(as_tuple), where(cond), split([...])
from kiln._creation import *  # noqa: F401,F403
from kiln.autograd.grad_mode import no_grad, enable_grad, inference_mode, set_grad_enabled  # noqa: F401
from kiln._C import is_grad_enabled, is_inference_mode_enabled  # noqa: F401
from kiln import autograd  # noqa: F401
from kiln import nn, optim, func, utils  # noqa: F401,E402
from kiln.serialization import save, load  # noqa: F401,E402
from kiln.amp import autocast, is_autocast_enabled, get_autocast_dtype  # noqa: F401,E402
from kiln.remote import connect, Session  # noqa: F401,E402
from kiln import profiler  # noqa: F401,E402
if _C._client_only:
    # The thin client's package (cmake -DKILN_CLIENT_ONLY=ON): every op runs on a worker, and
    # what needs the compiler, kiln::dist or kernels on this side says so when called.
    from kiln._client_only import compile, export, load_program  # noqa: F401,E402
else:
    from kiln import distributed  # noqa: F401,E402
    from kiln._compile import compile  # noqa: F401,E402  (shadows the builtin, as torch.compile does)
    from kiln import batch  # noqa: F401,E402
    from kiln._export import export, load_program, Dim, ExportedProgram  # noqa: F401,E402
    from kiln import nested  # noqa: F401,E402
    from kiln.nested import jagged  # noqa: F401,E402
    from kiln import ao  # noqa: F401,E402
    from kiln.ao.quantization import qint8, quint8  # noqa: F401,E402
