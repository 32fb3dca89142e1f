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

from .attention import KVCache
from .model import TrajectoryGPT
from .tokenizer import TrajectoryTokenizer


@dataclass
class PlannerConfig:
    beam_width: int = 32  # candidate plans kept per environment after each step
    horizon: int = 5  # transitions imagined ahead
    sample_expand: int = 2  # children sampled from every kept plan at each step
    context: int = 5  # transitions of history the model sees, the current observation's included
    top_k_action: int | None = None  # sample actions among the k likeliest bins only (None: all)
    temperature: float = 1.0  # softmax temperature for action sampling
    gamma: float = 0.99  # discount used to score plans
    use_cache: bool = True  # KV cache (True) or recompute the whole sequence for every token (False)

    def validate(self) -> None:
        for name in ("beam_width", "horizon", "sample_expand", "context"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.top_k_action is not None and self.top_k_action < 1:
            raise ValueError(f"top_k_action must be >= 1 or None, got {self.top_k_action}")
        if self.temperature <= 0:
            raise ValueError(f"temperature must be > 0, got {self.temperature}")
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


def counter_uniform(keys: torch.Tensor, counter: int, rows: torch.Tensor) -> torch.Tensor:
    """Uniform numbers in (0, 1), float64, one per entry of keys/rows, a pure function of (key, counter, row)."""
    h = _pcg_hash(keys & _MASK32)
    h = _pcg_hash(h ^ ((keys >> 32) & _MASK32))
    h = _pcg_hash(h ^ counter)
    h = _pcg_hash(h ^ rows)
    return (h.to(torch.float64) + 0.5) / 2**32


def sample_bins(logits: torch.Tensor, uniform: torch.Tensor, top_k: int | None = None,
                temperature: float = 1.0) -> torch.Tensor:
    """Inverse-CDF sampling: logits (B, N), uniform (B,) -> bins (B,)."""
    logits = logits / temperature
    if top_k is not None and top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[:, -1:]  # (B, 1)
        logits = logits.masked_fill(logits < kth, float("-inf"))
    cdf = torch.softmax(logits, dim=-1).cumsum(dim=-1)  # (B, N)
    threshold = uniform.to(cdf.dtype)[:, None] * cdf[:, -1:]  # (B, 1)
    bins = torch.searchsorted(cdf, threshold, right=True)[:, 0]
    return bins.clamp_(max=logits.shape[-1] - 1)


# ---- decoders: where the next token's logits come from ------------------------------------------------------
class CachedDecoder:
    """Runs the context once, then one token at a time on KV caches that share what rows have in common.

    Three levels: the context (one row per environment), the beams (W rows per environment) and, while a step
    samples actions and reward, the children (X rows per beam). Selecting children copies only their few new
    tokens into the chosen beams; expanding beams into children copies nothing.
    """

    def __init__(self, model: TrajectoryGPT, prefix: torch.Tensor, beams_per_env: int, new_tokens: int):
        E, P = prefix.shape
        context = model.new_cache(E, capacity=P)
        logits, _ = model(prefix, cache=context, last_only=True)  # (E, 1, N)
        self.model = model
        self.beams = KVCache.shared(context, beams_per_env, capacity=new_tokens)
        self.active = self.beams  # where the next token goes: the beams, or their children
        self.logits = logits[:, 0].repeat_interleave(beams_per_env, dim=0)  # (E*W, N)

    def feed(self, bins: torch.Tensor) -> torch.Tensor:
        logits, _ = self.model(bins[:, None], cache=self.active, last_only=True)
        return logits[:, 0]  # (rows, N)

    def expand(self, children: int, capacity: int) -> None:
        self.active = KVCache.shared(self.beams, children, capacity)

    def select(self, keep: torch.Tensor) -> None:
        """keep (E*W,): the children that become the new beams."""
        children = self.active
        self.beams.reorder(keep // (children.batch // self.beams.batch))  # each child's parent beam
        self.beams.extend(children, keep)
        self.active = self.beams


class RecomputeDecoder:
    """The naive baseline: every new token runs the model over the whole sequence again."""

    def __init__(self, model: TrajectoryGPT, prefix: torch.Tensor, beams_per_env: int, new_tokens: int):
        self.model = model
        self.sequence = prefix.repeat_interleave(beams_per_env, dim=0)  # (E*W, P)
        self.logits = model(self.sequence, last_only=True)[0][:, 0]

    def feed(self, bins: torch.Tensor) -> torch.Tensor:
        self.sequence = torch.cat([self.sequence, bins[:, None]], dim=1)
        return self.model(self.sequence, last_only=True)[0][:, 0]

    def expand(self, children: int, capacity: int) -> None:
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


@torch.inference_mode()
def beam_plan(model: TrajectoryGPT, tokenizer: TrajectoryTokenizer, prefix: torch.Tensor, keys: torch.Tensor,
              config: PlannerConfig) -> Plan:
    """Plan for E environments at once.

    prefix (E, P): every environment's context as bins, ending with its current observation (all E the same
    length). keys (E,) int64: one random key per environment and decision (e.g. hash of seed and step).
    """
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
        decoder.expand(X, capacity=A + 1)
        logits = logits.repeat_interleave(X, dim=0)
        generated, discounted_rewards = generated.repeat_interleave(X, 0), discounted_rewards.repeat_interleave(X, 0)
        rewards, values = rewards.repeat_interleave(X, 0), values.repeat_interleave(X, 0)
        for _ in range(A):  # sample the action, one dimension at a time
            bins = sample_bins(logits, counter_uniform(row_keys, counter, rows), config.top_k_action,
                               config.temperature)
            counter += 1
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
        score = discounted_rewards + config.gamma ** (t + 1) * values[:, t]  # (E*R,)

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
