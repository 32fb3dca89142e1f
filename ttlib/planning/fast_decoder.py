"""The planner's fast decoder: the model's forward pass for one new token per row, fused for beam search.

`decoders.CachedDecoder` decodes on the model's own KV cache and reads like the model. This module computes the
same numbers with far fewer PyTorch operations, which is what makes `ttlib bench planning` fast: at beam-search
sizes (32-64 rows) launching an operation costs about as much as its arithmetic, so the operation count is the
cost. A test checks that both decoders make the same plan (float64) and give the same logits along the same
tokens (float32).

The cache has two levels of keys and values per layer, each stored once and shared by every row below it:

    context  the environment's context, one copy per environment (E)     computed once, read by all its rows
    past     what a beam generated since the context, one per beam (E*W)  shared by the beam's X children

Expanding a beam into X children copies nothing: the children read their beam's past in place and write their own
new tokens into the beam's buffer too, interleaved (token j of child c at slot n + j*X + c, so one step's X
children land in one contiguous block). A child must not see its siblings' tokens: an additive mask (0 or -inf)
hides them. Selecting the new beams copies each survivor's past and own tokens into a spare buffer, once; the two
buffers swap at every selection. Value tokens are never attended to (the value rule), so their keys and values
are never stored, and the result is exactly what the masked model computes.

How the forward pass is laid out for few operations:
- heads come first, so the queries of one environment, or of one beam's children, are a contiguous block of rows
  and every level's attention is a plain `torch.bmm`;
- keys sit beside their values in one buffer (L, 2, H, rows, capacity, D): storing a new token is one copy;
- the weights are laid out once for `mm`, with 1/sqrt(D) folded into the query projection; biases are added in
  place and the residual rides in `addmm`'s accumulator;
- a values product too small for ATen's matrix kernel reads a few more slots, weighted exactly 0 (`min_slots`).
"""

from __future__ import annotations

import threading
from typing import NamedTuple

import torch
import torch.nn.functional as F

from ttlib.model.gpt import TrajectoryGPT

__all__ = ["BufferPool", "FusedDecoder", "LayerWeights", "min_slots", "norm_args"]


def min_slots(queries: int, head_dim: int) -> int:
    """Slots a values product of `queries` rows reads at least. ATen multiplies matrices of fewer than 400
    multiply-adds in a scalar loop, much slower than its matrix kernel; slots past the real ones are padding,
    weighted exactly 0."""
    return 400 // (queries * head_dim) + 1


class BufferPool:
    """Cache buffers kept from one plan to the next, up to `max_bytes`: a rollout plans again and again with the
    same shapes, and a fresh buffer of many MB costs page faults as it is first written (the operating system
    hands out memory a page at a time). Whoever plans repeatedly owns one and passes it to `beam_plan`."""

    def __init__(self, max_bytes: int = 256 * 2**20, max_kept: int = 2, graphs: bool = True):
        self.free = []  # buffers not in use, the most recently returned first
        self.max_bytes = max_bytes  # the most memory kept
        self.kept = {}  # key -> a static_decoder.StaticPlanner not in use, the most recently returned last
        self.max_kept = max_kept  # the most static planners kept (each holds its cache, and its CUDA graphs)
        self.graphs = graphs  # on CUDA, a kept static planner replays its units as CUDA graphs (False: launched
        #                       kernel by kernel, what `ttlib bench planning` times the graphs against)
        self.lock = threading.Lock()  # a pool may serve planners in several threads

    def take(self, shape: tuple, like: torch.Tensor) -> torch.Tensor:
        """A buffer of `shape` with like's dtype and device, kept or new. The values' first slots hold finite
        numbers (zeros at first; later, values stored before): padding is weighted 0, and 0 * nan would be nan."""
        with self.lock:
            for i, buffer in enumerate(self.free):
                if (buffer.shape, buffer.dtype, buffer.device) == (shape, like.dtype, like.device) and \
                        buffer.is_inference() == torch.is_inference_mode_enabled():  # (both made in one mode)
                    return self.free.pop(i)
        buffer = like.new_empty(shape)
        buffer[:, 1, ..., :min_slots(1, shape[-1]), :].zero_()
        return buffer

    def take_kept(self, key, make):
        """The object kept under key, taken out of the pool (no other thread gets it meanwhile), or make()."""
        with self.lock:
            kept = self.kept.pop(key, None)
        return kept if kept is not None else make()

    def give_kept(self, key, kept) -> None:
        with self.lock:
            self.kept[key] = kept
            while len(self.kept) > self.max_kept:
                del self.kept[next(iter(self.kept))]  # the least recently returned

    def give(self, *buffers: torch.Tensor) -> None:
        with self.lock:
            self.free = [*buffers, *self.free]  # the newest first; the oldest go when over budget
            kept = 0
            for i, buffer in enumerate(self.free):
                kept += buffer.numel() * buffer.element_size()
                if kept > self.max_bytes:
                    del self.free[i:]
                    break


def norm_args(norm: torch.nn.LayerNorm) -> tuple:
    """A LayerNorm's arguments, looked up once: `torch.layer_norm(x, *args)` skips the module's Python wrapper."""
    return norm.normalized_shape, norm.weight, norm.bias, norm.eps


class LayerWeights(NamedTuple):
    """One block's weights, laid out for `torch.mm(x, weight)` (C: width, D: head width)."""
    norm_1: tuple  # ln_1's arguments
    qkv_weight: torch.Tensor  # (C, 3C), the query columns scaled by 1/sqrt(D)
    qkv_bias: torch.Tensor  # (3C,), likewise scaled
    proj_weight: torch.Tensor  # (C, C)
    proj_bias: torch.Tensor  # (C,)
    norm_2: tuple  # ln_2's arguments
    up_weight: torch.Tensor  # (C, 4C)
    up_bias: torch.Tensor  # (4C,)
    down_weight: torch.Tensor  # (4C, C)
    down_bias: torch.Tensor  # (C,)

    @classmethod
    def of(cls, block, head_dim: int) -> LayerWeights:
        attn, mlp = block.attn, block.mlp
        C = attn.proj.weight.shape[0]
        scale = torch.ones(3 * C, device=attn.qkv.weight.device, dtype=attn.qkv.weight.dtype)
        scale[:C] = head_dim ** -0.5
        return cls(norm_args(block.ln_1), (attn.qkv.weight * scale[:, None]).t().contiguous(), attn.qkv.bias * scale,
                   attn.proj.weight.t().contiguous(), attn.proj.bias, norm_args(block.ln_2),
                   mlp.up.weight.t().contiguous(), mlp.up.bias, mlp.down.weight.t().contiguous(), mlp.down.bias)


class FusedDecoder:
    """One token at a time for every row, on the two-level cache described in the module docstring.

    The interface every token decoder has (`decoders.Decoder`): `logits` (rows, N) for the first token after the
    prefix, then `feed(bins)` -> the next logits, `expand(children)`, `select(keep)`, and `release()` at the end.
    """

    def __init__(self, model: TrajectoryGPT, prefix: torch.Tensor, beams_per_env: int, capacity: int | None = None,
                 buffers: BufferPool | None = None):
        """prefix (E, P) bins. capacity: past slots per beam to allocate up front (a step of X children takes X;
        None: the model's window after the prefix); the buffers grow if it is short. buffers: where to take cache
        buffers from and give them back to (None: a pool of its own)."""
        c = model.config
        E, P = prefix.shape
        capacity = capacity or max(1, c.block_size - P)
        H, D = c.n_head, c.n_embd // c.n_head
        self.transition_dim, self.n_bins, self.n_heads, self.head_dim = c.transition_dim, c.n_bins, H, D
        self.n_envs, self.position = E, P  # the next token's absolute position
        self.buffers = buffers if buffers is not None else BufferPool()

        context = model.new_cache(E, capacity=P)
        logits, _ = model(prefix, cache=context, last_only=True)  # (E, 1, N)
        attended = torch.arange(P, device=prefix.device) % self.transition_dim != self.transition_dim - 1
        self.n_context = Pc = int(attended.sum())  # context tokens attended to: all but the value tokens
        # per layer: keys (H*E, D, Pc), transposed once for the scores, and values (H*E, Pc, D)
        self.context_k = list(context.k[:, :, :, attended].permute(0, 2, 1, 4, 3).reshape(-1, H * E, D, Pc))
        self.context_v = list(context.v[:, :, :, attended].transpose(1, 2).reshape(-1, H * E, Pc, D))
        shape = (c.n_layer, 2, H, E * beams_per_env, capacity, D)  # (L, keys/values, H, E*W, capacity, D)
        self.spare = self.buffers.take(shape, context.k)  # selection copies the survivors into this one
        self._set_past(self.buffers.take(shape, context.k), 0)
        self.no_weight = context.k.new_full((1, 1, min_slots(1, D)), float("-inf"))  # scores of padding slots
        self.n_own, self.children = 0, 1  # tokens each child wrote since its beam was expanded; children per beam
        self.logits = logits[:, 0].repeat_interleave(beams_per_env, dim=0)  # (E*W, N)

        self.layers = [LayerWeights.of(block, D) for block in model.blocks]
        self.norm_f, self.tok_emb, self.pos_emb = norm_args(model.ln_f), model.tok_emb.weight, model.pos_emb
        self.head_weight, self.head_bias = model.head_weight, model.head_bias  # (td, C, N), (td, N)

    def _set_past(self, kv: torch.Tensor, n_past: int) -> None:
        self.past, self.n_past = kv, n_past  # n_past: tokens every beam has; its children's follow, interleaved
        self.past_layers = list(kv)  # per layer: (2, H, E*W, capacity, D)
        self.read_k = [k.flatten(0, 1) for k in kv[:, 0]]  # per layer: (H*E*W, capacity, D), the same memory
        self.read_v = [v.flatten(0, 1) for v in kv[:, 1]]

    def feed(self, bins: torch.Tensor) -> torch.Tensor:
        """bins (B,) of the token at `self.position` for every row -> logits (B, N) of the next token."""
        X, D = self.children, self.head_dim
        dim = self.position % self.transition_dim
        store = dim != self.transition_dim - 1  # a value token is neither stored nor attended to, not even by itself
        slot = self.n_past + self.n_own * X  # where this step's X tokens of a beam go
        n = slot + X * store  # past slots this token's scores cover (its siblings' masked out)
        if n > self.past.shape[4]:  # the buffer is full: double it (zeros: new slots may be read as padding)
            self._set_past(torch.cat([self.past, torch.zeros_like(self.past)], dim=4), self.n_past)
            self._mask_siblings()
        n_read = min(max(n, min_slots(X, D)), self.past.shape[4]) if n else 0  # values' slots, padding included
        mask = self.sibling_mask[:, :n] if X > 1 else None  # (X, n) hides a child's siblings
        store_at = slot if store else None
        table = self.tok_emb[dim * self.n_bins:(dim + 1) * self.n_bins]  # (N, C): this dimension's tokens
        x = F.embedding(bins, table) + self.pos_emb[self.position]  # (B, C)
        for layer, (norm_1, w_qkv, b_qkv, w_proj, b_proj, norm_2, w_up, b_up, w_down, b_down) in enumerate(self.layers):
            h = torch.layer_norm(x, *norm_1)
            y = self._attend(layer, torch.mm(h, w_qkv).add_(b_qkv), store_at, n, n_read, mask)  # (B, C)
            x = torch.addmm(x, y, w_proj).add_(b_proj)
            h = torch.layer_norm(x, *norm_2)
            x = torch.addmm(x, F.gelu(torch.mm(h, w_up).add_(b_up)), w_down).add_(b_down)
        self.position += 1
        if store and X > 1:
            self.n_own += 1
        elif store:
            self.n_past += 1
        x = torch.layer_norm(x, *self.norm_f)
        nxt = self.position % self.transition_dim
        return torch.addmm(self.head_bias[nxt], x, self.head_weight[nxt])  # (B, N)

    def _attend(self, layer: int, qkv: torch.Tensor, slot: int | None, n: int, n_read: int,
                mask: torch.Tensor | None) -> torch.Tensor:
        """qkv (B, 3C) of the new tokens -> attention output (B, C), heads side by side. slot: where the new keys
        and values go in the past (None: a value token, not stored); n: past slots the scores cover; n_read: past
        slots the values product reads (n, plus padding); mask (X, n): the sibling mask, None for one child."""
        E, H, D, X, Pc = self.n_envs, self.n_heads, self.head_dim, self.children, self.n_context
        B = qkv.shape[0]
        beams = B // X  # E*W rows of past
        qkv = qkv.view(B, 3, H, D).permute(1, 2, 0, 3)  # (3, H, B, D)
        if slot is not None:  # (2, H, E*W, X, D): the X children of a beam side by side
            self.past_layers[layer][:, :, :, slot:n] = qkv[1:].view(2, H, beams, X, D)
        q = qkv[0].contiguous()  # (H, B, D)
        scores = torch.bmm(q.view(H * E, B // E, D), self.context_k[layer]).view(H, B, Pc)
        if n:
            keys = self.read_k[layer][:, :n].transpose(1, 2)  # (H*E*W, D, n)
            past_scores = (torch.bmm(q.view(H * beams, X, D), keys) if mask is None else
                           torch.baddbmm(mask, q.view(H * beams, X, D), keys))  # (H*E*W, X, n)
            pieces = [scores, past_scores.view(H, B, n)]
            if n_read > n:  # padding, read only to reach ATen's matrix kernel: weights exactly 0
                pieces.append(self.no_weight[:, :, :n_read - n].expand(H, B, n_read - n))
            scores = torch.cat(pieces, dim=-1)
        weights = torch.softmax(scores, dim=-1)  # (H, B, Pc + n_read)
        y = torch.bmm(weights[..., :Pc].view(H * E, B // E, Pc), self.context_v[layer]).view(H, B, D)
        if n:
            y.view(H * beams, X, D).baddbmm_(weights[..., Pc:].view(H * beams, X, n_read),
                                              self.read_v[layer][:, :n_read])
        return y.transpose(0, 1).reshape(B, H * D)

    def expand(self, children: int) -> None:
        """Every row gets `children` children, which share its past: nothing is copied."""
        if self.children > 1:  # expanding children again: they become beams first
            self.select(torch.arange(self.past.shape[3] * self.children, device=self.past.device))
        self.children, self.n_own = children, 0
        self._mask_siblings()

    def _mask_siblings(self) -> None:
        """(X, capacity), added to a beam's X children's scores: 0 where child c may look (the beam's past, its own
        slots), -inf on its siblings' slots."""
        X = self.children
        slot = torch.arange(self.past.shape[4], device=self.past.device) - self.n_past  # (capacity,)
        sees = (slot < 0) | (slot % X == torch.arange(X, device=slot.device)[:, None])  # (X, capacity)
        self.sibling_mask = torch.zeros(sees.shape, dtype=self.past.dtype, device=slot.device).masked_fill_(
            ~sees, float("-inf"))

    def select(self, keep: torch.Tensor) -> None:
        """keep (E*W,): the rows (children) that become the new beams, with their beam's past and own tokens.
        Rows never change environment: the first W entries of keep are rows of environment 0, and so on."""
        n, m, X = self.n_past, self.n_own, self.children
        if self.spare.shape[3:5] != (keep.numel(), self.past.shape[4]):  # the spare buffer does not fit
            self.spare = self.buffers.take((*self.past.shape[:3], keep.numel(), *self.past.shape[4:]), self.past)
        new, self.spare = self.spare, self.past
        torch.index_select(self.past[..., :n, :], 3, keep // X, out=new[..., :n, :])
        if m:  # token j of child c of beam b sits at slot n + j*X + c of row b: one index_select per j, in a
            # (rows*capacity) view, moves it to slot n + j of every survivor, with no copy in between
            cap = self.past.shape[4]
            flat = self.past.flatten(3, 4)  # (L, 2, H, rows*capacity, D), the same memory
            first = keep // X * cap + n + keep % X  # (E*W,) each survivor's first own token in that view
            for j in range(m):
                torch.index_select(flat, 3, first + j * X, out=new[..., n + j, :])
        self._set_past(new, n + m)
        self.n_own, self.children = 0, 1

    def release(self) -> None:
        """Give the cache buffers back to the pool for the next plan; the decoder cannot be used afterwards."""
        self.buffers.give(self.past, self.spare)
        self.past = self.spare = self.past_layers = self.read_k = self.read_v = None
