"""Offline RL data: discounted values, the dataset in memory, training windows, and `load` for any dataset id.

Offline RL learns from a fixed log of someone else's episodes. The Trajectory Transformer treats that log as
text: every transition (observation, action, reward, value) becomes a few tokens, and a GPT learns to continue
the sequence. This module holds the log in memory as plain numpy arrays, one array per episode:

    observations[i]  (T_i, obs_dim)   what the agent saw before acting
    actions[i]       (T_i, act_dim)   what it did
    rewards[i]       (T_i,)           what it got for that step
    values[i]        (T_i,)           V_t = sum_{k>=1} gamma^{k-1} r_{t+k}, the discounted reward to come

`load` takes any Minari id: ttlib's own datasets are built on first use (ttlib.data.build), others are read
from Minari's folder or downloaded (ttlib.data.minari_io). Both live in their own modules; `build`, `buildable`,
`list_local` and `list_broken` are importable from here too.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np
from minari.dataset.minari_dataset import parse_dataset_id

from ttlib.data import build as datasets_build
from ttlib.data import minari_io
from ttlib.data.build import build, buildable
from ttlib.data.minari_io import (
    DEFAULT_DATASET,
    HALFCHEETAH_DATASET,
    NO_EXPERT_DATASET,
    DatasetError,
    list_broken,
    list_local,
)

__all__ = ["DEFAULT_DATASET", "DatasetError", "HALFCHEETAH_DATASET", "NO_EXPERT_DATASET", "OfflineDataset", "build",
           "buildable", "discounted_values", "list_broken", "list_local", "load", "make_windows", "split_episodes",
           "subset"]


# --------------------------------------------------------------------------------------------------
# values


def _check_gamma(gamma: float) -> None:
    if not 0.0 < gamma <= 1.0:
        raise DatasetError(f"gamma must be in (0, 1], got {gamma}")


def discounted_values(rewards: np.ndarray, gamma: float) -> np.ndarray:
    """V_t = sum_{k>=1} gamma^{k-1} r_{t+k}  (so V_{T-1} = 0). gamma must be in (0, 1], else DatasetError.

    The value at step t counts the rewards *after* step t only: r_t already has its own token in the
    transition, so the value token carries the rest. The recursion V_t = r_{t+1} + gamma * V_{t+1} runs
    backwards from V_{T-1} = 0. An episode cut off by a time limit is treated as if it ended there; there is
    no bootstrap from a learned critic, because offline we do not have one yet.
    """
    _check_gamma(gamma)
    rewards = np.asarray(rewards, dtype=np.float64)  # (T,)  accumulate in float64, store float32
    values = np.zeros_like(rewards)  # (T,)
    for t in range(len(rewards) - 2, -1, -1):
        values[t] = rewards[t + 1] + gamma * values[t + 1]
    return values.astype(np.float32)


# --------------------------------------------------------------------------------------------------
# the dataset in memory


@dataclass
class OfflineDataset:
    """A whole offline dataset as numpy arrays, one entry per episode in every list."""

    dataset_id: str  # Minari id it was loaded from, e.g. "ttlib/lunarlander/mixed-v0"
    env_id: str | None  # gymnasium id to evaluate in (Minari's eval env spec, else env spec); None if unknown
    env_kwargs: dict  # kwargs for gymnasium.make(env_id, **env_kwargs), e.g. {"continuous": True}; may be {};
    #                   max_episode_steps is among them when the data's time limit is not the registered one
    gamma: float  # discount used for `values`
    observations: list[np.ndarray]  # (T_i, obs_dim) float32; Minari's extra final observation is dropped
    actions: list[np.ndarray]  # (T_i, act_dim) float32
    rewards: list[np.ndarray]  # (T_i,) float32
    terminations: list[np.ndarray]  # (T_i,) bool, True on the step the episode really ended
    truncations: list[np.ndarray]  # (T_i,) bool, True on the step a time limit cut it off
    values: list[np.ndarray]  # (T_i,) float32, discounted_values(rewards, gamma)
    behaviour: list[str] | None  # per-episode policy label ("expert", "noisy", "random"); None if unknown
    ref_min_score: float | None  # mean return of a random policy (normalized score 0); None if unknown
    ref_max_score: float | None  # mean return of an expert policy (normalized score 1); None if unknown
    action_low: list[float] | None = None  # the action space's lower bounds (Minari's action_space); None if unknown
    action_high: list[float] | None = None  # its upper bounds

    @property
    def obs_dim(self) -> int:
        return self.observations[0].shape[1]

    @property
    def act_dim(self) -> int:
        return self.actions[0].shape[1]

    @property
    def n_episodes(self) -> int:
        return len(self.rewards)

    @property
    def n_steps(self) -> int:
        return sum(len(r) for r in self.rewards)

    def returns(self) -> np.ndarray:
        """Undiscounted return of every episode, (n_episodes,) float64."""
        return np.array([r.sum(dtype=np.float64) for r in self.rewards])

    def normalized_score(self, returns) -> np.ndarray:
        """D4RL-style score: 0 = the random policy's mean return, 1 = the expert's (same as minari's)."""
        if self.ref_min_score is None or self.ref_max_score is None:
            raise DatasetError(f"dataset {self.dataset_id} has no reference scores, so no normalized score")
        return (np.asarray(returns) - self.ref_min_score) / (self.ref_max_score - self.ref_min_score)

    def transitions(self) -> dict[str, np.ndarray]:
        """Every step of every episode, concatenated: observations (N, obs), actions (N, act), rewards (N,),
        values (N,)."""
        return {
            "observations": np.concatenate(self.observations),  # (N, obs_dim)
            "actions": np.concatenate(self.actions),  # (N, act_dim)
            "rewards": np.concatenate(self.rewards),  # (N,)
            "values": np.concatenate(self.values),  # (N,)
        }

    def summary(self) -> str:
        """A few lines for humans: size, shapes, returns overall and per behaviour, reference scores."""

        def stats(returns: np.ndarray) -> str:
            return f"mean {returns.mean():8.1f}   min {returns.min():8.1f}   max {returns.max():8.1f}"

        returns = self.returns()
        lines = [
            f"{self.dataset_id}: {self.n_episodes} episodes, {self.n_steps} steps, "
            f"obs_dim {self.obs_dim}, act_dim {self.act_dim}, env {self.env_id}",
            f"  return {'all':>10} (n={self.n_episodes:4d})   {stats(returns)}",
        ]
        if self.behaviour is not None:
            labels = np.array(self.behaviour)
            for label in dict.fromkeys(self.behaviour):  # in order of first appearance
                group = returns[labels == label]
                lines.append(f"  return {label:>10} (n={len(group):4d})   {stats(group)}")
        if self.ref_min_score is not None and self.ref_max_score is not None:
            lines.append(f"  reference scores: min {self.ref_min_score:.1f}, max {self.ref_max_score:.1f}")
        return "\n".join(lines)



# --------------------------------------------------------------------------------------------------
# loading


def load(
    dataset_id: str = DEFAULT_DATASET, gamma: float = 0.99, download: bool = True, progress: bool = True
) -> OfflineDataset:
    """One loader for every id. Ours (DEFAULT_DATASET, NO_EXPERT_DATASET, HALFCHEETAH_DATASET) are built on first
    use when missing (with a tqdm bar), never downloaded. Any other id that exists locally is loaded with
    minari.load_dataset. A remote id such as "mujoco/halfcheetah/medium-v0" is downloaded by Minari when
    download=True.

    A local dataset that is there but broken is never replaced behind your back: load raises a DatasetError
    that says how to rebuild (ours) or to delete the folder (others).
    """
    _check_gamma(gamma)
    try:
        parse_dataset_id(dataset_id)  # "nothing" (no version) raises TypeError inside Minari
    except (ValueError, TypeError):
        raise DatasetError(f"malformed dataset id {dataset_id!r}: expected namespace/name-vN, e.g. "
                           f"{DEFAULT_DATASET!r}; `ttlib datasets` lists the local ones") from None
    path = minari_io.dataset_path(dataset_id)
    if dataset_id in minari_io.OWN_DATASETS:
        if not path.exists():
            build(dataset_id, progress=progress)
    elif not path.exists():
        if dataset_id.startswith("ttlib/"):
            datasets_build.recipe_for(dataset_id)  # raises: an id in our namespace that we cannot build
        if not download:
            raise DatasetError(f"dataset {dataset_id} is not local (at {path}) and download=False")
        minari_io.download(dataset_id)
    episodes = minari_io.read_episodes(dataset_id, path)
    return OfflineDataset(**episodes, gamma=gamma, values=[discounted_values(r, gamma) for r in episodes["rewards"]])


# --------------------------------------------------------------------------------------------------
# held-out episodes


def split_episodes(data: OfflineDataset, val_fraction: float, seed: int):
    """Indices of training and validation episodes (at least one of each when there are two or more)."""
    order = np.random.default_rng(seed).permutation(data.n_episodes)
    n_val = min(max(1, round(val_fraction * data.n_episodes)), data.n_episodes - 1) if data.n_episodes > 1 else 0
    return np.sort(order[n_val:]), np.sort(order[:n_val])


def subset(data: OfflineDataset, episodes) -> OfflineDataset:
    """The same dataset restricted to some episodes."""
    pick = [int(i) for i in episodes]
    per_episode = {f.name: [getattr(data, f.name)[i] for i in pick] for f in dataclasses.fields(data)
                   if f.name in ("observations", "actions", "rewards", "terminations", "truncations", "values")}
    behaviour = [data.behaviour[i] for i in pick] if data.behaviour is not None else None
    return OfflineDataset(**{**{f.name: getattr(data, f.name) for f in dataclasses.fields(data)}, **per_episode,
                                    "behaviour": behaviour})


# --------------------------------------------------------------------------------------------------
# training windows


def make_windows(data: OfflineDataset, length: int, stride: int = 1) -> dict[str, np.ndarray]:
    """Cut every episode into windows of `length` transitions, starting at every `stride`-th step (windows may
    run past the episode end; the tail is zero-padded). Returns observations (N, L, obs), actions (N, L, act),
    rewards (N, L), values (N, L) float32, and mask (N, L) float32: 1 for real steps, 0 for padding.

    Starting a window at every step, even near the end, lets the model see how episodes finish; the mask keeps
    the padding out of the loss.
    """
    if length < 1 or stride < 1:
        raise DatasetError(f"window length and stride must be >= 1, got length={length}, stride={stride}")
    fields = ("observations", "actions", "rewards", "values")
    windows: dict[str, list[np.ndarray]] = {name: [] for name in (*fields, "mask")}
    for i in range(data.n_episodes):
        T = len(data.rewards[i])
        index = np.arange(0, T, stride)[:, None] + np.arange(length)[None, :]  # (n, L) steps in the episode
        real = index < T  # (n, L)
        for name in fields:
            episode = getattr(data, name)[i]  # (T, ...)
            padding = np.zeros((length, *episode.shape[1:]), episode.dtype)  # (L, ...)
            padded = np.concatenate([episode, padding])  # (T+L, ...)
            windows[name].append(padded[index])  # (n, L, ...)
        windows["mask"].append(real.astype(np.float32))
    return {name: np.concatenate(parts).astype(np.float32) for name, parts in windows.items()}
