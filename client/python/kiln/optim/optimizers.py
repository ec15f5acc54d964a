"""SGD, Adam, AdamW (one fused multi-tensor op call per param group and step), RMSprop and
Adagrad (PyTorch's single-tensor update rules over table ops). States are made *_like the
parameter, so a DTensor parameter (FSDP's shards) gets DTensor states."""
from kiln import _C
from kiln.autograd.grad_mode import no_grad
from kiln.optim.optimizer import Optimizer


def _check(name, value, ok=lambda v: v >= 0):
    if not ok(value):
        raise ValueError(f"Invalid {name} value: {value}")


class SGD(Optimizer):
    def __init__(self, params, lr=1e-3, momentum=0, dampening=0, weight_decay=0, nesterov=False,
                 *, maximize=False, foreach=None, differentiable=False, fused=None):
        _check("learning rate", lr)
        _check("momentum", momentum)
        _check("weight_decay", weight_decay)
        if nesterov and (momentum <= 0 or dampening != 0):
            raise ValueError("Nesterov momentum requires a momentum and zero dampening")
        super().__init__(params, dict(lr=lr, momentum=momentum, dampening=dampening,
                                      weight_decay=weight_decay, nesterov=nesterov,
                                      maximize=maximize))

    def step(self, closure=None):
        loss = self._closure(closure)
        with no_grad():
            for g in self.param_groups:
                params, grads = self._with_grad(g)
                if not params:
                    continue
                kw = dict(weight_decay=g["weight_decay"], momentum=g["momentum"], lr=g["lr"],
                          dampening=g["dampening"], nesterov=g["nesterov"], maximize=g["maximize"])
                if g["momentum"] == 0:
                    _C._fused_sgd_(params, grads, [], is_first_step=False, **kw)
                    continue
                # Parameters with a momentum buffer, and those stepping for the first time.
                old, new = ([], [], []), ([], [], [])
                for p, gr in zip(params, grads):
                    s = self.state.setdefault(p, {})
                    buf = s.get("momentum_buffer")
                    side = old if buf is not None else new
                    if buf is None:
                        buf = s["momentum_buffer"] = _C.zeros_like(p)
                    side[0].append(p), side[1].append(gr), side[2].append(buf)
                for (ps, gs, bs), first in ((old, False), (new, True)):
                    if ps:
                        _C._fused_sgd_(ps, gs, bs, is_first_step=first, **kw)
        return loss


class Adam(Optimizer):
    _decoupled = False

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0,
                 amsgrad=False, *, foreach=None, maximize=False, capturable=False,
                 differentiable=False, fused=None):
        _check("learning rate", lr)
        _check("epsilon", eps)
        _check("beta parameter at index 0", betas[0], lambda b: 0 <= b < 1)
        _check("beta parameter at index 1", betas[1], lambda b: 0 <= b < 1)
        _check("weight_decay", weight_decay)
        super().__init__(params, dict(lr=lr, betas=tuple(betas), eps=eps,
                                      weight_decay=weight_decay, amsgrad=amsgrad,
                                      maximize=maximize))

    def step(self, closure=None):
        loss = self._closure(closure)
        fused = _C._fused_adamw_ if self._decoupled else _C._fused_adam_
        with no_grad():
            for g in self.param_groups:
                params, grads = self._with_grad(g)
                if not params:
                    continue
                amsgrad = g["amsgrad"]
                m, v, vmax, steps = [], [], [], []
                for p in params:
                    s = self.state.get(p)
                    if not s:
                        s = self.state[p] = {"step": _C.zeros([], dtype=_C.float32, device=p.device),
                                             "exp_avg": _C.zeros_like(p),
                                             "exp_avg_sq": _C.zeros_like(p)}
                    steps.append(s["step"])
                    m.append(s["exp_avg"])
                    v.append(s["exp_avg_sq"])
                    if amsgrad:
                        if "max_exp_avg_sq" not in s:
                            s["max_exp_avg_sq"] = _C.zeros_like(p)
                        vmax.append(s["max_exp_avg_sq"])
                beta1, beta2 = g["betas"]
                fused(params, grads, m, v, vmax, steps, lr=g["lr"], beta1=beta1, beta2=beta2,
                      weight_decay=g["weight_decay"], eps=g["eps"], amsgrad=amsgrad,
                      maximize=g["maximize"])
        return loss


class AdamW(Adam):
    _decoupled = True

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2,
                 amsgrad=False, *, maximize=False, foreach=None, capturable=False,
                 differentiable=False, fused=None):
        super().__init__(params, lr, betas, eps, weight_decay, amsgrad, maximize=maximize)


def _effective_grad(p, grad, g):
    grad = -grad if g["maximize"] else grad
    return grad + p * g["weight_decay"] if g["weight_decay"] != 0 else grad


class RMSprop(Optimizer):
    def __init__(self, params, lr=1e-2, alpha=0.99, eps=1e-8, weight_decay=0, momentum=0,
                 centered=False, capturable=False, foreach=None, maximize=False,
                 differentiable=False):
        for name, value in (("learning rate", lr), ("epsilon", eps), ("momentum", momentum),
                            ("weight_decay", weight_decay), ("alpha", alpha)):
            _check(name, value)
        super().__init__(params, dict(lr=lr, alpha=alpha, eps=eps, weight_decay=weight_decay,
                                      momentum=momentum, centered=centered, maximize=maximize))

    def step(self, closure=None):
        loss = self._closure(closure)
        with no_grad():
            for g in self.param_groups:
                alpha, momentum, lr = g["alpha"], g["momentum"], g["lr"]
                for p, grad in zip(*self._with_grad(g)):
                    s = self.state.get(p)
                    if not s:
                        s = self.state[p] = {"step": _C.zeros([], dtype=_C.float32, device=p.device),
                                             "square_avg": _C.zeros_like(p)}
                        if momentum > 0:
                            s["momentum_buffer"] = _C.zeros_like(p)
                        if g["centered"]:
                            s["grad_avg"] = _C.zeros_like(p)
                    s["step"].add_(1)
                    grad = _effective_grad(p, grad, g)
                    sq = s["square_avg"].mul_(alpha)
                    sq.add_(grad * grad * (1 - alpha))
                    if g["centered"]:
                        ga = s["grad_avg"]
                        ga.add_((grad - ga) * (1 - alpha))
                        avg = (sq - ga * ga).sqrt() + g["eps"]
                    else:
                        avg = sq.sqrt() + g["eps"]
                    if momentum > 0:
                        buf = s["momentum_buffer"].mul_(momentum)
                        buf.add_(grad / avg)
                        p.sub_(buf, alpha=lr)
                    else:
                        p.sub_(grad / avg, alpha=lr)
        return loss


class Adagrad(Optimizer):
    def __init__(self, params, lr=1e-2, lr_decay=0, weight_decay=0, initial_accumulator_value=0,
                 eps=1e-10, foreach=None, *, maximize=False, differentiable=False, fused=None):
        for name, value in (("learning rate", lr), ("lr_decay", lr_decay),
                            ("weight_decay", weight_decay), ("epsilon", eps),
                            ("initial_accumulator_value", initial_accumulator_value)):
            _check(name, value)
        super().__init__(params, dict(lr=lr, lr_decay=lr_decay, weight_decay=weight_decay,
                                      initial_accumulator_value=initial_accumulator_value,
                                      eps=eps, maximize=maximize))

    def add_param_group(self, param_group):
        super().add_param_group(param_group)
        g = self.param_groups[-1]
        for p in g["params"]:
            self.state[p] = {"step": _C.zeros([], dtype=_C.float32, device=p.device),
                             "sum": _C.full_like(p, g["initial_accumulator_value"])}

    def step(self, closure=None):
        loss = self._closure(closure)
        with no_grad():
            for g in self.param_groups:
                for p, grad in zip(*self._with_grad(g)):
                    s = self.state[p]
                    t = s["step"].add_(1).item()
                    grad = _effective_grad(p, grad, g)
                    clr = g["lr"] / (1 + (t - 1) * g["lr_decay"])
                    s["sum"].add_(grad * grad)
                    p.sub_(grad / (s["sum"].sqrt() + g["eps"]), alpha=clr)
        return loss


__all__ = ["SGD", "Adam", "AdamW", "RMSprop", "Adagrad"]
