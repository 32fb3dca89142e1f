"""The static search with its decoding step as one Triton kernel (`PlannerConfig(decoder="triton")`).

`static_decoder.StaticPlanner` runs a token as about a hundred PyTorch kernels: every layer's LayerNorm, products,
attention, GELU, then the head, softmax and sampling. On a GPU the launches, not the arithmetic, are the cost.
`TritonPlanner` is the same search with the step replaced by `triton_kernels.decode_step`: one launch per token
for all rows (a program per tile of rows), then the token counter's increment -- two kernels a token instead of a
hundred, recorded in the same CUDA graphs. The other units (start, expand, select, finish) are StaticPlanner's.

What it reads and writes is StaticPlanner's: the same cache, schedule, uniforms and rows, so the two make the
same plan from the same key; numbers differ by float rounding only (the products and the softmax are summed in
another order), which can break a near-tie between two bins or two children (tests/test_triton_step.py).

Triton comes with PyTorch's CUDA wheels on Linux. It is imported only when this decoder is asked for; without
it, or on a CPU without Triton's interpreter (TRITON_INTERPRET=1 set before Triton is imported: slow, for tests),
asking for it says so.
"""

from __future__ import annotations

import importlib

import torch

from ttlib.errors import ConfigError, UnavailableError
from ttlib.planning.static_decoder import StaticPlanner

__all__ = ["BLOCK_B", "BLOCK_F", "BLOCK_S", "TritonPlanner", "check_shapes", "kernels", "pack_layers"]

BLOCK_B = 16  # rows a program decodes (tl.dot needs at least 16)
BLOCK_S = 16  # cache slots read at a time
BLOCK_F = 64  # MLP hidden units at a time


def kernels(device: torch.device):
    """triton_kernels, imported on first use; a clear error where it cannot run on `device`."""
    try:
        module = importlib.import_module("ttlib.planning.triton_kernels")
    except ImportError as error:
        raise UnavailableError("the Triton decoding step (decoder='triton') needs Triton, which comes with PyTorch's "
                               f"CUDA wheels on Linux (pip install triton); it is not installed here ({error}). Plan "
                               "with decoder='static' or 'fused'") from error
    interpreted = type(module.decode_step).__name__ == "InterpretedFunction"
    if device.type == "cpu" and not interpreted:
        raise UnavailableError("the Triton decoding step (decoder='triton') runs on a CUDA device; on a CPU only under "
                               "Triton's interpreter (TRITON_INTERPRET=1, set before Triton is first imported: slow, "
                               "for tests). Plan with decoder='static' or 'fused' on a CPU")
    if device.type == "cuda" and interpreted:
        raise UnavailableError("Triton was imported with TRITON_INTERPRET=1, which runs kernels on the CPU: unset it "
                               "to plan with decoder='triton' on a GPU")
    return module


def pack_layers(layers) -> torch.Tensor:
    """static_decoder's LayerWeights, one row per layer, in the order triton_kernels reads them -> (L, 12C^2+13C)."""
    rows = []
    for norm_1, w_qkv, b_qkv, w_proj, b_proj, norm_2, w_up, b_up, w_down, b_down in layers:
        pieces = (norm_1[1], norm_1[2], w_qkv, b_qkv, w_proj, b_proj, norm_2[1], norm_2[2], w_up, b_up, w_down,
                  b_down)
        rows.append(torch.cat([p.detach().reshape(-1) for p in pieces]))
    return torch.stack(rows).contiguous()


def check_shapes(C: int, D: int, N: int) -> None:
    """The kernel's tiles: widths that are powers of two, at least 16 (tl.dot's smallest)."""
    for name, value in (("n_embd", C), ("head width (n_embd / n_head)", D)):
        if value < 16 or value & (value - 1):
            raise ConfigError(f"the Triton decoding step needs a {name} that is a power of two of at least 16, got "
                              f"{value}: plan with decoder='static'")
    if N < 1:
        raise ConfigError(f"n_bins must be >= 1, got {N}")


class TritonPlanner(StaticPlanner):
    """StaticPlanner, its step one Triton kernel (triton_kernels.decode_step) and the counter's increment."""

    def __init__(self, model, tokenizer, config, n_envs: int, runner, context: int | None = None):
        self.kernels = kernels(model.pos_emb.device)
        super().__init__(model, tokenizer, config, n_envs, runner, context)
        c = model.config
        check_shapes(c.n_embd, self.D, self.N)
        self.eps = float(model.ln_f.eps)
        if any(b.ln_1.eps != self.eps or b.ln_2.eps != self.eps for b in model.blocks):
            raise ConfigError("the Triton decoding step needs one LayerNorm eps for every layer")
        self.packed = pack_layers(self.layers)  # (L, 12C^2 + 13C)
        self.final = torch.cat([model.ln_f.weight.detach(), model.ln_f.bias.detach()])  # (2C,)
        self.tok_emb, self.pos_emb, self.head_weight, self.head_bias, self.reward_means = (
            t.detach().contiguous() for t in (self.tok_emb, self.pos_emb, self.head_weight, self.head_bias,
                                              self.reward_means))  # the kernel reads them row-major
        self.used_slots = torch.tensor(self.used, dtype=torch.long, device=self.k.device)  # (tokens,)
        self.seen_table = self.seen.to(torch.int8).contiguous()  # (tokens, X, S)
        self.n_attended = torch.zeros(1, dtype=torch.long, device=self.k.device)  # the context's slots in use
        self.step = self._step  # (never torch.compile'd: the step is one kernel already)
        top_k, top_p = config.top_k_action, config.top_p_action
        self.top_k = top_k if top_k is not None and top_k < self.N else 0  # 0: every bin
        self.top_p = top_p if top_p is not None and top_p < 1 else 1.0  # 1: every bin

    def _start(self, P: int) -> None:
        super()._start(P)
        self.n_attended.fill_(len(self.attended[P]))  # (a constant of the ("start", P) graph)

    def _step(self, rows, parity: int, n: int) -> None:
        """Token k for every row (n, the slots the eager step would read, is not needed: the kernel reads the
        slots in use from the schedule)."""
        B, c = rows.bins.shape[0], self.model.config
        self.kernels.decode_step[(-(-B // BLOCK_B),)](
            rows.bins, self.k, self.p0, self.schedule, self.seen_table, self.used_slots, self.n_attended,
            self.tok_emb, self.pos_emb, self.packed, self.final, self.head_weight, self.head_bias, self.context_k,
            self.context_v, self.past[parity], rows.logits, rows.generated, rows.rewards, self.uniforms,
            self.reward_means, B, self.E, self.eps, float(self.config.temperature), self.top_k,
            float(self.top_p), L=c.n_layer, C=c.n_embd, HEADS=self.heads, D=self.D, N=self.N, TD=self.td,
            X=rows.children, X_SEEN=self.X, S=self.S, KC=self.Kc, HA=self.H * self.A, H1=self.H + 1,
            G1=self.G + 1, CHILDREN=rows is self.children, TOP_K=self.top_k > 0, TOP_P=self.top_p < 1,
            BLOCK_B=BLOCK_B, BLOCK_S=BLOCK_S, BLOCK_F=min(BLOCK_F, 4 * c.n_embd),
            BLOCK_N=max(16, 1 << (self.N - 1).bit_length()))
        self.k.add_(1)
