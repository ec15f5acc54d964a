"""Learning-rate schedulers (torch.optim.lr_scheduler) in closed form: the lr of epoch e is a
function of e and the base lrs, so step(), state_dict() and load_state_dict() need no history.
Construction takes the epoch-0 step, as in PyTorch."""
import bisect
import math
import types

__all__ = ["LRScheduler", "LambdaLR", "MultiplicativeLR", "StepLR", "MultiStepLR", "ExponentialLR",
           "CosineAnnealingLR", "LinearLR", "OneCycleLR", "SequentialLR"]


class LRScheduler:
    def __init__(self, optimizer, last_epoch=-1):
        self.optimizer = optimizer
        for g in optimizer.param_groups:
            if last_epoch == -1:
                g.setdefault("initial_lr", g["lr"])
            elif "initial_lr" not in g:
                raise KeyError("param 'initial_lr' is not specified in param_groups when "
                               "resuming an optimizer")
        self.base_lrs = [g["initial_lr"] for g in optimizer.param_groups]
        self.last_epoch = last_epoch
        self.step()

    def lr_at(self, group, epoch):
        raise NotImplementedError

    def _apply(self, epoch):
        for i, g in enumerate(self.optimizer.param_groups):
            g["lr"] = self.lr_at(i, epoch)
        self._last_lr = [g["lr"] for g in self.optimizer.param_groups]

    def step(self, epoch=None):
        self.last_epoch = self.last_epoch + 1 if epoch is None else epoch
        self._apply(self.last_epoch)

    def get_last_lr(self):
        return list(self._last_lr)

    def get_lr(self):
        return [self.lr_at(i, self.last_epoch) for i in range(len(self.base_lrs))]

    def state_dict(self):
        return {k: v for k, v in self.__dict__.items() if k not in ("optimizer", "_schedulers")}

    def load_state_dict(self, state_dict):
        self.__dict__.update(state_dict)
        self._apply(self.last_epoch)


def _per_group(name, fns, groups):
    """One function per param group: `fns` itself for all of them, or a list of as many."""
    if not isinstance(fns, (list, tuple)):
        return [fns] * len(groups)
    if len(fns) != len(groups):
        raise ValueError(f"{name}: expected {len(groups)} lr_lambdas, got {len(fns)}")
    return list(fns)


class _LambdaScheduler(LRScheduler):
    """Holds lr_lambdas, which state_dict() saves only when they are callable objects (their
    __dict__), as PyTorch does: plain functions and lambdas are not data."""

    def state_dict(self):
        sd = super().state_dict()
        sd["lr_lambdas"] = [None if isinstance(f, types.FunctionType) else dict(f.__dict__)
                            for f in self.lr_lambdas]
        return sd

    def load_state_dict(self, state_dict):
        state_dict = dict(state_dict)
        for f, saved in zip(self.lr_lambdas, state_dict.pop("lr_lambdas", [])):
            if saved is not None:
                f.__dict__.update(saved)
        super().load_state_dict(state_dict)


class LambdaLR(_LambdaScheduler):
    """lr = base_lr * lr_lambda(epoch), one lr_lambda for every group or one per group."""

    def __init__(self, optimizer, lr_lambda, last_epoch=-1):
        self.lr_lambdas = _per_group("LambdaLR", lr_lambda, optimizer.param_groups)
        super().__init__(optimizer, last_epoch)

    def lr_at(self, group, epoch):
        return self.base_lrs[group] * self.lr_lambdas[group](epoch)


class MultiplicativeLR(_LambdaScheduler):
    """lr = base_lr * lr_lambda(1) * ... * lr_lambda(epoch): each step multiplies the lr by
    lr_lambda(epoch). The products are kept as they are computed, so stepping costs one call."""

    def __init__(self, optimizer, lr_lambda, last_epoch=-1):
        self.lr_lambdas = _per_group("MultiplicativeLR", lr_lambda, optimizer.param_groups)
        self._factors = None  # (epoch, [product per group]) of the last lr_at
        super().__init__(optimizer, last_epoch)

    def _products(self, epoch):
        start, prods = self._factors if self._factors and self._factors[0] <= epoch \
            else (0, [1.0] * len(self.lr_lambdas))
        prods = list(prods)
        for e in range(start + 1, epoch + 1):
            prods = [p * f(e) for p, f in zip(prods, self.lr_lambdas)]
        self._factors = (max(epoch, 0), prods)
        return prods

    def lr_at(self, group, epoch):
        return self.base_lrs[group] * self._products(epoch)[group]


class StepLR(LRScheduler):
    def __init__(self, optimizer, step_size, gamma=0.1, last_epoch=-1):
        if step_size <= 0:
            raise ValueError(f"StepLR: step_size must be positive, got {step_size}")
        self.step_size, self.gamma = step_size, gamma
        super().__init__(optimizer, last_epoch)

    def lr_at(self, group, epoch):
        return self.base_lrs[group] * self.gamma ** (epoch // self.step_size)


class MultiStepLR(LRScheduler):
    def __init__(self, optimizer, milestones, gamma=0.1, last_epoch=-1):
        self.milestones, self.gamma = sorted(milestones), gamma
        super().__init__(optimizer, last_epoch)

    def lr_at(self, group, epoch):
        return self.base_lrs[group] * self.gamma ** bisect.bisect_right(self.milestones, epoch)


class ExponentialLR(LRScheduler):
    def __init__(self, optimizer, gamma, last_epoch=-1):
        self.gamma = gamma
        super().__init__(optimizer, last_epoch)

    def lr_at(self, group, epoch):
        return self.base_lrs[group] * self.gamma ** epoch


class CosineAnnealingLR(LRScheduler):
    def __init__(self, optimizer, T_max, eta_min=0.0, last_epoch=-1):
        if T_max <= 0:
            raise ValueError(f"CosineAnnealingLR: T_max must be positive, got {T_max}")
        self.T_max, self.eta_min = T_max, eta_min
        super().__init__(optimizer, last_epoch)

    def lr_at(self, group, epoch):
        c = math.cos(math.pi * epoch / self.T_max)
        return self.eta_min + (self.base_lrs[group] - self.eta_min) * (1 + c) / 2


class LinearLR(LRScheduler):
    def __init__(self, optimizer, start_factor=1.0 / 3, end_factor=1.0, total_iters=5,
                 last_epoch=-1):
        if not 0 < start_factor <= 1:
            raise ValueError(f"LinearLR: start_factor must be in (0, 1], got {start_factor}")
        if not 0 <= end_factor <= 1:
            raise ValueError(f"LinearLR: end_factor must be in [0, 1], got {end_factor}")
        self.start_factor, self.end_factor, self.total_iters = start_factor, end_factor, total_iters
        super().__init__(optimizer, last_epoch)

    def lr_at(self, group, epoch):
        frac = min(epoch, self.total_iters) / self.total_iters if self.total_iters > 0 else 1.0
        return self.base_lrs[group] * (self.start_factor
                                       + (self.end_factor - self.start_factor) * frac)


class OneCycleLR(LRScheduler):
    def __init__(self, optimizer, max_lr, total_steps=None, epochs=None, steps_per_epoch=None,
                 pct_start=0.3, anneal_strategy="cos", cycle_momentum=True, base_momentum=0.85,
                 max_momentum=0.95, div_factor=25.0, final_div_factor=1e4, three_phase=False,
                 last_epoch=-1):
        if total_steps is None:
            if not (epochs and steps_per_epoch and epochs > 0 and steps_per_epoch > 0):
                raise ValueError("OneCycleLR: give total_steps, or epochs and steps_per_epoch "
                                 "(all positive)")
            total_steps = epochs * steps_per_epoch
        if total_steps <= 0:
            raise ValueError(f"OneCycleLR: total_steps must be positive, got {total_steps}")
        if not 0 <= pct_start <= 1:
            raise ValueError(f"OneCycleLR: pct_start must be in [0, 1], got {pct_start}")
        if anneal_strategy not in ("cos", "linear"):
            raise ValueError(f"OneCycleLR: anneal_strategy must be 'cos' or 'linear', got "
                             f"{anneal_strategy!r}")
        groups = optimizer.param_groups
        max_lrs = list(max_lr) if isinstance(max_lr, (list, tuple)) else [max_lr] * len(groups)
        if len(max_lrs) != len(groups):
            raise ValueError(f"OneCycleLR: expected {len(groups)} max_lr values, got {len(max_lrs)}")
        self.total_steps, self.anneal_cos = total_steps, anneal_strategy == "cos"
        self.cycle_momentum, lo, hi = cycle_momentum, base_momentum, max_momentum
        t = float(total_steps)
        if three_phase:
            self._phases = [(pct_start * t - 1, "initial_lr", "max_lr", hi, lo),
                            (2 * pct_start * t - 2, "max_lr", "initial_lr", lo, hi),
                            (t - 1, "initial_lr", "min_lr", hi, hi)]
        else:
            self._phases = [(pct_start * t - 1, "initial_lr", "max_lr", hi, lo),
                            (t - 1, "max_lr", "min_lr", lo, hi)]
        if cycle_momentum:
            d = optimizer.defaults
            self._momentum_key = "betas" if "betas" in d else "momentum" if "momentum" in d else None
            if self._momentum_key is None:
                raise ValueError("OneCycleLR: optimizer must support momentum or betas with "
                                 "`cycle_momentum` enabled")
        for g, m in zip(groups, max_lrs):
            g["initial_lr"] = m / div_factor
            g["max_lr"] = m
            g["min_lr"] = g["initial_lr"] / final_div_factor
        super().__init__(optimizer, last_epoch)

    def _anneal(self, start, end, pct):
        if self.anneal_cos:
            return end + (start - end) / 2 * (math.cos(math.pi * pct) + 1)
        return (end - start) * pct + start

    def _phase(self, epoch):
        if epoch > self.total_steps:
            raise ValueError(f"Tried to step {epoch} times. The specified number of total steps "
                             f"is {self.total_steps}")
        start = 0.0
        for i, phase in enumerate(self._phases):
            if epoch <= phase[0] or i + 1 == len(self._phases):
                return phase, (epoch - start) / (phase[0] - start)
            start = phase[0]

    def lr_at(self, group, epoch):
        (_, lr_start, lr_end, _, _), pct = self._phase(epoch)
        g = self.optimizer.param_groups[group]
        return self._anneal(g[lr_start], g[lr_end], pct)

    def _apply(self, epoch):
        super()._apply(epoch)
        if not self.cycle_momentum:
            return
        (_, _, _, m_start, m_end), pct = self._phase(epoch)
        m = self._anneal(m_start, m_end, pct)
        for g in self.optimizer.param_groups:
            if self._momentum_key == "betas":
                g["betas"] = (m, *g["betas"][1:])
            else:
                g["momentum"] = m


class SequentialLR(LRScheduler):
    """schedulers[i] runs from milestones[i-1] on, counting its epochs from 0 there."""

    def __init__(self, optimizer, schedulers, milestones, last_epoch=-1):
        if not schedulers:
            raise ValueError("SequentialLR: expected at least one scheduler")
        if len(milestones) + 1 != len(schedulers):
            raise ValueError(f"SequentialLR: expected {len(schedulers) - 1} milestones for "
                             f"{len(schedulers)} schedulers, got {len(milestones)}")
        if list(milestones) != sorted(milestones):
            raise ValueError("SequentialLR: milestones must be in increasing order")
        for i, s in enumerate(schedulers):
            if s.optimizer is not optimizer:
                raise ValueError(f"SequentialLR: scheduler {i} is not built on this optimizer")
        self._schedulers, self._milestones = list(schedulers), list(milestones)
        for g in optimizer.param_groups:  # undo the epoch-0 steps of the later schedulers
            g["lr"] = g["initial_lr"]
        super().__init__(optimizer, last_epoch)

    def _apply(self, epoch):
        i = bisect.bisect_right(self._milestones, epoch)
        s = self._schedulers[i]
        s.last_epoch = epoch if i == 0 else epoch - self._milestones[i - 1]
        s._apply(s.last_epoch)
        self._last_lr = s.get_last_lr()

    def lr_at(self, group, epoch):
        i = bisect.bisect_right(self._milestones, epoch)
        return self._schedulers[i].lr_at(group, epoch if i == 0 else epoch - self._milestones[i - 1])

    def state_dict(self):
        sd = super().state_dict()
        sd["_schedulers"] = [s.state_dict() for s in self._schedulers]
        return sd

    def load_state_dict(self, state_dict):
        state_dict = dict(state_dict)
        for s, sd in zip(self._schedulers, state_dict.pop("_schedulers")):
            s.load_state_dict(sd)  # its own: a LambdaLR keeps its functions
        super().load_state_dict(state_dict)
