"""Beam-search planning with the Trajectory GPT, batched over environments and run on the KV cache.

The model has learned p(next token | trajectory so far). To act, we let it imagine many futures and keep the
ones it believes pay off best:

    for each of `horizon` steps:
        expand:  every kept beam gets `sample_expand` children
        actions: sample the action tokens (this is where the futures differ)
        reward, value: read the model's distribution for both; score each child by
                 sum_k gamma^k E[r_k] + gamma^(t+1) E[V_t]   (rewards so far + the value of what follows)
        select:  keep the best `beam_width` children per environment
        observe: decode the next observation greedily (top-1): the model's most likely outcome

The first action of the best plan is executed and the whole search runs again at the next step.

Two decoders give the next token's logits: `CachedDecoder` (KV cache; the context is stored once per
environment and shared by its beams) and `RecomputeDecoder` (runs the whole sequence again for every token, the
naive baseline). Both consume the same random numbers, so the same seed gives the same plan with either.
Random numbers come from a counter-based hash of (environment key, token counter, beam row): an environment's
plan does not depend on which other environments share the batch.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .model import TrajectoryGPT
from .tokenizer import TrajectoryTokenizer


@dataclass
class PlannerConfig:
    beam_width: int = 32  # candidate plans kept per environment after each step
    horizon: int = 5  # transitions imagined ahead
    sample_expand: int = 2  # children sampled from every kept plan at each step
    context: int = 5  # transitions of history the model sees, the current observation's included
    top_k_action: int | None = None  # sample actions among the k likeliest bins only (None: all)
    top_p_action: float | None = None  # ...and among the likeliest bins that hold this much probability (None: all)
    temperature: float = 1.0  # softmax temperature for action sampling
    gamma: float = 0.99  # discount used to score plans
    value_weight: float = 1.0  # weight of the predicted value in a plan's score (0: rewards only)
    use_cache: bool = True  # KV cache (True) or recompute the whole sequence for every token (False)

    def validate(self) -> None:
        for name in ("beam_width", "horizon", "sample_expand", "context"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.top_k_action is not None and self.top_k_action < 1:
            raise ValueError(f"top_k_action must be >= 1 or None, got {self.top_k_action}")
        if self.top_p_action is not None and not 0 < self.top_p_action <= 1:
            raise ValueError(f"top_p_action must be in (0, 1] or None, got {self.top_p_action}")
        if self.temperature <= 0:
            raise ValueError(f"temperature must be > 0, got {self.temperature}")
        if self.value_weight < 0:
            raise ValueError(f"value_weight must be >= 0, got {self.value_weight}")
        if not 0 < self.gamma <= 1:
            raise ValueError(f"gamma must be in (0, 1], got {self.gamma}")


def course_planner(**overrides) -> PlannerConfig:
    """The planner setting used for the course's LunarLander checkpoint (README, notebooks 05-08, `ttlib evaluate`).

    A short context and horizon with top-k action sampling: on this small, briefly trained model a long context
    makes the closed-loop agent copy its own past actions. Keyword arguments override single fields.
    """
    settings = dict(beam_width=32, horizon=3, sample_expand=4, context=1, top_k_action=20)
    settings.update(overrides)
    return PlannerConfig(**settings)


@dataclass
class Plan:
    actions: torch.Tensor  # (E, H, act_dim) decoded actions of the best plan per environment
    observations: torch.Tensor  # (E, H-1, obs_dim) the observations the model expects along it
    rewards: torch.Tensor  # (E, H) expected rewards
    values: torch.Tensor  # (E, H) expected values after each step
    score: torch.Tensor  # (E,) discounted score of the best plan
    bins: torch.Tensor  # (E, n_generated) every generated token, as bins


# ---- random numbers that do not depend on the batch ---------------------------------------------------------
_MASK32 = 0xFFFFFFFF


def _pcg_hash(x: torch.Tensor) -> torch.Tensor:
    """A 32-bit integer hash (PCG output permutation) on int64 tensors; products stay below 2^63."""
    state = (x * 747796405 + 2891336453) & _MASK32
    word = (((state >> ((state >> 28) + 4)) ^ state) * 277803737) & _MASK32
    return ((word >> 22) ^ word) & _MASK32


def counter_uniform(keys: torch.Tensor, counter: int | torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """Uniform numbers in (0, 1), float64, one per entry of keys/rows, a pure function of (key, counter, row).
    The three broadcast: keys and rows (B, 1) with counters (A,) give (B, A), the numbers of A counters at once."""
    h = _pcg_hash(keys & _MASK32)
    h = _pcg_hash(h ^ ((keys >> 32) & _MASK32))
    h = _pcg_hash(h ^ counter)
    h = _pcg_hash(h ^ rows)
    return (h.to(torch.float64) + 0.5) / 2**32


def sample_bins(logits: torch.Tensor, uniform: torch.Tensor, top_k: int | None = None,
                temperature: float = 1.0, top_p: float | None = None) -> torch.Tensor:
    """Inverse-CDF sampling: logits (B, N), uniform (B,) -> bins (B,).

    top_k keeps the k likeliest bins; top_p ("nucleus") keeps the likeliest bins until they hold a probability
    of at least top_p. On data from a mixture of policies, top_p drops the rare, random-looking actions.
    """
    if temperature != 1:
        logits = logits / temperature
    if top_k is not None and top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[:, -1:]  # (B, 1)
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p is not None and top_p < 1:
        probs, order = torch.softmax(logits, dim=-1).sort(dim=-1, descending=True)  # (B, N) likeliest first
        outside = probs.cumsum(dim=-1) - probs >= top_p  # bins after the nucleus already holds top_p
        logits = logits.masked_fill(outside.scatter(-1, order, outside), float("-inf"))
    cdf = torch.softmax(logits, dim=-1).cumsum(dim=-1)  # (B, N)
    threshold = uniform.to(cdf.dtype)[:, None] * cdf[:, -1:]  # (B, 1)
    bins = torch.searchsorted(cdf, threshold, right=True)[:, 0]
    return bins.clamp_(max=logits.shape[-1] - 1)


# ---- decoders: where the next token's logits come from ------------------------------------------------------
class CachedDecoder:
    """One token at a time for every row, on a KV cache laid out for beam search.

    Two levels of keys and values per layer, each stored once and shared by every row below it:
      context  Pc tokens per environment (E)   its context, computed once and shared by all of its rows
      past     tokens per beam (E*W)           what the beam generated since the context, shared by its children
    Expanding a beam into X children copies nothing: the children read their beam's past in place, and write
    their own new tokens into the beam's buffer too, interleaved (token j of child c at n + j*X + c, so the X
    children's keys and values of one step land in one contiguous block). A child must not see its siblings'
    tokens: an additive mask (0 or -inf), the starting value of the scores' `baddbmm`, hides them, so the past
    stays one product for the scores and one for the values.
    Selecting the new beams copies each survivor's past and own tokens into the new past, once: into a spare
    buffer, and the two swap at every selection. Both buffers are kept for the next plan (`release`): fresh
    multi-MB buffers would cost more than the copies, as the operating system hands out new memory a page at a
    time. Value tokens are never attended to (the value rule), so their keys and values are never stored, and the
    result is exactly what the masked model computes.

    At beam-search sizes (32-64 rows) the cost of launching a PyTorch operation rivals its arithmetic, so `_step`,
    the model's forward pass for one new token per row, is written for as few operations as possible:
    - heads come first, so the queries of one environment, or of one beam's children, are a contiguous block of
      rows: every level's scores come out as (H, B, keys), and attention is a few plain `torch.bmm` calls;
    - keys sit beside their values in one buffer, (2, ..., capacity, D): storing a new token's keys and values is
      one copy of whole rows. (Keys stored transposed, (D, capacity), make the product cheaper but the store
      scatters one number per cache line, which costs more in a real plan than the product saves.) Flat
      (H*rows, ...) views of the buffers are made once per selection, so a step only slices;
    - the weights are laid out once for `mm`, with 1/sqrt(D) folded into the query projection; biases are added in
      place and the residual rides in `addmm`'s accumulator;
    - a values product too small for ATen's matrix kernel (`_min_read`) reads a few more slots, weighted 0.
    """

    def __init__(self, model: TrajectoryGPT, prefix: torch.Tensor, beams_per_env: int, capacity: int):
        """capacity: slots per beam to allocate up front (each step of X children takes X); grows if short."""
        c = model.config
        E, P = prefix.shape
        H, D = c.n_head, c.n_embd // c.n_head
        self.td, self.n_bins, self.H, self.D = c.transition_dim, c.n_bins, H, D
        self.E, self.position = E, P  # environments, the next token's absolute position

        context = model.new_cache(E, capacity=P)
        logits, _ = model(prefix, cache=context, last_only=True)  # (E, 1, N)
        attended = torch.arange(P, device=prefix.device) % self.td != self.td - 1  # all but value tokens
        self.Pc = Pc = int(attended.sum())  # context tokens that are attended to
        self.context_k = list(context.k[:, :, :, attended].permute(0, 2, 1, 4, 3).reshape(-1, H * E, D, Pc))
        self.context_v = list(context.v[:, :, :, attended].transpose(1, 2).reshape(-1, H * E, Pc, D))
        rows = E * beams_per_env
        shape = (c.n_layer, 2, H, rows, capacity, D)  # keys, values (L, 2, H, E*W, capacity, D)
        self.spare = _buffers.take(shape, context.k)  # buffers of the last plan, if it had the same shape
        self._set_past(_buffers.take(shape, context.k), 0)
        self.no_weight = context.k.new_full((1, 1, _min_read(1, D)), float("-inf"))  # scores of padding slots
        self.n_own, self.children = 0, 1  # tokens each child wrote since its beam was expanded; children per beam
        self.logits = logits[:, 0].repeat_interleave(beams_per_env, dim=0)  # (E*W, N)

        scale = torch.ones(3 * c.n_embd, device=prefix.device, dtype=context.k.dtype)
        scale[:c.n_embd] = D ** -0.5
        self.layers = []
        for block in model.blocks:
            a, m = block.attn, block.mlp
            self.layers.append((_norm_args(block.ln_1), (a.qkv.weight * scale[:, None]).t().contiguous(),
                                a.qkv.bias * scale, a.proj.weight.t().contiguous(), a.proj.bias, _norm_args(block.ln_2),
                                m.up.weight.t().contiguous(), m.up.bias, m.down.weight.t().contiguous(), m.down.bias))
        self.norm_f, self.tok_emb, self.pos_emb = _norm_args(model.ln_f), model.tok_emb.weight, model.pos_emb
        self.head_weight, self.head_bias = model.head_weight, model.head_bias  # (td, C, N), (td, N)

    def _set_past(self, kv: torch.Tensor, n: int) -> None:
        self.past, self.n_past = kv, n  # n: tokens every beam has; its children's follow, interleaved
        self.past_layers = list(kv)  # per layer: (2, H, E*W, capacity, D)
        self.read_k = [k.flatten(0, 1) for k in kv[:, 0]]  # per layer: (H*E*W, capacity, D), the same memory
        self.read_v = [v.flatten(0, 1) for v in kv[:, 1]]

    def _step(self, bins: torch.Tensor) -> torch.Tensor:
        """bins (B,) of the token at `self.position` for every row -> logits (B, N) of the next token."""
        E, H, D, X = self.E, self.H, self.D, self.children
        B = bins.shape[0]
        beams = B // X  # E*W rows of past
        dim = self.position % self.td
        store = dim != self.td - 1  # a value token is neither stored nor attended to, not even by itself
        slot = self.n_past + self.n_own * X  # where this step's X tokens of a beam go
        n = slot + X * store  # past slots this token's scores cover (its siblings' masked out)
        if n > self.past.shape[4]:  # the buffer is full: double it (zeros: new slots may be read as padding)
            self._set_past(torch.cat([self.past, torch.zeros_like(self.past)], dim=4), self.n_past)
            self._mask_siblings()
        n_read = min(max(n, _min_read(X, D)), self.past.shape[4]) if n else 0  # values' slots, padding weighted 0
        mask = self.sibling_mask[:, :n] if X > 1 else None  # (X, n)
        Pc = self.Pc
        table = self.tok_emb[dim * self.n_bins:(dim + 1) * self.n_bins]  # (N, C): this dimension's tokens
        x = F.embedding(bins, table) + self.pos_emb[self.position]  # (B, C)
        for layer, (norm_1, w_qkv, b_qkv, w_proj, b_proj, norm_2, w_up, b_up, w_down, b_down) in enumerate(self.layers):
            h = torch.layer_norm(x, *norm_1)
            qkv = torch.mm(h, w_qkv).add_(b_qkv).view(B, 3, H, D).permute(1, 2, 0, 3)  # (3, H, B, D)
            if store:  # (2, H, E*W, X, D): the X children of a beam side by side
                self.past_layers[layer][:, :, :, slot:n] = qkv[1:].view(2, H, beams, X, D)
            q = qkv[0].contiguous()  # (H, B, D)
            scores = torch.bmm(q.view(H * E, B // E, D), self.context_k[layer]).view(H, B, Pc)
            if n:
                keys = self.read_k[layer][:, :n].transpose(1, 2)  # (H*E*W, D, n)
                past_scores = (torch.bmm(q.view(H * beams, X, D), keys) if mask is None else
                               torch.baddbmm(mask, q.view(H * beams, X, D), keys))  # (H*E*W, X, n)
                pieces = [scores, past_scores.view(H, B, n)]
                if n_read > n:  # padding, read only to dodge ATen's scalar loop: weights exactly 0
                    pieces.append(self.no_weight[:, :, :n_read - n].expand(H, B, n_read - n))
                scores = torch.cat(pieces, dim=-1)
            weights = torch.softmax(scores, dim=-1)  # (H, B, Pc + n_read)
            y = torch.bmm(weights[..., :Pc].view(H * E, B // E, Pc), self.context_v[layer]).view(H, B, D)
            if n:
                y.view(H * beams, X, D).baddbmm_(weights[..., Pc:].view(H * beams, X, n_read),
                                                  self.read_v[layer][:, :n_read])
            x = torch.addmm(x, y.transpose(0, 1).reshape(B, H * D), w_proj).add_(b_proj)
            h = torch.layer_norm(x, *norm_2)
            x = torch.addmm(x, F.gelu(torch.mm(h, w_up).add_(b_up)), w_down).add_(b_down)
        self.position += 1
        if store and X > 1:
            self.n_own += 1
        elif store:
            self.n_past += 1
        x = torch.layer_norm(x, *self.norm_f)
        nxt = self.position % self.td
        return torch.addmm(self.head_bias[nxt], x, self.head_weight[nxt])  # (B, N)

    def feed(self, bins: torch.Tensor) -> torch.Tensor:
        return self._step(bins)

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
            self.spare = _buffers.take((*self.past.shape[:3], keep.numel(), *self.past.shape[4:]), self.past)
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
        """Hand the cache buffers back for the next plan; the decoder cannot be used afterwards."""
        _buffers.give(self.past, self.spare)
        self.past = self.spare = self.past_layers = self.read_k = self.read_v = None


class _BufferPool:
    """Cache buffers kept from one plan to the next (up to `max_bytes`), as a rollout plans again and again with
    the same shapes. A fresh buffer of many MB costs page faults as it is first written (the operating system
    hands out memory a page at a time, zeroed): 9% of a 25-environment plan, 7% of the halfcheetah preset's."""

    def __init__(self, max_bytes: int = 256 * 2**20):
        self.free, self.max_bytes, self.lock = [], max_bytes, threading.Lock()

    def take(self, shape: tuple, like: torch.Tensor) -> torch.Tensor:
        """A buffer of `shape` with like's dtype and device, kept or new. The values' first slots hold finite
        numbers (zeros at first; later, values stored before): padding is weighted 0, and 0 * nan would be nan."""
        with self.lock:
            for i, buffer in enumerate(self.free):
                if (buffer.shape, buffer.dtype, buffer.device) == (shape, like.dtype, like.device) and \
                        buffer.is_inference() == torch.is_inference_mode_enabled():  # (both made in one mode)
                    return self.free.pop(i)
        buffer = like.new_empty(shape)
        buffer[:, 1, ..., :_min_read(1, shape[-1]), :].zero_()
        return buffer

    def give(self, *buffers: torch.Tensor) -> None:
        with self.lock:
            self.free = [*buffers, *self.free]  # the newest first; the oldest go when over budget
            kept = 0
            for i, buffer in enumerate(self.free):
                kept += buffer.numel() * buffer.element_size()
                if kept > self.max_bytes:
                    del self.free[i:]
                    break


_buffers = _BufferPool()


def _min_read(queries: int, head_dim: int) -> int:
    """Slots a values product of `queries` rows reads at least. ATen multiplies matrices of fewer than 400
    multiply-adds in a scalar loop, 3-5x slower than its matrix kernel at 800 matrices; slots past the real ones
    are padding, weighted exactly 0."""
    return 400 // (queries * head_dim) + 1


def _norm_args(norm: torch.nn.LayerNorm) -> tuple:
    """A LayerNorm's arguments, looked up once: `torch.layer_norm(x, *args)` skips the module attribute lookups
    and the Python wrapper, a third of a layer norm's cost at 32 rows."""
    return norm.normalized_shape, norm.weight, norm.bias, norm.eps


class RecomputeDecoder:
    """The naive baseline: every new token runs the model over the whole sequence again."""

    def __init__(self, model: TrajectoryGPT, prefix: torch.Tensor, beams_per_env: int, capacity: int):
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


def logits_along(model: TrajectoryGPT, prefix: torch.Tensor, bins: torch.Tensor, use_cache: bool = True
                 ) -> torch.Tensor:
    """What one decoder computes along given tokens: prefix (E, P), bins (E, n) fed after it -> (E, n, N), the
    logits it gave for each of the n tokens. Fed a plan's own tokens, the cached and the recomputing decoder must
    agree to rounding: "the cache changes nothing" without a search's near-ties in the way."""
    was_training = model.training
    model.eval()
    try:
        with torch.inference_mode():
            Decoder = CachedDecoder if use_cache else RecomputeDecoder
            decoder = Decoder(model, prefix, 1, bins.shape[1])
            logits = [decoder.logits]  # (E, N) for the first token
            logits += [decoder.feed(bins[:, j]) for j in range(bins.shape[1] - 1)]
            decoder.release()
        return torch.stack(logits, dim=1)
    finally:
        model.train(was_training)


def best_children(score: torch.Tensor, n_envs: int, beam_width: int) -> torch.Tensor:
    """score (E*R,), R children per environment in a row -> (E*W,) rows of the best W children of each environment,
    best first, as indices into score. A stable sort: equal scores keep their order, on every device."""
    R = score.shape[0] // n_envs
    order = torch.sort(score.view(n_envs, R), dim=1, descending=True, stable=True).indices[:, :beam_width]  # (E, W)
    return (order + torch.arange(n_envs, device=score.device)[:, None] * R).reshape(-1)


def tokens_fed(obs_dim: int, act_dim: int, horizon: int) -> int:
    """Tokens a plan feeds to the model after the context: actions+reward each step, value+obs between steps."""
    return horizon * (act_dim + 1) + (horizon - 1) * (1 + obs_dim)


def check_fits(model: TrajectoryGPT, context: int, horizon: int) -> None:
    """A context of C transitions plus a horizon of H must fit the model's window: C + H - 1 <= n_transitions."""
    n = model.config.n_transitions
    if context + horizon - 1 > n:
        raise ValueError(f"context ({context}) + horizon ({horizon}) - 1 = {context + horizon - 1} transitions "
                         f"do not fit the model's window of {n} transitions; lower context or horizon")


def beam_plan(model: TrajectoryGPT, tokenizer: TrajectoryTokenizer, prefix: torch.Tensor, keys: torch.Tensor,
              config: PlannerConfig) -> Plan:
    """Plan for E environments at once.

    prefix (E, P): every environment's context as bins, ending with its current observation (all E the same
    length). keys (E,) int64: one random key per environment and decision (e.g. hash of seed and step).
    The model always plans in evaluation mode (no dropout); its mode is restored afterwards.
    """
    was_training = model.training
    model.eval()
    try:
        return _beam_plan(model, tokenizer, prefix, keys, config)
    finally:
        model.train(was_training)


@torch.inference_mode()
def _beam_plan(model, tokenizer, prefix, keys, config) -> Plan:
    config.validate()
    c = model.config
    O, A, td = c.obs_dim, c.act_dim, c.transition_dim
    E, P = prefix.shape
    if (tokenizer.obs_dim, tokenizer.act_dim) != (O, A):
        raise ValueError(f"tokenizer is for obs {tokenizer.obs_dim}/act {tokenizer.act_dim} but the model for "
                         f"obs {O}/act {A}")
    if P % td != O:
        raise ValueError(f"the context must be whole transitions followed by one observation ({O} tokens), "
                         f"got {P} tokens with transition_dim {td}")
    H, W, X = config.horizon, config.beam_width, config.sample_expand
    check_fits(model, P // td + 1, H)
    device = model.pos_emb.device
    prefix, keys = prefix.to(device), keys.to(device=device, dtype=torch.int64)

    Decoder = CachedDecoder if config.use_cache else RecomputeDecoder
    decoder = Decoder(model, prefix, W, tokens_fed(O, A, H) + (X - 1) * (A + 1))  # children's own: X slots each
    logits = decoder.logits  # (E*W, N): W identical beams per environment to start with
    generated = prefix.new_zeros(E * W, 0)  # (rows, n) bins generated so far
    discounted_rewards = logits.new_zeros(E * W)  # sum_k gamma^k E[r_k] so far
    rewards = logits.new_zeros(E * W, H)
    values = logits.new_zeros(E * W, H)
    R = W * X  # rows per environment while sampling (children)
    row_keys = keys.repeat_interleave(R)  # (E*R,) every row's environment key
    rows = torch.arange(E * R, device=device) % R  # (E*R,) every row's index within its environment
    counter = 0

    def append(bins):
        nonlocal generated
        generated = torch.cat([generated, bins[:, None]], dim=1)

    for t in range(H):
        # expand: each beam becomes X children, which share its past in the cache
        decoder.expand(X)
        logits = logits.repeat_interleave(X, dim=0)
        generated, discounted_rewards = generated.repeat_interleave(X, 0), discounted_rewards.repeat_interleave(X, 0)
        rewards, values = rewards.repeat_interleave(X, 0), values.repeat_interleave(X, 0)
        uniforms = counter_uniform(row_keys[:, None], torch.arange(counter, counter + A, device=device), rows[:, None])
        counter += A  # (E*R, A): one uniform number per row and action dimension
        for a in range(A):  # sample the action, one dimension at a time
            bins = sample_bins(logits, uniforms[:, a], config.top_k_action, config.temperature, config.top_p_action)
            append(bins)
            logits = decoder.feed(bins)
        reward_probs = torch.softmax(logits, dim=-1)
        reward_bins = logits.argmax(dim=-1)
        append(reward_bins)
        logits = decoder.feed(reward_bins)
        value_probs = torch.softmax(logits, dim=-1)
        value_bins = logits.argmax(dim=-1)
        rewards[:, t] = tokenizer.expectation(reward_probs, tokenizer.reward_dim)
        values[:, t] = tokenizer.expectation(value_probs, tokenizer.value_dim)
        discounted_rewards = discounted_rewards + config.gamma**t * rewards[:, t]
        score = discounted_rewards + config.value_weight * config.gamma ** (t + 1) * values[:, t]  # (E*R,)

        keep = best_children(score, E, W)  # (E*W,) select: the best W children of every environment
        if t < H - 1:  # after the last step's selection no token is fed: the cache need not follow
            decoder.select(keep)
        generated, discounted_rewards = generated[keep], discounted_rewards[keep]
        rewards, values, score, value_bins = rewards[keep], values[keep], score[keep], value_bins[keep]
        append(value_bins)
        if t == H - 1:
            break
        logits = decoder.feed(value_bins)  # the value token goes in now, for the W survivors only
        for _ in range(O):  # the most likely next observation
            bins = logits.argmax(dim=-1)
            append(bins)
            logits = decoder.feed(bins)

    decoder.release()
    best = score.view(E, W).argmax(dim=1) + torch.arange(E, device=device) * W  # (E,)
    return _decode_plan(tokenizer, generated[best], rewards[best], values[best], score[best], H)


def _decode_plan(tokenizer, bins, rewards, values, score, horizon) -> Plan:
    """Cut the generated bins (E, n) of the best plans into actions and observations and decode them."""
    O, A = tokenizer.obs_dim, tokenizer.act_dim
    E = bins.shape[0]
    step = A + 2 + O  # generated tokens per step: action, reward, value, next observation
    padded = torch.cat([bins, bins.new_zeros(E, step * horizon - bins.shape[1])], dim=1)
    per_step = padded.view(E, horizon, step).cpu().numpy()  # (E, H, step)
    actions = tokenizer.decode(per_step[:, :, :A], dims=slice(O, O + A))  # (E, H, A)
    observations = tokenizer.decode(per_step[:, :-1, A + 2:], dims=slice(0, O))  # (E, H-1, O)
    return Plan(actions=torch.as_tensor(actions, dtype=torch.float32),
                observations=torch.as_tensor(observations, dtype=torch.float32),
                rewards=rewards.float().cpu(), values=values.float().cpu(), score=score.float().cpu(),
                bins=bins.cpu())
