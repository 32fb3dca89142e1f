"""Checking answers that are `nn.Module`s: ttlib's weights in the learner's classes, and what their parts were fed.

An answer class built as the notebook builds it (`MLP(n_embd)`, `Block(n_embd, n_head)`, `GPT(config)`) is loaded
with ttlib's weights (`load_weights`), so it must compute ttlib's function, not just something shaped like it.
`watching` records what a module's parts (a block's attention and MLP, a GPT's first block) were fed, so a check
can compare those in the order the computation runs and name the step that first went wrong. `randomized` makes
every LayerNorm and bias random, so that an answer that skips or swaps one shows.
"""

from __future__ import annotations

import contextlib
import functools

import torch
from torch import nn

__all__ = ["argument", "load_weights", "randomized", "snapshot", "watching"]


def load_weights(mine: nn.Module, state: dict, what: str) -> nn.Module:
    """`mine` holding ttlib's weights `state`, in eval mode; when they do not fit, a message that names the weights
    that are missing, unexpected or shaped differently (not PyTorch's load_state_dict error)."""
    yours = mine.state_dict()
    missing, unexpected = [n for n in state if n not in yours], [n for n in yours if n not in state]
    if missing or unexpected:
        parts = ([f"missing in yours: {_names(missing)}"] if missing else []) + \
                ([f"unexpected in yours: {_names(unexpected)}"] if unexpected else [])
        raise AssertionError(f"ttlib's {what} weights do not fit your {what} ({'; '.join(parts)}): keep the layers "
                             "and the names that the given __init__ creates.")
    for name, tensor in yours.items():
        if tuple(tensor.shape) != tuple(state[name].shape):
            raise AssertionError(f"ttlib's {what} weights do not fit your {what}: {name} has shape "
                                 f"{tuple(tensor.shape)} in yours but {tuple(state[name].shape)} in ttlib's: keep "
                                 "the layers and the sizes that the given __init__ creates.")
    mine.load_state_dict(state)
    return mine.eval()


def _names(names: list[str], show: int = 6) -> str:
    return ", ".join(names[:show]) + (f" and {len(names) - show} more" if len(names) > show else "")


@contextlib.contextmanager
def watching(**modules: nn.Module):
    """{name: (args, kwargs)} of the first call of each module while the block runs (forward pre-hooks)."""
    seen: dict = {}

    def record(name, module, args, kwargs):  # copies: what the module is fed, even if changed in place later
        if name not in seen:
            seen[name] = tuple(snapshot(a) for a in args), {k: snapshot(v) for k, v in kwargs.items()}

    handles = [m.register_forward_pre_hook(functools.partial(record, name), with_kwargs=True)
               for name, m in modules.items()]
    try:
        yield seen
    finally:
        for handle in handles:
            handle.remove()


def snapshot(value):
    """A tensor's detached copy (what a module was fed, even if changed in place later); anything else as is."""
    return value.detach().clone() if isinstance(value, torch.Tensor) else value


def argument(call: tuple, index: int, name: str):
    """Argument `index` (or keyword `name`) of a call `watching` recorded."""
    args, kwargs = call
    return args[index] if len(args) > index else kwargs.get(name)


def randomized(module: nn.Module) -> nn.Module:
    """Every LayerNorm scale and shift and every bias random, so that an answer that skips or swaps one shows."""
    with torch.no_grad():
        for name, p in module.named_parameters():
            if name.startswith("ln") or ".ln" in name:
                p.copy_(torch.randn_like(p) * 0.5 + (1.0 if name.endswith("weight") else 0.0))
            elif name.endswith("bias"):
                p.copy_(torch.randn_like(p) * 0.1)
    return module
