"""Offline RL data: build the course datasets, load any Minari dataset, cut episodes into training windows.

Offline RL learns from a fixed log of someone else's episodes. The Trajectory Transformer treats that log as
text: every transition (observation, action, reward, value) becomes a few tokens, and a GPT learns to continue
the sequence. This module produces the log, in memory as plain numpy arrays, one array per episode:

    observations[i]  (T_i, obs_dim)   what the agent saw before acting
    actions[i]       (T_i, act_dim)   what it did
    rewards[i]       (T_i,)           what it got for that step
    values[i]        (T_i,)           V_t = sum_{k>=1} gamma^{k-1} r_{t+k}, the discounted reward to come

Datasets are stored in Minari's format and in Minari's folder (MINARI_DATASETS_PATH, default
~/.minari/datasets), so Minari's own tools can read them too. The course dataset is built here, offline,
from LunarLanderContinuous and gymnasium's scripted lander with more or less noise on top. Its quality is
*mixed* on purpose: a planner that models the data well can then beat the data's average. Remote Minari ids
(e.g. "mujoco/halfcheetah/medium-v0") go through the same `load`, downloaded by Minari given internet.

A build writes into a hidden temporary folder next to the final one and renames it into place at the end, so
a crash never leaves a half-written dataset behind under a loadable name.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import shutil
import socket
import uuid
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import gymnasium as gym
import minari
import numpy as np
from minari.data_collector import EpisodeBuffer
from minari.dataset.minari_dataset import parse_dataset_id
from minari.storage import get_dataset_path
from tqdm.auto import tqdm

DEFAULT_DATASET = "ttlib/lunarlander/mixed-v0"  # the course dataset, built locally, offline
HALFCHEETAH_DATASET = "ttlib/halfcheetah/scripted-v0"  # small MuJoCo-shaped dataset (obs 17, act 6), offline

REBUILD_HINT = "rebuild it with `ttlib make-dataset --force` (or ttlib.data.build({id!r}, force=True))"


class DatasetError(ValueError):
    """Every bad input this module detects: one line that says what is wrong and what to do about it."""


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
# behaviour policies for our own datasets
#
# A policy factory gets a behaviour label, the environment and the build's random generator, and returns a
# policy for one episode: obs -> action. Per-episode randomness (noise level, gait) is drawn when it is made.
# Actions are clipped to the action space by the rollout, so a policy may overshoot.

Policy = Callable[[np.ndarray], np.ndarray]


def _lander_policy(behaviour: str, env: gym.Env, rng: np.random.Generator) -> Policy:
    """gymnasium's scripted lander with action noise: 'heuristic' none, 'expert' a little, 'noisy' a lot,
    'random' only uniform actions. A noisy episode draws its own Gaussian noise scale and its own rate of
    uniformly random actions, so noisy returns spread from about random's to about the expert's."""
    from gymnasium.envs.box2d.lunar_lander import heuristic

    low, high = env.action_space.low, env.action_space.high
    noise, epsilon = {"heuristic": (0.0, 0.0), "expert": (0.05, 0.0), "random": (0.0, 1.0)}.get(
        behaviour, (0.0, 0.0)
    )
    if behaviour == "noisy":
        noise, epsilon = rng.uniform(0.2, 1.0), rng.uniform(0.0, 0.3)

    def act(obs: np.ndarray) -> np.ndarray:
        if rng.random() < epsilon:
            return rng.uniform(low, high)  # (2,)
        return heuristic(env, obs) + noise * rng.standard_normal(low.shape)  # (2,)

    return act


def _cheetah_policy(behaviour: str, env: gym.Env, rng: np.random.Generator) -> Policy:
    """'gait': an open-loop sine wave per joint (random period, phases, amplitude) plus a little noise, which
    makes the cheetah rock and crawl; 'random': uniform actions. Only here to give MuJoCo-shaped data."""
    low, high = env.action_space.low, env.action_space.high
    if behaviour == "random":
        return lambda obs: rng.uniform(low, high)
    period = rng.uniform(8.0, 20.0)  # steps per gait cycle
    phases = rng.uniform(0.0, 2 * np.pi, size=low.shape)  # (6,) one phase per joint
    amplitude = rng.uniform(0.5, 1.0)
    step = itertools.count()

    def act(obs: np.ndarray) -> np.ndarray:
        gait = amplitude * np.sin(2 * np.pi * next(step) / period + phases)  # (6,)
        return gait + 0.1 * rng.standard_normal(low.shape)

    return act


@dataclass(frozen=True)
class _Recipe:
    """How to build one of our datasets."""

    env_id: str  # gymnasium id the episodes are collected in (its spec, kwargs included, is stored)
    max_episode_steps: int | None  # time limit per episode; None keeps the env's registered one
    n_episodes: int  # default size
    behaviours: tuple[str, ...]  # behaviour labels, given to episodes in turn (0, 1, 2, 0, 1, 2, ...)
    make_policy: Callable[[str, gym.Env, np.random.Generator], Policy]  # label, env, rng -> policy
    reference: tuple[str, str]  # behaviours whose mean returns are ref_min_score and ref_max_score
    reference_episodes: int  # extra episodes per reference behaviour (random returns vary a lot: use many)
    description: str  # stored in Minari's metadata


# The reference scores come from extra evaluation episodes (not from the dataset's own episodes), run with a
# fixed seed, so every build of a dataset, whatever its seed or size, normalizes scores the same way.
REFERENCE_SEED = 12345

_RECIPES = {
    DEFAULT_DATASET: _Recipe(
        env_id="LunarLanderContinuous-v3",
        max_episode_steps=None,
        n_episodes=420,
        behaviours=("expert", "noisy", "random"),
        make_policy=_lander_policy,
        reference=("random", "heuristic"),
        reference_episodes=50,
        description="LunarLanderContinuous, mixed quality: a third each of gymnasium's heuristic lander "
        "with tiny action noise (expert), with heavy Gaussian and epsilon-random noise (noisy), and uniform "
        "random actions (random). Per-step behaviour label in infos['behaviour'].",
    ),
    HALFCHEETAH_DATASET: _Recipe(
        env_id="HalfCheetah-v5",
        max_episode_steps=200,
        n_episodes=20,
        behaviours=("gait", "random"),
        make_policy=_cheetah_policy,
        reference=("random", "gait"),
        reference_episodes=5,
        description="HalfCheetah, small: open-loop sinusoidal gaits with noise (gait) and uniform random "
        "actions (random), 200 steps per episode. For testing MuJoCo shapes offline, not for learning.",
    ),
}


def buildable() -> list[str]:
    """The dataset ids `build` knows how to make."""
    return list(_RECIPES)


def _recipe(dataset_id: str) -> _Recipe:
    if dataset_id not in _RECIPES:
        raise DatasetError(f"unknown ttlib dataset {dataset_id!r}; buildable ids: {', '.join(buildable())}")
    return _RECIPES[dataset_id]


# --------------------------------------------------------------------------------------------------
# building


def _rollout(env: gym.Env, policy: Policy, seed: int):
    """Run one episode. Returns arrays with Minari's layout: T+1 observations (the last one after the last
    action), T actions, rewards, terminations and truncations."""
    obs, _ = env.reset(seed=seed)
    low, high = env.action_space.low, env.action_space.high
    observations, actions, rewards, terminations, truncations = [obs], [], [], [], []
    done = False
    while not done:
        action = np.clip(policy(obs), low, high).astype(np.float32)  # stored exactly as the env received it
        obs, reward, terminated, truncated, _ = env.step(action)
        observations.append(obs)
        actions.append(action)
        rewards.append(float(reward))
        terminations.append(bool(terminated))
        truncations.append(bool(truncated))
        done = terminated or truncated
    return (
        np.stack(observations).astype(np.float32),  # (T+1, obs_dim)
        np.stack(actions),  # (T, act_dim)
        np.array(rewards),  # (T,) float64, as the env returned them
        np.array(terminations),  # (T,)
        np.array(truncations),  # (T,)
    )


def _make_env(recipe: _Recipe) -> gym.Env:
    if recipe.max_episode_steps is None:
        return gym.make(recipe.env_id)
    return gym.make(recipe.env_id, max_episode_steps=recipe.max_episode_steps)


def _reference_scores(recipe: _Recipe) -> tuple[float, float]:
    """Mean return of the two reference behaviours over `recipe.reference_episodes` fresh episodes each."""
    env = _make_env(recipe)
    scores = []
    for behaviour in recipe.reference:
        rng = np.random.default_rng(REFERENCE_SEED)
        returns = []
        for _ in range(recipe.reference_episodes):
            policy = recipe.make_policy(behaviour, env, rng)
            returns.append(_rollout(env, policy, seed=int(rng.integers(2**31 - 1)))[2].sum())
        scores.append(float(np.mean(returns)))
    env.close()
    return scores[0], scores[1]


@contextlib.contextmanager
def _minari_root(path: Path):
    """Point Minari at another datasets folder for a while (it reads MINARI_DATASETS_PATH on every call)."""
    old = os.environ.get("MINARI_DATASETS_PATH")
    os.environ["MINARI_DATASETS_PATH"] = str(path)
    try:
        yield
    finally:
        if old is None:
            del os.environ["MINARI_DATASETS_PATH"]
        else:
            os.environ["MINARI_DATASETS_PATH"] = old


def _dataset_path(dataset_id: str) -> Path:
    """Where Minari keeps a dataset: <MINARI_DATASETS_PATH or ~/.minari/datasets>/<dataset_id>."""
    return Path(get_dataset_path(dataset_id))


def _temp_name(final: Path, kind: str) -> Path:
    # hidden (leading dot), so Minari and list_local never take it for a dataset; the pid says who owns it
    return final.with_name(f".{final.name}.{kind}-{os.getpid()}-{uuid.uuid4().hex[:8]}")


def _remove_stale_temp_folders(final: Path) -> None:
    """Delete temporary folders left next to `final` by builds whose process is gone (crashed or killed)."""
    for folder in final.parent.glob(f".{final.name}.*-*-*"):
        pid = folder.name.split("-")[-2]
        if not pid.isdigit():
            continue
        try:
            os.kill(int(pid), 0)  # signal 0 only asks whether the process exists
        except ProcessLookupError:
            shutil.rmtree(folder, ignore_errors=True)
        except PermissionError:
            pass  # it exists, it is just not ours


def build(
    dataset_id: str = DEFAULT_DATASET,
    seed: int = 0,
    n_episodes: int | None = None,
    force: bool = False,
    progress: bool = True,
) -> str:
    """Build one of our local datasets; returns its path. Deterministic for a seed. n_episodes None = the full
    default size. force=True rebuilds an existing one. Unknown id -> DatasetError naming the buildable ids.

    Building an existing dataset again with the same seed and size does nothing; with other settings it asks
    for force=True instead of silently keeping or replacing the old one.
    """
    recipe = _recipe(dataset_id)
    n_episodes = recipe.n_episodes if n_episodes is None else n_episodes
    if n_episodes < 1:
        raise DatasetError(f"n_episodes must be at least 1, got {n_episodes}")
    final = _dataset_path(dataset_id)
    if final.exists() and not force:
        built_with = _read_metadata(dataset_id, final).get("ttlib_build")
        if built_with == {"seed": seed, "n_episodes": n_episodes}:
            return str(final)
        raise DatasetError(
            f"{dataset_id} already exists at {final} (built with {built_with}); pass force=True "
            "(`ttlib make-dataset --force`) to rebuild it"
        )

    # Collect the episodes. One generator drives everything (env reset seeds, noise, behaviour parameters), so
    # the same seed gives bit-identical arrays.
    rng = np.random.default_rng(seed)
    env = _make_env(recipe)
    buffers = []
    for i in tqdm(range(n_episodes), desc=f"building {dataset_id}", unit="episode", disable=not progress):
        behaviour = recipe.behaviours[i % len(recipe.behaviours)]
        policy = recipe.make_policy(behaviour, env, rng)
        episode_seed = int(rng.integers(2**31 - 1))
        observations, actions, rewards, terminations, truncations = _rollout(env, policy, episode_seed)
        buffers.append(
            EpisodeBuffer(
                seed=episode_seed,
                observations=observations,
                actions=actions,
                rewards=rewards,
                terminations=terminations,
                truncations=truncations,
                # like Minari's DataCollector, infos hold T+1 entries: one from reset, one per step
                infos={"behaviour": [behaviour] * (len(rewards) + 1)},
            )
        )
    env_spec = env.spec
    env.close()
    ref_min_score, ref_max_score = _reference_scores(recipe)

    # Write with Minari into a hidden folder next to the final one (same filesystem), then rename into place.
    final.parent.mkdir(parents=True, exist_ok=True)
    _remove_stale_temp_folders(final)
    temp_root = _temp_name(final, "building")
    try:
        with _minari_root(temp_root), warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # Minari nags about author e-mail and code links
            written = minari.create_dataset_from_buffers(
                dataset_id=dataset_id,
                buffer=buffers,
                env=env_spec,
                eval_env=env_spec,
                algorithm_name=f"scripted behaviour policies: {', '.join(recipe.behaviours)}",
                author="ttlib",
                code_permalink="ttlib/data.py",
                description=recipe.description,
                ref_min_score=ref_min_score,
                ref_max_score=ref_max_score,
                num_episodes_average_score=recipe.reference_episodes,
                data_format="hdf5",
            )
            written.storage.update_metadata({"ttlib_build": {"seed": seed, "n_episodes": n_episodes}})
        new = temp_root / dataset_id
        if final.exists() and force:
            old = _temp_name(final, "replaced")
            os.replace(final, old)
            os.replace(new, final)
            shutil.rmtree(old, ignore_errors=True)
        else:
            try:
                os.replace(new, final)
            except OSError:
                if not final.exists():
                    raise
                # another process finished the same build first; same id and seed, so keep theirs
    finally:
        shutil.rmtree(temp_root, ignore_errors=True)
    return str(final)


# --------------------------------------------------------------------------------------------------
# loading


def _corrupt(dataset_id: str, path: Path, reason: str) -> DatasetError:
    fix = REBUILD_HINT.format(id=dataset_id) if dataset_id in _RECIPES else f"delete the folder {path}"
    reason = reason.strip().splitlines()[0] if reason.strip() else "unknown reason"
    return DatasetError(f"local dataset {dataset_id} at {path} is corrupt or half-written ({reason}); {fix}")


def _read_metadata(dataset_id: str, path: Path) -> dict:
    try:
        with open(path / "data" / "metadata.json") as file:
            return json.load(file)
    except (OSError, ValueError) as error:
        raise _corrupt(dataset_id, path, f"{type(error).__name__}: {error}") from None


def _complete(path: Path, metadata: dict) -> bool:
    """Cheap completeness check: the data file opens and holds as many episodes as the metadata says."""
    if metadata.get("data_format", "hdf5") != "hdf5":
        return True  # arrow/parquet keep one folder per episode; the full read in load() checks those
    try:
        import h5py

        with h5py.File(path / "data" / "main_data.hdf5", "r") as file:
            return len(file.keys()) == metadata.get("total_episodes")
    except OSError:
        return False


def _local_folders():
    """(dataset_id, path) of every folder under Minari's root that holds a data/ folder, hidden ones skipped
    (leftovers of a crashed build)."""
    root = _dataset_path("")
    for data_dir in sorted(root.rglob("data")):
        path = data_dir.parent
        parts = path.relative_to(root).parts
        if data_dir.is_dir() and not any(part.startswith(".") for part in parts):
            yield "/".join(parts), path


def _problem(dataset_id: str, path: Path) -> tuple[dict, str | None]:
    """-> (metadata, None) for a complete dataset, or ({}, one-line error with the fix) for a broken one."""
    try:
        metadata = _read_metadata(dataset_id, path)
    except DatasetError as error:
        return {}, str(error)
    if metadata.get("dataset_id") != dataset_id:
        return {}, str(_corrupt(dataset_id, path, f"its metadata names {metadata.get('dataset_id')!r}"))
    if not _complete(path, metadata):
        return {}, str(_corrupt(dataset_id, path, "fewer episodes in its data file than its metadata says"))
    return metadata, None


def list_local() -> list[dict]:
    """Every complete local Minari dataset: id, episodes, steps, env_id, path. Broken ones are in list_broken()."""
    found = []
    for dataset_id, path in _local_folders():
        metadata, problem = _problem(dataset_id, path)
        if problem is not None:
            continue
        env_spec = metadata.get("eval_env_spec") or metadata.get("env_spec")
        found.append(
            {
                "id": dataset_id,
                "episodes": metadata.get("total_episodes"),
                "steps": metadata.get("total_steps"),
                "env_id": json.loads(env_spec)["id"] if env_spec else None,
                "path": str(path),
            }
        )
    return found


def list_broken() -> list[dict]:
    """Every local dataset folder that cannot be loaded (half download, truncated file): id, path, and the
    error `load` would raise, which says how to fix it."""
    broken = []
    for dataset_id, path in _local_folders():
        _, problem = _problem(dataset_id, path)
        if problem is not None:
            broken.append({"id": dataset_id, "path": str(path), "error": problem})
    return broken


def _remote_host() -> tuple[str, int]:
    """The host:port a Minari download talks to first (the HTTPS proxy if one is set)."""
    proxy = os.environ.get("HTTPS_PROXY") or os.environ.get("https_proxy")
    remote = os.environ.get("MINARI_REMOTE", "hf://farama-minari")
    if proxy:
        url = urlsplit(proxy if "://" in proxy else f"http://{proxy}")
    elif remote.startswith("gcp://"):
        url = urlsplit("https://storage.googleapis.com")
    else:
        url = urlsplit(os.environ.get("HF_ENDPOINT", "https://huggingface.co"))
    return url.hostname or "", url.port or (443 if url.scheme == "https" else 80)


def _download(dataset_id: str) -> None:
    """Let Minari download a remote dataset, turning its failures into one-line DatasetErrors.

    Offline, Minari's hub client retries with back-off for half a minute before giving up, so first try one
    plain TCP connection with a short timeout and fail at once if the remote cannot be reached.
    """
    # Offline we cannot tell a remote id from a mistyped local one, so say both: it is not here, and a download
    # (if it is a remote id) needs internet.
    offline = DatasetError(
        f"dataset {dataset_id} is not on this machine (no folder {_dataset_path(dataset_id)}; `ttlib datasets` "
        f"lists the local ones) and, if it is a remote Minari id, downloading it needs internet; "
        f"the offline course dataset is {DEFAULT_DATASET!r}"
    )
    if os.environ.get("HF_HUB_OFFLINE", "0").lower() not in ("", "0", "false", "no"):
        raise offline
    try:
        socket.create_connection(_remote_host(), timeout=5).close()
    except OSError:
        raise offline from None

    try:
        minari.download_dataset(dataset_id)
    except ImportError as error:
        raise DatasetError(f"downloading {dataset_id} needs Minari's remote extras: {error}") from None
    except ValueError as error:  # Minari: no such dataset, or no version compatible with this Minari
        raise DatasetError(f"unknown dataset id {dataset_id!r}: {str(error).splitlines()[0]}") from None
    except Exception as error:  # network trouble half-way: requests/httpx errors, timeouts, HTTP errors
        raise DatasetError(
            f"downloading {dataset_id} failed ({type(error).__name__}: {str(error).splitlines()[0]}); "
            f"check the internet connection, or use the offline course dataset {DEFAULT_DATASET!r}"
        ) from None


def _read(dataset_id: str, path: Path, gamma: float) -> OfflineDataset:
    """Read every episode of a local Minari dataset into an OfflineDataset."""
    metadata = _read_metadata(dataset_id, path)
    try:
        minari_dataset = minari.load_dataset(dataset_id)
        episodes = list(minari_dataset.iterate_episodes())
    except Exception as error:  # truncated or missing data file, broken metadata, unsupported Minari version
        raise _corrupt(dataset_id, path, f"{type(error).__name__}: {error}") from None
    n_steps = sum(len(episode) for episode in episodes)
    if len(episodes) != metadata.get("total_episodes") or n_steps != metadata.get("total_steps"):
        raise _corrupt(dataset_id, path, "fewer episodes or steps than its metadata says")

    spaces = {"observation": minari_dataset.observation_space, "action": minari_dataset.action_space}
    for name, space in spaces.items():
        if not isinstance(space, gym.spaces.Box) or len(space.shape) != 1:
            raise DatasetError(f"{dataset_id} has a {space} {name} space; ttlib handles flat Box spaces only")

    observations, actions, rewards, terminations, truncations, behaviour = [], [], [], [], [], []
    for episode in episodes:
        T = len(episode.rewards)
        observations.append(np.asarray(episode.observations[:T], dtype=np.float32))  # (T, obs_dim), drop last
        actions.append(np.asarray(episode.actions, dtype=np.float32))  # (T, act_dim)
        rewards.append(np.asarray(episode.rewards, dtype=np.float32))  # (T,)
        terminations.append(np.asarray(episode.terminations, dtype=bool))  # (T,)
        truncations.append(np.asarray(episode.truncations, dtype=bool))  # (T,)
        labels = (episode.infos or {}).get("behaviour")
        if labels is not None and len(labels) > 0:
            label = labels[0]
            behaviour.append(label.decode() if isinstance(label, bytes) else str(label))

    env_spec = metadata.get("eval_env_spec") or metadata.get("env_spec")
    env_spec = json.loads(env_spec) if env_spec else {}
    action_space = spaces["action"]
    return OfflineDataset(
        dataset_id=dataset_id,
        env_id=env_spec.get("id"),
        env_kwargs=_env_kwargs(env_spec),
        gamma=gamma,
        observations=observations,
        actions=actions,
        rewards=rewards,
        terminations=terminations,
        truncations=truncations,
        values=[discounted_values(r, gamma) for r in rewards],
        behaviour=behaviour if len(behaviour) == len(episodes) else None,
        ref_min_score=metadata.get("ref_min_score"),
        ref_max_score=metadata.get("ref_max_score"),
        action_low=action_space.low.astype(np.float64).tolist(),
        action_high=action_space.high.astype(np.float64).tolist(),
    )


def _env_kwargs(env_spec: dict) -> dict:
    """gymnasium.make kwargs that rebuild the environment a dataset was collected in: the spec's kwargs, plus its
    time limit where that is not the registered one (episodes cut at 200 steps must be compared with episodes
    cut at 200 steps). A limit equal to the registered one is left out, so such datasets read as they always did.
    """
    kwargs = dict(env_spec.get("kwargs") or {})
    limit = env_spec.get("max_episode_steps")
    try:
        registered = gym.spec(env_spec["id"]).max_episode_steps
    except (KeyError, gym.error.Error):  # no id, or an environment not installed here: keep what the data say
        registered = None
    if limit is not None and limit != registered:
        kwargs["max_episode_steps"] = limit
    return kwargs


def load(
    dataset_id: str = DEFAULT_DATASET, gamma: float = 0.99, download: bool = True, progress: bool = True
) -> OfflineDataset:
    """One loader for every id. Ours (DEFAULT_DATASET, HALFCHEETAH_DATASET) are built on first use when
    missing (with a tqdm bar), never downloaded. Any other id that exists locally is loaded with
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
    path = _dataset_path(dataset_id)
    if dataset_id in _RECIPES:
        if not path.exists():
            build(dataset_id, progress=progress)
    elif not path.exists():
        if dataset_id.startswith("ttlib/"):
            _recipe(dataset_id)  # raises: an id in our namespace that we cannot build
        if not download:
            raise DatasetError(f"dataset {dataset_id} is not local (at {path}) and download=False")
        _download(dataset_id)
    return _read(dataset_id, path, gamma)


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
