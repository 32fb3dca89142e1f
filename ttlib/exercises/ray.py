"""Notebook 08's exercises: the episodes' split over workers, and the central planner's merge and split.

Both are plain bookkeeping that runs in the driver or in the Planner actor: checking them needs neither Ray nor a
cluster (nothing here imports Ray or starts one).
"""

from __future__ import annotations

import numpy as np
import torch

from .. import distributed as ttlib_distributed
from . import Exercise, Mistake


def kind(value) -> str:
    """What a value is, for outputs that compare types: "torch.Tensor of torch.int64", "list of list", ..."""
    if isinstance(value, torch.Tensor):
        return f"torch.Tensor of {value.dtype}"
    if isinstance(value, np.ndarray):
        return f"numpy.ndarray of {value.dtype}"
    if isinstance(value, (list, tuple)) and len(value):
        return f"{type(value).__name__} of {type(value[0]).__name__}"
    return type(value).__name__


# ---- exercise 1: slices of episodes --------------------------------------------------------------------------------
def split_trial(rng):
    """(episodes, workers) pairs: fewer episodes than workers (none, now and then), a multiple, a remainder, many."""
    workers = [int(k) for k in rng.integers(2, 9, size=4)]
    fewer = int(rng.integers(0, workers[0])) if rng.random() < 0.8 else 0
    multiple = workers[1] * int(rng.integers(1, 4))
    remainder = workers[2] * int(rng.integers(1, 4)) + int(rng.integers(1, workers[2]))
    many = int(rng.integers(30, 200))
    return [(fewer, workers[0]), (multiple, workers[1]), (remainder, workers[2]), (many, workers[3]),
            (int(rng.integers(1, 10)), 1)]


def _as_lists(slices) -> str:
    """The slices as a short string of plain lists, or what they are when they are not a list of lists."""
    try:
        return str([[int(p) for p in s] for s in slices])
    except (TypeError, ValueError):
        return f"not a list of lists of positions: {' '.join(repr(slices).split())[:200]}"


def run_split(answer, trial):
    outputs = {}
    for n_episodes, n_workers in trial:
        slices = answer.split_episodes(n_episodes, n_workers)
        outputs[f"split_episodes({n_episodes}, {n_workers})"] = _as_lists(slices)
        outputs[f"what split_episodes({n_episodes}, {n_workers}) returns"] = kind(slices)
    return outputs


def _split_with(sizes=None, idle=False):
    """Contiguous slices of the given sizes (default: the extra episodes first); `idle` keeps empty slices."""

    def split_episodes(n_episodes, n_workers):
        n_slices = n_workers if idle else min(n_workers, n_episodes)
        if n_slices == 0:
            return []
        slices, start = [], 0
        for size in (sizes or _extra_first)(n_episodes, n_slices):
            slices.append(list(range(start, start + size)))
            start += size
        return slices

    return {"split_episodes": split_episodes}


def _extra_first(n, k):
    return [n // k + (1 if i < n % k else 0) for i in range(k)]


def _extra_last(n, k):
    return [n // k + (1 if i >= k - n % k else 0) for i in range(k)]


def _round_robin(n_episodes, n_workers):
    n_slices = min(n_workers, n_episodes)
    return [list(range(i, n_episodes, n_slices)) for i in range(n_slices)]


def _arrays_of_positions(n_episodes, n_workers):
    return [np.asarray(s) for s in ttlib_distributed.slices(n_episodes, n_workers)]


def _array_split(n_episodes, n_workers):
    return [list(s) for s in np.array_split(np.arange(n_episodes), min(n_workers, n_episodes))]


episode_split = Exercise(
    id="08-split", number=1, what="your split_episodes", names=("split_episodes",), trial=split_trial, run=run_split,
    reference={"split_episodes": ttlib_distributed.slices}, forbid=(ttlib_distributed.slices,), trials=6,
    hidden_trials=12, passed="your slices are the ones the evaluator hands out.",
    mistakes=[
        Mistake("the extra episodes go to the last slices: the first n_episodes % n_workers slices get one more "
                "(`1 if i < n_episodes % n_slices else 0`).", _split_with(sizes=_extra_last)),
        Mistake("workers without an episode get an empty slice: never return one -- with fewer episodes than "
                "workers, make one slice per episode (`min(n_workers, n_episodes)` slices).", _split_with(idle=True)),
        Mistake("these slices deal the episodes round robin (0, k, 2k, ...): each worker gets a *contiguous* run of "
                "positions, the first slice 0, 1, 2, ..., the next one where it ends.",
                {"split_episodes": _round_robin}),
        Mistake("the slices are NumPy arrays: return plain lists of positions (`list(range(start, start + size))` "
                "or `list(s)`), which compare with == as the driver's do.", {"split_episodes": _arrays_of_positions}),
        Mistake("np.array_split with 0 sections raises: with no episodes there is nothing to split, so return [] "
                "before splitting.", {"split_episodes": _array_split}),
    ],
)


# ---- exercise 2: merge and split ------------------------------------------------------------------------------------
def merge_trial(rng):
    """(one {"prefix", "keys"} dict per worker, the merged batch's actions): small bins, keys up to 2**62."""
    width, act_dim = int(rng.integers(1, 30)), int(rng.integers(1, 4))
    counts = [int(n) for n in rng.integers(1, 6, size=int(rng.integers(1, 5)))]
    observations = [{"prefix": rng.integers(0, 100, size=(n, width)), "keys": rng.integers(0, 2**62, size=n)}
                    for n in counts]
    return observations, rng.normal(size=(sum(counts), act_dim)), counts


def run_merge(answer, trial):
    observations, actions, counts = trial
    given = [{name: array.copy() for name, array in o.items()} for o in observations]
    prefix, keys, merged_counts = answer.merge_contexts(given)
    workers = f"{len(observations)} workers with {counts} environments"
    outputs = {f"merge_contexts({workers}): the prefix": prefix, "what the merged prefix is": kind(prefix),
               f"merge_contexts({workers}): the keys": keys, "what the merged keys are": kind(keys),
               f"merge_contexts({workers}): the counts": np.asarray(merged_counts)}
    parts = answer.split_actions(actions.copy(), list(counts))
    outputs[f"split_actions(actions of shape {actions.shape}, counts {counts}): how many parts"] = len(parts)
    for worker, part in enumerate(parts[:len(counts)]):
        outputs[f"split_actions(actions of shape {actions.shape}, counts {counts}): worker {worker}'s part"] = part
    return outputs


def ttlib_merge(observations):
    return ttlib_distributed.merge_observations(observations)


def ttlib_split(actions, counts):
    return ttlib_distributed.split_actions(actions, counts)


def _merge_with(order=lambda observations: observations, keys_order=None, count=lambda o: len(o["keys"]),
                keys_dtype=torch.int64):
    def merge_contexts(observations):
        prefix = torch.as_tensor(np.concatenate([o["prefix"] for o in order(observations)]), dtype=torch.long)
        keys = torch.as_tensor(np.concatenate([o["keys"] for o in (keys_order or order)(observations)]),
                               dtype=keys_dtype)
        return prefix, keys, [count(o) for o in observations]

    return {"merge_contexts": merge_contexts}


def _split_from_start(actions, counts):
    return [np.asarray(actions)[0:n] for n in counts]


def _split_evenly(actions, counts):
    return np.array_split(np.asarray(actions), len(counts))


central_batch = Exercise(
    id="08-merge", number=2, what="your merge_contexts or split_actions", names=("merge_contexts", "split_actions"),
    trial=merge_trial, run=run_merge, reference={"merge_contexts": ttlib_merge, "split_actions": ttlib_split},
    forbid=(ttlib_distributed.merge_observations, ttlib_distributed.split_actions), trials=10, hidden_trials=20,
    atol=0.0, passed="your planner would batch and answer exactly like ttlib's.",
    mistakes=[
        Mistake("the workers' rows are merged in reverse order: keep worker order, worker 0's environments first, "
                "so that the batch is the one the single process plans.",
                _merge_with(order=lambda observations: observations[::-1])),
        Mistake("the prefixes are merged in reverse order of the workers (and no longer line up with the keys): "
                "keep worker order, worker 0's environments first, for the prefix and the keys alike.",
                _merge_with(order=lambda observations: observations[::-1], keys_order=lambda same: same)),
        Mistake("the counts are the contexts' length (prefix.shape[1]), not the number of environments: a worker's "
                "count is its number of rows, len(o[\"keys\"]).", _merge_with(count=lambda o: o["prefix"].shape[1])),
        Mistake("the keys are cast to 32 bits, which cuts the random keys: keep them torch.int64.",
                _merge_with(keys_dtype=torch.int32)),
        Mistake("every worker gets the first rows of the batch: move a running start past each worker's rows "
                "(actions[start:start + n], then start += n).", {"split_actions": _split_from_start}),
        Mistake("the actions are cut into equal parts: cut them by the counts, n_i rows for worker i, in worker "
                "order.", {"split_actions": _split_evenly}),
    ],
)

EXERCISES = [episode_split, central_batch]
