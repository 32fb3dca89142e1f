"""Where the planner's next-token logits come from, by name: the one choice `PlannerConfig.decoder` makes.

    readable   CachedDecoder: one token at a time on the model's own KV cache (`model(x, cache=...)` and
               `KVCache.reorder`); the one to read (notebook 05)
    fused      fast_decoder.FusedDecoder: the same logits with far fewer operations, each environment's context
               shared by its beams; the CPU's default
    recompute  RecomputeDecoder: the whole sequence again for every token, the naive baseline
    static     static_decoder.StaticPlanner: the whole search, not only the model, with shapes that never change;
               on a GPU planning again and again (a BufferPool kept from plan to plan) each of its units is
               recorded once as a CUDA graph and replayed -- the GPU's default
    triton     triton_step.TritonPlanner: the static search with its decoding step one Triton kernel (CUDA)
    auto       the fastest measured where the plan runs (`resolve`: AUTO_ON_CPU, AUTO_ON_CUDA)

The first three are *token decoders*: the search in `beam.py` runs in Python and asks them for one token's
logits at a time, through the `Decoder` protocol below. The last two run the whole search themselves (the
search in `beam.py` hands them the plan), so they score with the value token and keep no search tree. Whether
the static search's units are replayed as CUDA graphs is not a decoder of its own: graphs replay the same kernels
on the same numbers, and a GPU replays them wherever its buffers are kept (see `resolve`); `ttlib bench` times the
static search launched kernel by kernel beside them (`BufferPool(graphs=False)`).

Every decoder makes the same plan from the same key (`search.py`: exactly in float64; in float32 rounding may break
a near-tie), which tests/test_planning.py, test_static_decoder.py and test_triton_step.py check.
"""

from __future__ import annotations

from typing import Literal, Protocol, get_args, runtime_checkable

import torch

from ttlib.model.gpt import TrajectoryGPT
from ttlib.planning.fast_decoder import BufferPool, FusedDecoder
from ttlib.planning.static_decoder import StaticPlanner
from ttlib.planning.triton_step import TritonPlanner

__all__ = ["AUTO_ON_CPU", "AUTO_ON_CUDA", "CachedDecoder", "DECODERS", "Decoder", "DecoderName", "RecomputeDecoder",
           "STATIC_SEARCHES", "TOKEN_DECODERS", "open_decoder", "resolve"]

DecoderName = Literal["auto", "fused", "readable", "recompute", "static", "triton"]  # PlannerConfig.decoder
DECODERS: tuple[str, ...] = get_args(DecoderName)
AUTO_ON_CPU = "fused"  # measured: `ttlib bench planning` times both side by side (docs/RESULTS.md, "Speed")
AUTO_ON_CUDA = "static"  # "static" or "triton" (its step one Triton kernel): tools/gpu-check's triton part times
# both; "triton" once it measures faster there


@runtime_checkable
class Decoder(Protocol):
    """What the search in `beam.py` asks of a token decoder. Made as `cls(model, prefix, beams_per_env)`: prefix
    (E, P) every environment's context as bins, fed once; W = beams_per_env identical beams per environment."""

    logits: torch.Tensor  # (E*W, N) the logits of every row's first token after the prefix

    def feed(self, bins: torch.Tensor) -> torch.Tensor:
        """bins (B,) of the next token of every row -> logits (B, N) of the token after it."""

    def expand(self, children: int) -> None:
        """Every row becomes `children` consecutive rows: child c of row b is row b*children + c."""

    def select(self, keep: torch.Tensor) -> None:
        """The rows become the rows keep (E*W,), each staying with its environment."""

    def release(self) -> None:
        """The plan is done: let go of the cache (the decoder cannot be used afterwards)."""


class CachedDecoder:
    """One token at a time for every row, on the model's own KV cache: the decoder notebook 05 reads.

    Every row holds its own copy of its keys and values; expanding and selecting beams are `KVCache.reorder`.
    `fast_decoder.FusedDecoder` computes the same logits with far fewer operations (and no copies of the shared
    context).
    """

    def __init__(self, model: TrajectoryGPT, prefix: torch.Tensor, beams_per_env: int):
        E, P = prefix.shape
        self.model = model
        self.cache = model.new_cache(E)  # room for the model's whole window
        logits, _ = model(prefix, cache=self.cache, last_only=True)  # (E, 1, N): the context, computed once
        self.cache.reorder(torch.arange(E, device=prefix.device).repeat_interleave(beams_per_env))  # W copies
        self.logits = logits[:, 0].repeat_interleave(beams_per_env, dim=0)  # (E*W, N)

    def feed(self, bins: torch.Tensor) -> torch.Tensor:
        """bins (B,) of the next token of every row -> logits (B, N) of the token after it."""
        return self.model(bins[:, None], cache=self.cache, last_only=True)[0][:, 0]

    def expand(self, children: int) -> None:
        rows = torch.arange(self.cache.batch, device=self.cache.k.device)
        self.cache.reorder(rows.repeat_interleave(children))  # (B*children,) each row `children` times

    def select(self, keep: torch.Tensor) -> None:
        self.cache.reorder(keep)

    def release(self) -> None:
        self.cache = None


class RecomputeDecoder:
    """The naive baseline: every new token runs the model over the whole sequence again."""

    def __init__(self, model: TrajectoryGPT, prefix: torch.Tensor, beams_per_env: int):
        self.model = model
        self.sequence = prefix.repeat_interleave(beams_per_env, dim=0)  # (E*W, P)
        self.logits = model(self.sequence, last_only=True)[0][:, 0]

    def feed(self, bins: torch.Tensor) -> torch.Tensor:
        self.sequence = torch.cat([self.sequence, bins[:, None]], dim=1)
        return self.model(self.sequence, last_only=True)[0][:, 0]

    def expand(self, children: int) -> None:
        self.sequence = self.sequence.repeat_interleave(children, dim=0)

    def select(self, keep: torch.Tensor) -> None:
        self.sequence = self.sequence[keep]

    def release(self) -> None:
        self.sequence = None


TOKEN_DECODERS = {"fused": FusedDecoder, "readable": CachedDecoder, "recompute": RecomputeDecoder}  # (Decoder)
STATIC_SEARCHES = {"static": StaticPlanner, "triton": TritonPlanner}  # the whole search, static shapes


def resolve(name: str, device: torch.device, replays: bool, tokens_needed: bool = False) -> str:
    """The decoder a plan runs on: `name`, or for "auto" the fastest measured where it runs -- AUTO_ON_CUDA on a
    GPU that replays graphs (replays: a BufferPool kept from plan to plan, whose graphs a single plan would only pay
    to record), the fused decoder on a GPU that does not, AUTO_ON_CPU on a CPU. tokens_needed: the search must be
    the one in `beam.py` (a search tree to keep, a critic or the likelihood to score with): "auto" then takes the
    fused decoder."""
    if name != "auto":
        return name
    if tokens_needed:
        return "fused"
    if device.type == "cuda":
        return AUTO_ON_CUDA if replays else "fused"
    return AUTO_ON_CPU


def open_decoder(name: str, model: TrajectoryGPT, prefix: torch.Tensor, beams_per_env: int, capacity: int,
                 buffers: BufferPool | None = None) -> Decoder:
    """The token decoder `name` (one of TOKEN_DECODERS) with the context fed. capacity and buffers are the fused
    decoder's, the one that lays out its cache ahead and keeps it from plan to plan: past slots per beam (the
    children of a step side by side) and the pool its buffers come from and go back to."""
    if name == "fused":
        return FusedDecoder(model, prefix, beams_per_env, capacity, buffers)
    return TOKEN_DECODERS[name](model, prefix, beams_per_env)
