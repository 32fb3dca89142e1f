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

    Three levels of keys and values per layer, each stored once and shared by everything below it:
      context  Pc tokens per environment (E)   its context, computed once and shared by all of its rows
      past     n tokens per beam (E*W)         what the beam generated since the context, shared by its children
      own      m tokens per child (E*W*X)      what the child generated since its beam was expanded (a few)
    Expanding a beam copies nothing: its X children read the beam's past in place. Selecting the new beams copies
    each survivor's past and own tokens into the new past, once: into a spare buffer, and the two swap at every
    selection (fresh multi-MB buffers would cost more than the copy: the operating system hands out new memory a
    page at a time). Value tokens are never attended to (the value rule), so their keys and values are never
    stored: the decoder needs no attention mask at all, and the result is exactly what the masked model computes.

    At beam-search sizes (32-64 rows) the cost of launching a PyTorch operation rivals its arithmetic, so `_step`,
    the model's forward pass for one new token per row, is written for as few operations as possible:
    - heads come first, so the queries of one environment, or of one beam's children, are a contiguous block of
      rows: every level's scores come out as (H, B, keys), and attention is a few plain `torch.bmm` calls;
    - keys are stored transposed, (D, n), so those products need no transposed operand (about twice as fast on a
      CPU at these tiny sizes); each level keeps a flat (H*rows, ...) view of its buffers, so a step only slices;
    - the weights are laid out once for `mm`, with 1/sqrt(D) folded into the query projection; biases are added in
      place and the residual rides in `addmm`'s accumulator.
    """

    def __init__(self, model: TrajectoryGPT, prefix: torch.Tensor, beams_per_env: int, new_tokens: int):
        c = model.config
        E, P = prefix.shape
        H, D = c.n_head, c.n_embd // c.n_head
        self.model, self.td, self.n_bins, self.H, self.D = model, c.transition_dim, c.n_bins, H, D
        self.E, self.position = E, P  # environments, the next token's absolute position

        context = model.new_cache(E, capacity=P)
        logits, _ = model(prefix, cache=context, last_only=True)  # (E, 1, N)
        attended = torch.arange(P, device=prefix.device) % self.td != self.td - 1  # all but value tokens
        self.Pc = Pc = int(attended.sum())  # context tokens that are attended to
        self.context_k = list(context.k[:, :, :, attended].permute(0, 2, 1, 4, 3).reshape(-1, H * E, D, Pc))
        self.context_v = list(context.v[:, :, :, attended].transpose(1, 2).reshape(-1, H * E, Pc, D))
        rows = E * beams_per_env
        self.spare_k = context.k.new_empty(c.n_layer, H, rows, D, new_tokens)  # keys (L, H, E*W, D, capacity)
        self.spare_v = context.k.new_empty(c.n_layer, H, rows, new_tokens, D)  # values (L, H, E*W, capacity, D)
        self._set_past(torch.empty_like(self.spare_k), torch.empty_like(self.spare_v), 0)
        self.own_k = self.own_v = None  # the children's own tokens while expanded: keys (L, H, E*W*X, D, capacity),
        # values (L, H, E*W*X, capacity, D)
        self.n_own, self.children = 0, 1
        self.spare_own = None  # the children's buffers, kept for the next expansion
        self.logits = logits[:, 0].repeat_interleave(beams_per_env, dim=0)  # (E*W, N)

        scale = torch.ones(3 * c.n_embd, device=prefix.device, dtype=context.k.dtype)
        scale[:c.n_embd] = D ** -0.5
        self.layers = []
        for block in model.blocks:
            a, m = block.attn, block.mlp
            self.layers.append((block.ln_1, (a.qkv.weight * scale[:, None]).t().contiguous(), a.qkv.bias * scale,
                                a.proj.weight.t().contiguous(), a.proj.bias, block.ln_2,
                                m.up.weight.t().contiguous(), m.up.bias, m.down.weight.t().contiguous(), m.down.bias))

    def _set_past(self, keys: torch.Tensor, values: torch.Tensor, n: int) -> None:
        self.past_k, self.past_v, self.n_past = keys, values, n
        self.layer_k, self.layer_v = list(keys), list(values)  # per layer: (H, E*W, D, capacity), (H, E*W, capacity, D)
        self.read_k = [k.flatten(0, 1) for k in keys]  # per layer: (H*E*W, D, capacity), the same memory
        self.read_v = [v.flatten(0, 1) for v in values]  # per layer: (H*E*W, capacity, D)

    def _set_own(self, keys: torch.Tensor, values: torch.Tensor) -> None:
        self.own_k, self.own_v = keys, values
        self.own_read_k = [k.flatten(0, 1) for k in keys]  # per layer: (H*E*W*X, D, capacity)
        self.own_read_v = [v.flatten(0, 1) for v in values]  # per layer: (H*E*W*X, capacity, D)

    def _step(self, bins: torch.Tensor) -> torch.Tensor:
        """bins (B,) of the token at `self.position` for every row -> logits (B, N) of the next token."""
        model, E, H, D, X = self.model, self.E, self.H, self.D, self.children
        B = bins.shape[0]
        beams = B // X  # E*W rows of past
        dim = self.position % self.td
        store = dim != self.td - 1  # a value token is neither stored nor attended to, not even by itself
        if X > 1 and store and self.n_own == self.own_v.shape[3]:  # the children's buffers are full: double them
            self._set_own(torch.cat([self.own_k, torch.empty_like(self.own_k)], dim=4),
                          torch.cat([self.own_v, torch.empty_like(self.own_v)], dim=3))
        # the new token goes to the children's own tokens while expanded, else straight into the beams' past
        n_past = self.n_past + (store and X == 1)  # past tokens this token attends to
        n_own = self.n_own + store if X > 1 else 0  # own tokens it attends to
        Pc = self.Pc
        x = model.tok_emb.weight[dim * self.n_bins:(dim + 1) * self.n_bins][bins] + model.pos_emb[self.position]
        for layer, (ln_1, w_qkv, b_qkv, w_proj, b_proj, ln_2, w_up, b_up, w_down, b_down) in enumerate(self.layers):
            h = F.layer_norm(x, ln_1.normalized_shape, ln_1.weight, ln_1.bias, ln_1.eps)
            q, k, v = torch.mm(h, w_qkv).add_(b_qkv).view(B, 3, H, D).permute(1, 2, 0, 3)  # each (H, B, D)
            if store and X > 1:
                self.own_k[layer, ..., self.n_own] = k
                self.own_v[layer, :, :, self.n_own] = v
            elif store:
                self.layer_k[layer][..., self.n_past] = k
                self.layer_v[layer][:, :, self.n_past] = v
            q = q.contiguous()
            scores = [torch.bmm(q.view(H * E, B // E, D), self.context_k[layer]).view(H, B, Pc)]
            if n_past:
                scores.append(torch.bmm(q.view(H * beams, X, D), self.read_k[layer][..., :n_past]).view(H, B, n_past))
            if n_own:
                scores.append(torch.bmm(q.view(H * B, 1, D), self.own_read_k[layer][..., :n_own]).view(H, B, n_own))
            weights = torch.softmax(torch.cat(scores, dim=-1), dim=-1)  # (H, B, Pc + n_past + n_own)
            y = torch.bmm(weights[..., :Pc].view(H * E, B // E, Pc), self.context_v[layer]).view(H, B, D)
            if n_past:
                y += torch.bmm(weights[..., Pc:Pc + n_past].view(H * beams, X, n_past),
                               self.read_v[layer][:, :n_past]).view(H, B, D)
            if n_own:
                y += torch.bmm(weights[..., Pc + n_past:].reshape(H * B, 1, n_own),
                               self.own_read_v[layer][:, :n_own]).view(H, B, D)
            x = torch.addmm(x, y.transpose(0, 1).reshape(B, H * D), w_proj).add_(b_proj)
            h = F.layer_norm(x, ln_2.normalized_shape, ln_2.weight, ln_2.bias, ln_2.eps)
            x = torch.addmm(x, F.gelu(torch.mm(h, w_up).add_(b_up)), w_down).add_(b_down)
        self.position += 1
        if store and X > 1:
            self.n_own += 1
        elif store:
            self.n_past += 1
        x = F.layer_norm(x, model.ln_f.normalized_shape, model.ln_f.weight, model.ln_f.bias, model.ln_f.eps)
        nxt = self.position % self.td
        return torch.addmm(model.head_bias[nxt], x, model.head_weight[nxt])  # (B, N)

    def feed(self, bins: torch.Tensor) -> torch.Tensor:
        return self._step(bins)

    def expand(self, children: int) -> None:
        """Every row gets `children` children, which share its past: nothing is copied."""
        if self.children > 1:  # expanding children again: they become beams first
            self.select(torch.arange(self.own_v.shape[2], device=self.own_v.device))
        L, H, rows, D = *self.past_v.shape[:3], self.D
        self.children, self.n_own = children, 0
        if self.spare_own is None or self.spare_own[1].shape[2] != rows * children:  # room for 8, grows if more come
            self.spare_own = (self.past_v.new_empty(L, H, rows * children, D, 8),  # keys, transposed like the past's
                              self.past_v.new_empty(L, H, rows * children, 8, D))
        self._set_own(*self.spare_own)

    def select(self, keep: torch.Tensor) -> None:
        """keep (E*W,): the rows (children) that become the new beams, with their beam's past and own tokens.
        Rows never change environment: the first W entries of keep are rows of environment 0, and so on."""
        n, m = self.n_past, self.n_own
        parents = keep // self.children
        if self.spare_v.shape[2] != keep.numel():  # a different number of beams: the spare buffers do not fit
            self.spare_k = self.past_k.new_empty(*self.past_k.shape[:2], keep.numel(), *self.past_k.shape[3:])
            self.spare_v = self.past_v.new_empty(*self.past_v.shape[:2], keep.numel(), *self.past_v.shape[3:])
        new_k, new_v = self.spare_k, self.spare_v
        self.spare_k, self.spare_v = self.past_k, self.past_v
        torch.index_select(self.past_k[..., :n], 2, parents, out=new_k[..., :n])
        torch.index_select(self.past_v[..., :n, :], 2, parents, out=new_v[..., :n, :])
        if m:
            torch.index_select(self.own_k[..., :m], 2, keep, out=new_k[..., n:n + m])
            torch.index_select(self.own_v[..., :m, :], 2, keep, out=new_v[..., n:n + m, :])
        self._set_past(new_k, new_v, n + m)
        if self.own_k is not None:  # keep the children's buffers for the next expansion
            self.spare_own, self.own_k, self.own_v = (self.own_k, self.own_v), None, None
        self.n_own, self.children = 0, 1


class RecomputeDecoder:
    """The naive baseline: every new token runs the model over the whole sequence again."""

    def __init__(self, model: TrajectoryGPT, prefix: torch.Tensor, beams_per_env: int, new_tokens: int):
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
    decoder = Decoder(model, prefix, W, tokens_fed(O, A, H))
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
