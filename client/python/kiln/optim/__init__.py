"""kiln.optim: optimizers and learning-rate schedules (torch.optim).

    opt = kiln.optim.AdamW(model.parameters(), lr=1e-3)
    sched = kiln.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=100)
    loss.backward(); opt.step(); opt.zero_grad(); sched.step()
"""
from kiln.optim import lr_scheduler  # noqa: F401
from kiln.optim.optimizer import Optimizer, required  # noqa: F401
from kiln.optim.optimizers import *  # noqa: F401,F403
