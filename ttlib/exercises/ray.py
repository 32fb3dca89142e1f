"""Notebook 08's exercises: the episodes' split over workers, the central planner's merge and split, and the
piece that makes data-parallel workers' slices of a batch add up to the batch's loss.

The first two are plain bookkeeping that runs in the driver or in the Planner actor; the third is checked on
workers simulated by threads of this process, whose all_reduce sums a tensor over them as torch.distributed's
does. Checking them needs neither Ray nor a cluster nor a process group (nothing here imports Ray or starts one).
"""

from __future__ import annotations

import copy
import threading

import numpy as np
import torch

from ttlib.evaluation import ray_evaluation as ttlib_distributed
from ttlib.exercises import Exercise, Mistake
from ttlib.model.gpt import GPTConfig, TrajectoryGPT
from ttlib.training import data_parallel as ttlib_data_parallel

__all__ = ["EXERCISES", "MEAN_OF_MEANS", "SimulatedWorkers", "central_batch", "episode_split", "kind", "merge_trial",
           "run_merge", "run_shards", "run_split", "shards_trial", "slices_add_up", "split_trial", "ttlib_merge",
           "ttlib_split"]


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

# ---- exercise 3: slices that add up -------------------------------------------------------------------------------
def shards_trial(rng):
    """A tiny Trajectory GPT in float64 and a batch of windows cut into 2-4 slices, whose windows end in padding
    after a random number of real targets -- so the slices hold different counts, now and then none at all."""
    model = TrajectoryGPT(GPTConfig(obs_dim=2, act_dim=1, n_bins=6, n_layer=1, n_head=1, n_embd=8, n_transitions=3,
                                    dropout=0.0)).double()
    workers = int(rng.integers(2, 5))
    sizes = [int(n) for n in rng.integers(1, 4, size=workers)]  # windows per slice
    T = model.config.block_size
    bins = torch.as_tensor(rng.integers(0, 6, size=(sum(sizes), T + 1)))
    real = rng.integers(0, T + 1, size=sum(sizes))  # real targets per window; the rest is padding
    if rng.random() < 0.3:  # a slice of padding only
        real[:sizes[0]] = 0
    real[-1] = max(real[-1], 1)  # the batch has at least one real target
    mask = torch.as_tensor((np.arange(T)[None, :] < real[:, None]).astype(np.float64))  # (B, T)
    return model, bins[:, :-1], bins[:, 1:], mask, sizes


class SimulatedWorkers:
    """`world_size` workers as threads of this process; `all_reduce_of(rank)` sums a tensor over them in place, in
    rank order (every worker gets the same sum), as torch.distributed.all_reduce does over processes."""

    def __init__(self, world_size: int):
        self.barrier = threading.Barrier(world_size, timeout=20)
        self.slots: list = [None] * world_size

    def all_reduce_of(self, rank: int):
        def all_reduce(tensor, *args, **kwargs):
            self.slots[rank] = tensor.detach().clone()
            self.barrier.wait()
            total = self.slots[0].clone()
            for other in self.slots[1:]:
                total += other
            self.barrier.wait()  # every worker has read every slot
            with torch.no_grad():
                tensor.copy_(total)

        return all_reduce

    def run(self, work) -> list:
        """work(rank) in every worker at once -> their results; the first error, raised here (the others stop)."""
        results, errors = [None] * len(self.slots), [None] * len(self.slots)

        def one(rank):
            try:
                results[rank] = work(rank)
            except BaseException as error:  # noqa: BLE001 (handed to the main thread)
                errors[rank] = error
                self.barrier.abort()  # the others stop waiting for this worker

        threads = [threading.Thread(target=one, args=(rank,)) for rank in range(len(self.slots))]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        first = next((e for e in errors if e is not None and not isinstance(e, threading.BrokenBarrierError)),
                     next((e for e in errors if e is not None), None))
        if first is not None:
            raise first
        return results


def run_shards(answer, trial):
    """Every worker computes its slice's loss sum and count (ttlib.training.data_parallel.shard_sums), calls your
    shard_objective and backpropagates what it returns; DDP's average of the workers' gradients is compared."""
    model, inputs, targets, mask, sizes = trial
    workers = SimulatedWorkers(len(sizes))
    slices = [slice(sum(sizes[:r]), sum(sizes[:r + 1])) for r in range(len(sizes))]

    def work(rank):
        replica = copy.deepcopy(model)  # every worker's copy of the same model
        part = slices[rank]
        _, mean_loss = replica(inputs[part], targets[part], mask[part])
        loss_sum, n_real = ttlib_data_parallel.shard_sums(mean_loss, mask[part])
        objective, batch_loss = answer.shard_objective(loss_sum, n_real, len(sizes), workers.all_reduce_of(rank))
        objective.backward()
        return torch.as_tensor(batch_loss).detach(), [p.grad.clone() for p in replica.parameters()]

    results = workers.run(work)
    outputs = {f"the batch's loss on worker {rank} (of {len(sizes)}, slices of {sizes} windows)": loss
               for rank, (loss, _) in enumerate(results)}
    averaged = [torch.stack(grads).mean(dim=0) for grads in zip(*(g for _, g in results), strict=True)]
    outputs["the gradient DDP makes (the workers' gradients averaged), all parameters"] = \
        torch.cat([g.flatten() for g in averaged])
    return outputs


def _mean_of_means(loss_sum, n_real, world_size, all_reduce):
    mean = loss_sum / n_real.clamp(min=1)
    batch_loss = mean.detach().clone()
    all_reduce(batch_loss)
    return mean, batch_loss / world_size


def _shards_with(scale=lambda world_size: world_size, own_count=False, own_loss=False):
    """The right idea with one piece changed: how the objective is scaled, whose count divides, whose loss is
    reported."""
    def shard_objective(loss_sum, n_real, world_size, all_reduce):
        totals = torch.stack([loss_sum.detach(), n_real.to(loss_sum.dtype)])
        all_reduce(totals)
        count = (n_real if own_count else totals[1]).clamp(min=1)
        batch_loss = loss_sum.detach() / n_real.clamp(min=1) if own_loss else totals[0] / totals[1].clamp(min=1)
        return loss_sum * scale(world_size) / count, batch_loss

    return {"shard_objective": shard_objective}


def _without_gradient(loss_sum, n_real, world_size, all_reduce):
    totals = torch.stack([loss_sum.detach(), n_real.to(loss_sum.dtype)])
    all_reduce(totals)
    return totals[0] * world_size / totals[1].clamp(min=1), totals[0] / totals[1].clamp(min=1)


MEAN_OF_MEANS = ("every worker backpropagates the mean loss of its own slice, so DDP's average is the mean of the "
                 "workers' means -- not the batch's loss: a target on a slice with few real targets weighs more "
                 "than one on a full slice. Sum the workers' counts of real targets with all_reduce, and divide "
                 "each worker's loss_sum by that count of the whole batch.")

slices_add_up = Exercise(
    id="08-shards", number=3, what="your shard_objective", names=("shard_objective",), trial=shards_trial,
    run=run_shards, reference={"shard_objective": ttlib_data_parallel.shard_objective},
    forbid=(ttlib_data_parallel.shard_objective,), trials=5, hidden_trials=10, atol=1e-12, rtol=1e-9,
    passed="your workers' slices add up to the whole batch: DDP's average of their gradients is the gradient of "
           "the batch's loss, as one process computes it.",
    mistakes=[
        Mistake(MEAN_OF_MEANS, {"shard_objective": _mean_of_means}),
        Mistake("each worker divides by its own count of real targets, not by the batch's: all_reduce the counts "
                "and divide by their sum (the batch has as many real targets as all the slices together).",
                _shards_with(own_count=True)),
        Mistake("the objective is not multiplied by world_size: DDP averages the workers' gradients (it divides "
                "their sum by world_size), so this step is world_size times too small.",
                _shards_with(scale=lambda world_size: 1)),
        Mistake("the objective is divided by world_size, not multiplied: DDP's average divides by world_size once "
                "more, so this step is world_size**2 times too small.",
                _shards_with(scale=lambda world_size: 1 / world_size)),
        Mistake("the batch's loss you return is this worker's own mean: every worker must return the same loss, "
                "the sum of all the workers' loss sums over the batch's count of real targets.",
                _shards_with(own_loss=True)),
        Mistake("the objective carries no gradient: it is made of the all_reduced copy (detached), so backward has "
                "nothing to follow. Compute it from loss_sum itself; only the count comes from all_reduce.",
                {"shard_objective": _without_gradient}),
    ],
)

EXERCISES = [episode_split, central_batch, slices_add_up]
