"""Notebook 01's exercises: scaled dot-product attention, the Trajectory Transformer's mask, multi-head attention.

Each exercise compares the learner's answer with ttlib's (or PyTorch's) on random trials; the mistakes are the
wrong answers learners write most, each with the sentence that tells them what went wrong.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from ttlib.exercises import Exercise, Mistake
from ttlib.model import attention as ttlib_attention
from ttlib.model import gpt as ttlib_model

__all__ = ["ATTENTION_OPS", "EXERCISES", "TORCH_ATTENTION", "heads_trial", "lent_sdpa", "mask", "mask_trial",
           "merge_heads", "merge_unmoved", "multi_head", "run_heads", "run_mask", "run_sdpa", "sdpa", "sdpa_trial",
           "split_heads", "split_plain_view", "torch_sdpa", "ttlib_multi_head_attention"]


# PyTorch's attention under every name it has: the function, the module, and the ATen operators behind them
ATTENTION_OPS = tuple(getattr(torch.ops.aten, name) for name in (
    "scaled_dot_product_attention", "_scaled_dot_product_attention_math", "_scaled_dot_product_flash_attention",
    "_scaled_dot_product_flash_attention_for_cpu", "_scaled_dot_product_efficient_attention",
    "_scaled_dot_product_cudnn_attention", "_native_multi_head_attention") if hasattr(torch.ops.aten, name))
TORCH_ATTENTION = (F.scaled_dot_product_attention, torch.nn.MultiheadAttention, F.multi_head_attention_forward,
                   torch._native_multi_head_attention, *ATTENTION_OPS)


# ---- exercise 1: scaled dot-product attention ------------------------------------------------------------------
def sdpa_trial(rng):
    """q, k, v of random sizes and a random mask in which every query sees at least one key; now and then no mask,
    or the causal mask of a long sequence."""
    kind = rng.choice(["mask", "mask", "none", "long"], p=[0.4, 0.3, 0.15, 0.15])
    if kind == "long":  # a long causal sequence: the size attention is used at
        q, k, v = (torch.randn(2, 4, 50, 32) for _ in range(3))
        return q, k, v, torch.tril(torch.ones(50, 50, dtype=torch.bool))
    B, H, T, S, D = (int(n) for n in rng.integers(1, 6, size=5))
    S = max(S, T)
    q, k, v = torch.randn(B, H, T, D), torch.randn(B, H, S, D), torch.randn(B, H, S, D)
    if kind == "none":
        return q, k, v, None
    mask = torch.rand(T, S) < 0.6
    mask[:, 0] = True  # every query sees at least one key
    return q, k, v, mask


def run_sdpa(answer, trial):
    q, k, v, mask = trial
    return {"attention output": answer.scaled_dot_product_attention(q, k, v, mask)}


def torch_sdpa(q, k, v, mask=None):
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


def _attention_with(scale=None, softmax_dim=-1, keep_where_mask=True, mask_after_softmax=False):
    """A wrong attention: `scale` None for 1/sqrt(d), softmax over `softmax_dim`, the mask read either way."""

    def attention(q, k, v, mask=None):
        d = q.shape[-1]
        scores = q @ k.transpose(-2, -1) * (1 / math.sqrt(d) if scale is None else scale(d))
        hidden = None if mask is None else (~mask if keep_where_mask else mask)
        if hidden is not None and not mask_after_softmax:
            scores = scores.masked_fill(hidden, float("-inf"))
        weights = torch.softmax(scores, dim=softmax_dim)
        if hidden is not None and mask_after_softmax:
            weights = weights.masked_fill(hidden, 0.0)
        return weights @ v

    return attention


sdpa = Exercise(
    id="01-sdpa", number=1, what="your scaled_dot_product_attention", names=("scaled_dot_product_attention",),
    trial=sdpa_trial, run=run_sdpa, reference={"scaled_dot_product_attention": torch_sdpa},
    forbid=(ttlib_attention.explicit_attention, ttlib_attention.fast_attention, torch_sdpa, _attention_with(),
            *TORCH_ATTENTION),
    trials=10, hidden_trials=12, passed="your attention matches PyTorch's.",
    mistakes=[
        Mistake("this is attention without the 1/sqrt(d) scaling: divide the scores q @ k^T by sqrt(d) "
                "(`math.sqrt(q.shape[-1])`) before the softmax, or large d saturates it.",
                {"scaled_dot_product_attention": _attention_with(scale=lambda d: 1.0)}),
        Mistake("the scores are divided by d, not by sqrt(d): the scaling is 1/sqrt(d), which keeps the scores' "
                "spread near 1 whatever the head size.",
                {"scaled_dot_product_attention": _attention_with(scale=lambda d: 1 / d)}),
        Mistake("the softmax runs over the queries (dim=-2): each query's weights over the keys must sum to 1, so "
                "take the softmax over the last axis, the keys (dim=-1).",
                {"scaled_dot_product_attention": _attention_with(softmax_dim=-2)}),
        Mistake("the mask is read the wrong way round: True means *may attend*, so fill -inf where the mask is "
                "False (`scores.masked_fill(~mask, float('-inf'))`).",
                {"scaled_dot_product_attention": _attention_with(keep_where_mask=False)}),
        Mistake("the mask is applied after the softmax: zeroing weights afterwards leaves rows that no longer sum "
                "to 1. Fill the hidden scores with -inf *before* the softmax.",
                {"scaled_dot_product_attention": _attention_with(mask_after_softmax=True)}),
    ],
)


# ---- exercise 2: the causal mask and the value rule --------------------------------------------------------------
def mask_trial(rng):
    transition_dim = int(rng.integers(2, 26))
    return int(rng.integers(1, 4 * transition_dim + 2)), transition_dim


def run_mask(answer, trial):
    n_tokens, transition_dim = trial
    mask = answer.trajectory_mask(n_tokens, transition_dim)
    return {"the mask's dtype": str(getattr(mask, "dtype", type(mask).__name__)).replace("torch.", ""),
            f"trajectory_mask({n_tokens}, {transition_dim})": mask}


def _mask_with(value_offset=1, causal=True, on_queries=False, diagonal=0, value_rule=True):
    def trajectory_mask(n_tokens, transition_dim):
        is_value = torch.arange(n_tokens) % transition_dim == transition_dim - value_offset
        allowed = torch.ones(n_tokens, n_tokens, dtype=torch.bool)
        if causal:
            allowed = torch.tril(allowed, diagonal=diagonal)
        if value_rule:
            allowed = allowed & (~is_value[:, None] if on_queries else ~is_value[None, :])
        return allowed

    return trajectory_mask


mask = Exercise(
    id="01-mask", number=2, what="your trajectory_mask", names=("trajectory_mask",), trial=mask_trial,
    run=run_mask, reference={"trajectory_mask": ttlib_model.trajectory_mask}, forbid=(ttlib_model.trajectory_mask,),
    trials=8, hidden_trials=12, passed="your mask is ttlib's.",
    mistakes=[
        Mistake("the value rule is off by one: it hides the reward token. The value is the *last* token of each "
                "transition: j % transition_dim == transition_dim - 1.",
                {"trajectory_mask": _mask_with(value_offset=2)}),
        Mistake("the causal rule is missing: query i may only see keys j <= i (`torch.tril`), or it could read the "
                "very token it has to predict.", {"trajectory_mask": _mask_with(causal=False)}),
        Mistake("the value rule hides value *queries* (rows) instead of value *keys* (columns): no token may look "
                "at a value token, but a value token may look at the tokens before it.",
                {"trajectory_mask": _mask_with(on_queries=True)}),
        Mistake("a token may not see itself: the causal mask keeps the diagonal (`torch.tril` with diagonal 0), "
                "since a token's own key carries what it is.", {"trajectory_mask": _mask_with(diagonal=-1)}),
        Mistake("the value rule is missing: every value-token column must be False, because a value summarises "
                "rewards that come later.", {"trajectory_mask": _mask_with(value_rule=False)}),
    ],
)


# ---- exercise 3: heads ---------------------------------------------------------------------------------------------
def split_heads(x, n_head):
    B, T, C = x.shape
    return x.view(B, T, n_head, C // n_head).transpose(1, 2)  # (B, H, T, D)


def merge_heads(y):
    B, H, T, D = y.shape
    return y.transpose(1, 2).reshape(B, T, H * D)  # (B, T, C)


def ttlib_multi_head_attention(x, qkv, proj, n_head, mask):
    """ttlib's CausalSelfAttention holding `qkv` and `proj`."""
    layer = ttlib_attention.CausalSelfAttention(x.shape[-1], n_head).eval()
    layer.qkv, layer.proj = qkv, proj
    return layer(x, mask)


def lent_sdpa(q, k, v, mask=None):  # exercise 1's attention, ttlib's, for exercise 3 to build on
    allowed = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool) if mask is None else mask
    return ttlib_attention.explicit_attention(q, k, v, allowed)


def heads_trial(rng):
    H = int(rng.integers(1, 5))
    C, B, T = H * int(rng.integers(1, 9)), int(rng.integers(1, 4)), int(rng.integers(1, 30))
    qkv, proj = torch.nn.Linear(C, 3 * C), torch.nn.Linear(C, C)
    return torch.randn(B, T, C), qkv, proj, H, ttlib_model.trajectory_mask(T, int(rng.integers(4, 7)))


def run_heads(answer, trial):
    x, qkv, proj, H, mask = trial
    B, T, C = x.shape
    heads = x.view(B, T, H, C // H).transpose(1, 2)  # (B, H, T, D): merge_heads' input, the right split
    with torch.no_grad():
        split = answer.split_heads(x, H)
        return {f"split_heads(x of shape {tuple(x.shape)}, {H} heads)": split,
                "merge_heads(split_heads(x))": answer.merge_heads(heads),
                "multi_head_attention(x, qkv, proj, n_head, mask)":
                    answer.multi_head_attention(x, qkv, proj, H, mask)}


def _heads_with(split=split_heads, merge=merge_heads, project=True, order=(0, 1, 2)):
    def multi_head_attention(x, qkv, proj, n_head, mask):
        parts = qkv(x).split(x.shape[-1], dim=-1)
        q, k, v = (parts[i] for i in order)
        y = merge(lent_sdpa(split(q, n_head), split(k, n_head), split(v, n_head), mask))
        return proj(y) if project else y

    return {"split_heads": split, "merge_heads": merge, "multi_head_attention": multi_head_attention}


def merge_unmoved(y):
    """A named mistake (kv_cache's too): (B, H, T, D) reshaped to (B, T, C) without the transpose(1, 2) first."""
    B, H, T, D = y.shape
    return y.reshape(B, T, H * D)


def split_plain_view(x, n_head):
    """A named mistake (kv_cache's too): (B, T, C) viewed as (B, H, T, D) at once, without the transpose."""
    B, T, C = x.shape
    return x.view(B, n_head, T, C // n_head)


multi_head = Exercise(
    id="01-multi-head", number=3, what="your multi-head attention",
    names=("split_heads", "merge_heads", "multi_head_attention"), trial=heads_trial, run=run_heads,
    reference={"split_heads": split_heads, "merge_heads": merge_heads,
               "multi_head_attention": ttlib_multi_head_attention},
    lends={"scaled_dot_product_attention": lent_sdpa},
    forbid=(ttlib_attention.CausalSelfAttention, split_heads, merge_heads, ttlib_multi_head_attention,
            *TORCH_ATTENTION),
    trials=8, hidden_trials=10, passed="your multi-head attention is ttlib's CausalSelfAttention.",
    mistakes=[
        Mistake("the heads are merged without moving the head axis back: transpose (B, H, T, D) to (B, T, H, D) "
                "first, then reshape to (B, T, C), so each token gets its own heads side by side.",
                _heads_with(merge=merge_unmoved)),
        Mistake("the heads are split by a plain view to (B, H, T, D): that interleaves tokens and channels. View as "
                "(B, T, H, D) -- channels h*D ... (h+1)*D - 1 are head h -- then transpose(1, 2).",
                _heads_with(split=split_plain_view)),
        Mistake("the output projection is missing: after merging the heads, `proj` mixes them.",
                _heads_with(project=False)),
        Mistake("query, key and value are taken in the wrong order: `qkv(x).split(C, dim=-1)` gives query, key, "
                "value, in that order.", _heads_with(order=(1, 0, 2))),
    ],
)

EXERCISES = [sdpa, mask, multi_head]
