"""Notebook 03's training exercises: the weighted cross-entropy the Trajectory GPT trains on and the learning-rate
schedule it trains with (exercises 5 and 6; `ttlib.exercises.gpt` holds the model's and lists all six).
"""

from __future__ import annotations

import copy
import math

import torch
import torch.nn.functional as F

from ttlib.exercises import Exercise, Mistake
from ttlib.model.gpt import TrajectoryGPT
from ttlib.training import train as ttlib_train

__all__ = ["EXERCISES", "detached", "loss_trial", "lr_schedule", "lr_trial", "run_loss", "run_lr", "training_loss",
           "ttlib_learning_rate", "ttlib_weighted_cross_entropy"]


# ---- ttlib's answers, with the notebook's signatures ---------------------------------------------------------------
def ttlib_weighted_cross_entropy(logits, targets, mask, dim_weight):
    """TrajectoryGPT.forward's loss, on given logits."""
    B, T, K = logits.shape
    ce = F.cross_entropy(logits.reshape(B * T, K), targets.reshape(B * T), reduction="none").view(B, T)
    weight = dim_weight[(torch.arange(T, device=logits.device) + 1) % dim_weight.shape[0]][None, :]  # (1, T)
    return (ce * weight * mask).sum() / mask.sum().clamp(min=1)


def ttlib_learning_rate(step, warmup_steps, total_steps, lr, min_lr):
    config = ttlib_train.TrainConfig(steps=total_steps, warmup_steps=warmup_steps, lr=lr, min_lr=min_lr)
    return ttlib_train.learning_rate(step, config)


# ---- exercise 5: the loss ----------------------------------------------------------------------------------------
def loss_trial(rng):
    """Random logits, targets and padding mask of a window, and loss weights per dimension (actions weighted)."""
    obs, act, n_bins = int(rng.integers(1, 6)), int(rng.integers(1, 3)), int(rng.integers(2, 30))
    td = obs + act + 2
    B, T = int(rng.integers(1, 5)), int(rng.integers(2, 3 * td))
    dim_weight = torch.ones(td)
    dim_weight[obs:obs + act] = float(rng.uniform(1, 6))
    dim_weight[td - 2:] = torch.as_tensor(rng.uniform(0.5, 2, size=2), dtype=torch.float32)
    mask = torch.as_tensor(rng.random((B, T)) < 0.8, dtype=torch.float32)
    mask[0, 0] = 1.0  # at least one real target
    return (torch.randn(B, T, n_bins) * 2, torch.as_tensor(rng.integers(0, n_bins, size=(B, T))), mask, dim_weight)


def run_loss(answer, trial):
    logits, targets, mask, dim_weight = copy.deepcopy(trial)
    zeros = torch.zeros(1, 3, dtype=torch.long)
    small = answer.weighted_cross_entropy(torch.zeros(1, 3, 4), zeros, torch.tensor([[1.0, 1.0, 0.0]]),
                                          torch.tensor([1.0, 5.0, 2.0]))
    padding = answer.weighted_cross_entropy(torch.zeros(1, 3, 4), zeros, torch.zeros(1, 3), torch.ones(3))
    loss = answer.weighted_cross_entropy(logits.requires_grad_(), targets, mask, dim_weight)
    flows = isinstance(loss, torch.Tensor) and loss.grad_fn is not None
    return {"the loss of uniform logits over 4 bins, targets of dimensions 1, 2, 0 (weights 5, 2, 1), the third "
            "padded": detached(small),
            "loss of an all-padding batch (must be 0, not NaN)": detached(padding),
            f"weighted_cross_entropy(logits of shape {tuple(logits.shape)}, targets, mask, dim_weight)":
                detached(loss),
            "your loss is a tensor that gradients flow through (training calls loss.backward())": flows}


def detached(value):
    return value.detach() if isinstance(value, torch.Tensor) else value


def _loss_with(shift=1, masked=True, denominator="real", weighted=True, clamped=True):
    def weighted_cross_entropy(logits, targets, mask, dim_weight):
        B, T, K = logits.shape
        ce = F.cross_entropy(logits.reshape(B * T, K), targets.reshape(B * T), reduction="none").view(B, T)
        weight = dim_weight[(torch.arange(T) + shift) % dim_weight.shape[0]][None, :] if weighted else 1.0
        total = (ce * weight * mask).sum() if masked else (ce * weight).sum()
        count = {"real": mask.sum(), "weights": (weight * mask).sum(), "all": torch.tensor(float(B * T))}[denominator]
        return total / (count.clamp(min=1) if clamped else count)

    return {"weighted_cross_entropy": weighted_cross_entropy}


training_loss = Exercise(
    id="03-loss", number=5, what="your weighted_cross_entropy", names=("weighted_cross_entropy",), trial=loss_trial,
    run=run_loss, reference={"weighted_cross_entropy": ttlib_weighted_cross_entropy},
    forbid=(TrajectoryGPT, ttlib_weighted_cross_entropy, _loss_with()["weighted_cross_entropy"]),
    trials=8, hidden_trials=12, passed="your loss is the one the model trains on.",
    mistakes=[
        Mistake("each target is weighted by the dimension of the token *before* it: target i is the token at "
                "position i + 1, so its weight is dim_weight[(i + 1) % td].", _loss_with(shift=0)),
        Mistake("the loss is divided by the sum of the weights: divide by the number of real targets, mask.sum() "
                "(clamped to at least 1), as ttlib and the original code do.", _loss_with(denominator="weights")),
        Mistake("padding counts in the loss: multiply each target's cross-entropy by the mask before summing.",
                _loss_with(masked=False)),
        Mistake("the loss is divided by every position, padding included: divide by the number of real targets, "
                "mask.sum().", _loss_with(denominator="all")),
        Mistake("an all-padding batch gives 0 / 0 = NaN: clamp the number of real targets to at least 1 "
                "(mask.sum().clamp(min=1)).", _loss_with(clamped=False)),
        Mistake("the loss weights are missing: multiply each target's cross-entropy by the weight of its "
                "dimension, dim_weight[(i + 1) % td].", _loss_with(weighted=False)),
    ],
)


# ---- exercise 6: the learning-rate schedule ------------------------------------------------------------------------
def lr_trial(rng):
    if rng.random() < 0.25:  # the shape of a real run
        return 100, 1800, 6e-4, 6e-5
    total = int(rng.integers(2, 500))
    warmup, lr = int(rng.integers(1, total + 1)), float(rng.uniform(1e-4, 1e-2))
    return warmup, total, lr, lr * float(rng.uniform(0, 0.5))


def _phase(step, warmup, total):
    if step < warmup:
        return "warmup"
    if step == warmup:
        return "the first step after warmup"
    return "the cosine" if step < total else "past total_steps: the cosine is over"


def run_lr(answer, trial):
    warmup, total, lr, min_lr = trial
    steps = sorted({0, warmup - 1, warmup, (warmup + total) // 2, total - 1, total, total + 25})
    return {f"learning_rate at step {s} of warmup {warmup}, total {total} ({_phase(s, warmup, total)})":
            answer.learning_rate(s, warmup, total, lr, min_lr) for s in steps}


def _lr_with(warmup_shift=1, clamp=True, floor=True, from_warmup=True):
    def learning_rate(step, warmup_steps, total_steps, lr, min_lr):
        if step < warmup_steps:
            return lr * (step + warmup_shift) / warmup_steps
        done = (step - warmup_steps) if from_warmup else step
        progress = done / max(1, total_steps - warmup_steps if from_warmup else total_steps)
        progress = min(1.0, progress) if clamp else progress
        low = min_lr if floor else 0.0
        return low + 0.5 * (lr - low) * (1 + math.cos(math.pi * progress))

    return {"learning_rate": learning_rate}


lr_schedule = Exercise(
    id="03-lr", number=6, what="your learning_rate", names=("learning_rate",), trial=lr_trial, run=run_lr,
    reference={"learning_rate": ttlib_learning_rate},
    forbid=(ttlib_train.learning_rate, ttlib_learning_rate, _lr_with()["learning_rate"]), atol=1e-12, rtol=1e-9,
    trials=10, hidden_trials=20, passed="your schedule is ttlib's.",
    mistakes=[
        Mistake("the warmup starts at 0: step 0 already trains, so warm up as lr * (step + 1) / warmup_steps, which "
                "reaches lr at the last warmup step.", _lr_with(warmup_shift=0)),
        Mistake("after total_steps the cosine climbs back up: clamp the progress to 1 (min(1.0, ...)) so that the "
                "rate stays at min_lr.", _lr_with(clamp=False)),
        Mistake("the cosine decays to 0: it goes from lr down to min_lr, min_lr + 0.5 * (lr - min_lr) * "
                "(1 + cos(pi * p)).", _lr_with(floor=False)),
        Mistake("the cosine's progress counts from step 0: it starts when warmup ends, p = (step - warmup_steps) / "
                "(total_steps - warmup_steps).", _lr_with(from_warmup=False)),
    ],
)

EXERCISES = [training_loss, lr_schedule]
