"""kiln.optim.Optimizer: param groups, per-parameter state, zero_grad and state dicts
(torch.optim.Optimizer). Subclasses implement step()."""
import copy

from kiln._C import Tensor
from kiln.autograd.grad_mode import enable_grad, no_grad


class _Required:
    def __repr__(self):
        return "<required parameter>"


required = _Required()


class Optimizer:
    def __init__(self, params, defaults):
        self.defaults = defaults
        self.state = {}  # parameter -> {name: tensor}
        self.param_groups = []
        if isinstance(params, Tensor):
            raise TypeError("params argument given to the optimizer should be an iterable of "
                            "Tensors or dicts, but got a Tensor")
        groups = list(params)
        if not groups:
            raise ValueError("optimizer got an empty parameter list")
        if not isinstance(groups[0], dict):
            groups = [{"params": groups}]
        for g in groups:
            self.add_param_group(g)

    def add_param_group(self, param_group):
        if not isinstance(param_group, dict):
            raise TypeError(f"param_group must be a dict, got {type(param_group).__name__}")
        group = dict(param_group)
        params = group["params"]
        group["params"] = [params] if isinstance(params, Tensor) else list(params)
        for p in group["params"]:
            if not isinstance(p, Tensor):
                raise TypeError(f"optimizer can only optimize Tensors, got {type(p).__name__}")
            if not p.is_leaf:
                raise ValueError("can't optimize a non-leaf Tensor")
        for name, default in self.defaults.items():
            if default is required and name not in group:
                raise ValueError(f"parameter group didn't specify a value of required "
                                 f"optimization parameter {name}")
            group.setdefault(name, default)
        seen = {id(p) for g in self.param_groups for p in g["params"]}
        if any(id(p) in seen for p in group["params"]):
            raise ValueError("some parameters appear in more than one parameter group")
        self.param_groups.append(group)

    def zero_grad(self, set_to_none=True):
        for g in self.param_groups:
            for p in g["params"]:
                grad = p.grad
                if grad is None:
                    continue
                if set_to_none:
                    p.grad = None
                else:
                    if grad.grad_fn is not None:
                        grad = grad.detach()
                        p.grad = grad
                    grad.zero_()

    def step(self, closure=None):
        raise NotImplementedError

    def _closure(self, closure):
        if closure is None:
            return None
        with enable_grad():
            return closure()

    @staticmethod
    def _with_grad(group):
        """(params, grads) of the group's parameters that have a gradient."""
        params, grads = [], []
        for p in group["params"]:
            g = p.grad
            if g is not None:
                params.append(p)
                grads.append(g)
        return params, grads

    def state_dict(self):
        """{"state": {index: {name: tensor}}, "param_groups": [{options, "params": [index]}]},
        parameters numbered in group order."""
        index, groups = {}, []
        for g in self.param_groups:
            packed = {k: v for k, v in g.items() if k != "params"}
            packed["params"] = []
            for p in g["params"]:
                index.setdefault(id(p), len(index))
                packed["params"].append(index[id(p)])
            groups.append(packed)
        state = {index[id(p)]: s for p, s in self.state.items() if id(p) in index}
        return {"state": state, "param_groups": groups}

    def load_state_dict(self, state_dict):
        groups = state_dict["param_groups"]
        if len(groups) != len(self.param_groups):
            raise ValueError(f"loaded state dict has {len(groups)} parameter groups, the optimizer "
                             f"has {len(self.param_groups)}")
        by_index = {}
        for mine, theirs in zip(self.param_groups, groups):
            if len(mine["params"]) != len(theirs["params"]):
                raise ValueError("loaded state dict contains a parameter group that doesn't match "
                                 "the size of optimizer's group")
            by_index.update(zip(theirs["params"], mine["params"]))
        self.state = {}
        with no_grad():
            for i, s in state_dict["state"].items():
                p = by_index[int(i)]
                self.state[p] = {k: (v.to(v.dtype if k == "step" else p.dtype, p.device).clone()
                                     if isinstance(v, Tensor) else copy.deepcopy(v))
                                 for k, v in s.items()}
        for mine, theirs in zip(self.param_groups, groups):
            mine.update({k: copy.deepcopy(v) for k, v in theirs.items() if k != "params"})

    def __repr__(self):
        s = type(self).__name__ + " ("
        for i, g in enumerate(self.param_groups):
            s += f"\nParameter Group {i}"
            for k in sorted(k for k in g if k != "params"):
                s += f"\n    {k}: {g[k]}"
        return s + "\n)"
