"""What a plan's arithmetic costs: its matmul FLOPs counted, and its matrix products recorded and made again alone.

The FLOP floor of a plan is `plan_flops` at the rate this machine multiplies two large matrices
(`bench.matmul_rate`): the fastest any implementation could go. `ttlib bench planning` also records the matrix
products one plan makes (`recorded_products`, seen where PyTorch dispatches them) and makes the same products
again with nothing between them (`replay`): how far those alone are from the floor is what the matrix library does
at a beam search's sizes; how far the plan is from them is everything else.
"""

from __future__ import annotations

import numpy as np
import torch

from ttlib.model.gpt import GPTConfig
from ttlib.planning.beam import PlannerConfig

__all__ = ["ATTENTION_PRODUCTS", "LINEAR_PRODUCTS", "plan_flops", "product_flops", "recorded_products", "replay",
           "token_flops"]


def token_flops(config: GPTConfig, keys: int, head: bool) -> int:
    """Matmul FLOPs to push one token through the model when it attends to `keys` tokens."""
    C = config.n_embd
    per_layer = 2 * 12 * C * C + 2 * 2 * keys * C  # qkv + proj + mlp, then q.k and weights.v over all heads
    return config.n_layer * per_layer + (2 * C * config.n_bins if head else 0)


def plan_flops(config: GPTConfig, planner: PlannerConfig, batch: int, attention: bool = True) -> int:
    """Matmul FLOPs of one cached beam_plan call for `batch` environments (counted the way beam_plan runs).
    attention=False: the linear layers' and heads' alone."""
    O, A, td = config.obs_dim, config.act_dim, config.transition_dim
    P = (planner.context - 1) * td + O
    flops = batch * sum(token_flops(config, (p + 1) * attention, head=p == P - 1) for p in range(P))  # the context
    W, X, pos = planner.beam_width, planner.sample_expand, P
    for t in range(planner.horizon):
        fed = [W * X] * (A + 1)  # action tokens and the reward, on every child
        if t < planner.horizon - 1:
            fed += [W] * (1 + O)  # value and next observation, on the survivors
        for rows in fed:
            pos += 1
            flops += batch * rows * token_flops(config, pos * attention, head=True)  # (no keys: linear alone)
    return flops


# ---- the products a plan makes, without the plan ----------------------------------------------------------
LINEAR_PRODUCTS = ("aten::mm", "aten::addmm", "aten::linear", "aten::matmul")  # the linear layers and heads
ATTENTION_PRODUCTS = ("aten::bmm", "aten::baddbmm", "aten::baddbmm_")  # scores and weighted values


def recorded_products(fn) -> list:
    """The matrix products one fn() call makes, in order, as (operation, input shapes), seen where PyTorch
    dispatches each operation to its kernel. (The context's attention, one fused `scaled_dot_product_attention`
    per layer, is not among them.)"""
    from torch.utils._python_dispatch import TorchDispatchMode

    products = []

    class Recorder(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            name = f"aten::{func.overloadpacket.__name__}"
            if name in LINEAR_PRODUCTS + ATTENTION_PRODUCTS:
                products.append((name, [list(a.shape) for a in args[:3] if isinstance(a, torch.Tensor)]))
            return func(*args, **(kwargs or {}))

    with Recorder():
        fn()
    return products


def product_flops(products: list, kinds: tuple) -> int:
    """FLOPs of the recorded products of the given kinds: 2 per multiply-add."""
    flops = 0
    for name, shapes in products:
        if name in kinds:  # a (.., M, K) times b (.., K, N) or (K,); linear: b is the weight, (N, K)
            a, b = shapes[1:3] if name in ("aten::addmm", "aten::baddbmm", "aten::baddbmm_") else shapes[:2]
            flops += 2 * int(np.prod(a)) * (b[0] if name == "aten::linear" else b[-1] if len(b) > 1 else 1)
    return flops


def replay(products: list, device="cpu", dtype=torch.float32):
    """fn() that makes the same products in the same order and nothing else: one tensor per shape, reused, as a
    plan reuses its weights. Timed beside the plan, it says how much of the plan is its matrix products at their
    own sizes, and how far those alone are from the FLOP floor."""
    tensors = {}

    def tensor(shape):
        if tuple(shape) not in tensors:
            tensors[tuple(shape)] = torch.randn(shape, device=device).to(dtype)
        return tensors[tuple(shape)]

    ops = {"aten::mm": torch.mm, "aten::addmm": torch.addmm, "aten::linear": torch.nn.functional.linear,
           "aten::matmul": torch.matmul, "aten::bmm": torch.bmm,
           "aten::baddbmm": torch.baddbmm, "aten::baddbmm_": torch.Tensor.baddbmm_}
    calls = [(ops[name], [tensor(shape) for shape in shapes]) for name, shapes in products]

    @torch.inference_mode()
    def run():
        for op, args in calls:
            op(*args)
    return run
