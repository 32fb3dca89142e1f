"""The pieces of a beam search that do not depend on the decoder: random numbers, sampling, selection, scores.

`planning.beam_plan` (one token at a time, from Python) and `static_decoder` (the same search with static shapes,
for CUDA graphs) are both built from these, which is why they make the same plan from the same key. The planner's
module re-exports them: `planning.sample_bins` is this `sample_bins`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ttlib.model.tokenizer import TrajectoryTokenizer

__all__ = ["Plan", "best_children", "counter_uniform", "decode_plan", "plan_score", "sample_bins"]


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


def best_children(score: torch.Tensor, n_envs: int, beam_width: int) -> torch.Tensor:
    """score (E*R,), R children per environment in a row -> (E*W,) rows of the best W children of each environment,
    best first, as indices into score. A stable sort: equal scores keep their order, on every device."""
    R = score.shape[0] // n_envs
    order = torch.sort(score.view(n_envs, R), dim=1, descending=True, stable=True).indices[:, :beam_width]  # (E, W)
    return (order + torch.arange(n_envs, device=score.device)[:, None] * R).reshape(-1)


def plan_score(rewards: torch.Tensor, value: torch.Tensor, gamma: float) -> torch.Tensor:
    """The score of finished plans: rewards (B, T) expected, value (B,) expected after the last step -> (B,)
    sum_k gamma^k rewards[:, k] + gamma^T value. `beam_plan` keeps the same sum as it goes, step by step."""
    T = rewards.shape[1]
    discounts = gamma ** torch.arange(T, dtype=rewards.dtype, device=rewards.device)  # (T,)
    return (rewards * discounts).sum(dim=1) + gamma**T * value


def decode_plan(tokenizer: TrajectoryTokenizer, bins: torch.Tensor, rewards: torch.Tensor, values: torch.Tensor,
                score: torch.Tensor, horizon: int) -> Plan:
    """The best plans as a Plan: bins (E, n) generated, rewards and values (E, H) expected, score (E,). Cuts the
    bins into actions and observations and decodes them."""
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
