"""kiln.nn: modules, layers, losses, kiln.nn.functional and kiln.nn.init (torch.nn).

    model = kiln.nn.Sequential(kiln.nn.Linear(64, 128), kiln.nn.ReLU(), kiln.nn.Linear(128, 10))
    loss = kiln.nn.CrossEntropyLoss()(model(x), y)
"""
from kiln.nn import functional, init, utils  # noqa: F401
from kiln.nn.containers import *  # noqa: F401,F403
from kiln.nn.layers import *  # noqa: F401,F403
from kiln.nn.loss import *  # noqa: F401,F403
from kiln.nn.module import Module  # noqa: F401
from kiln.nn.parameter import Parameter  # noqa: F401
from kiln.nn.transformer import *  # noqa: F401,F403
from kiln.nn import parallel  # noqa: F401,E402
