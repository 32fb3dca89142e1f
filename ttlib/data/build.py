"""Build ttlib's own datasets: scripted behaviour policies, written atomically in Minari's format.

The course dataset comes from LunarLanderContinuous and gymnasium's scripted lander with more or less noise on
top. Its quality is *mixed* on purpose: a planner that models the data well can then beat the data's average.
Its sibling without the expert (like D4RL's medium-replay) holds only a late, shaky pilot and random flying: no
episode in it is an expert's, and copying its best episodes cannot become one (see `lander_policy`).
A build writes into a hidden temporary folder next to the final one and renames it into place at the end, so a
crash never leaves a half-written dataset behind under a loadable name; folders left by crashed builds are
removed by the next build.
"""

from __future__ import annotations

import itertools
import os
import shutil
import uuid
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import gymnasium as gym
import minari
import numpy as np
from minari.data_collector import EpisodeBuffer
from tqdm.auto import tqdm

from ttlib.data.minari_io import (
    DEFAULT_DATASET,
    HALFCHEETAH_DATASET,
    NO_EXPERT_DATASET,
    OWN_DATASETS,
    DatasetError,
    dataset_path,
    minari_root,
    read_metadata,
)

__all__ = ["Policy", "REFERENCE_SEED", "build", "buildable", "lander_policy", "recipe_for"]


# --------------------------------------------------------------------------------------------------
# behaviour policies for our own datasets
#
# A policy factory gets a behaviour label, the environment and the build's random generator, and returns a
# policy for one episode: obs -> action. Per-episode randomness (noise level, gait) is drawn when it is made.
# Actions are clipped to the action space by the rollout, so a policy may overshoot.

Policy = Callable[[np.ndarray], np.ndarray]


def lander_policy(behaviour: str, env: gym.Env, rng: np.random.Generator) -> Policy:
    """gymnasium's scripted lander with action noise: 'heuristic' none, 'expert' a little, 'noisy' a lot,
    'random' only uniform actions. A noisy episode draws its own Gaussian noise scale and its own rate of
    uniformly random actions, so noisy returns spread from about random's to about the expert's.

    'pilot' (the dataset without the expert) is a late, shaky pilot: it flies the scripted lander on what it saw
    4 to 8 steps before (its reaction time, drawn per episode), with Gaussian noise of std 0.4 to 0.8 and one
    random action in ten. Noise alone would not do: it is zero-mean at every state, so behaviour cloning averages
    it away and recovers the expert from noisy data (`ttlib.agents.baselines`; docs/DATASETS.md has the figures). A
    reaction time is not zero-mean: the data's average action at a state answers an earlier state, so copying
    the data cannot undo it, while the noise still puts better actions than the pilot's own in the data."""
    from gymnasium.envs.box2d.lunar_lander import heuristic

    low, high = env.action_space.low, env.action_space.high
    noise, epsilon = {"heuristic": (0.0, 0.0), "expert": (0.05, 0.0), "random": (0.0, 1.0)}.get(
        behaviour, (0.0, 0.0)
    )
    if behaviour == "noisy":
        noise, epsilon = rng.uniform(0.2, 1.0), rng.uniform(0.0, 0.3)
    delay, seen = 0, []
    if behaviour == "pilot":
        delay, noise, epsilon = int(rng.integers(4, 9)), rng.uniform(0.4, 0.8), 0.1

    def act(obs: np.ndarray) -> np.ndarray:
        seen.append(obs)
        if rng.random() < epsilon:
            return rng.uniform(low, high)  # (2,)
        reacts_to = seen[max(0, len(seen) - 1 - delay)]  # the observation `delay` steps ago (the first, early on)
        return heuristic(env, reacts_to) + noise * rng.standard_normal(low.shape)  # (2,)

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
        make_policy=lander_policy,
        reference=("random", "heuristic"),
        reference_episodes=50,
        description="LunarLanderContinuous, mixed quality: a third each of gymnasium's heuristic lander "
        "with tiny action noise (expert), with heavy Gaussian and epsilon-random noise (noisy), and uniform "
        "random actions (random). Per-step behaviour label in infos['behaviour'].",
    ),
    NO_EXPERT_DATASET: _Recipe(
        env_id="LunarLanderContinuous-v3",
        max_episode_steps=None,
        n_episodes=420,
        behaviours=("pilot", "random"),
        make_policy=lander_policy,
        reference=("random", "heuristic"),  # the course dataset's references: normalized scores compare
        reference_episodes=50,
        description="LunarLanderContinuous without an expert (like D4RL's medium-replay): half of the episodes "
        "by a late, shaky pilot (gymnasium's heuristic lander acting on the observation of 4-8 steps before, with "
        "heavy Gaussian and epsilon-random noise), half by uniform random actions. Per-step behaviour label in "
        "infos['behaviour'].",
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


assert set(_RECIPES) == set(OWN_DATASETS), "every dataset ttlib builds has a recipe"


def buildable() -> list[str]:
    """The dataset ids `build` knows how to make."""
    return list(_RECIPES)


def recipe_for(dataset_id: str) -> _Recipe:
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
    recipe = recipe_for(dataset_id)
    n_episodes = recipe.n_episodes if n_episodes is None else n_episodes
    if n_episodes < 1:
        raise DatasetError(f"n_episodes must be at least 1, got {n_episodes}")
    final = dataset_path(dataset_id)
    if final.exists() and not force:
        built_with = read_metadata(dataset_id, final).get("ttlib_build")
        if built_with == {"seed": seed, "n_episodes": n_episodes}:
            return str(final)
        raise DatasetError(
            f"{dataset_id} already exists at {final} (built with {built_with}); pass force=True "
            "(`ttlib make-dataset --force`) to rebuild it"
        )

    # Written with Minari into a hidden folder next to the final one (same filesystem), then renamed into place.
    buffers, env_spec = _collect(dataset_id, recipe, seed, n_episodes, progress)
    ref_min_score, ref_max_score = _reference_scores(recipe)
    final.parent.mkdir(parents=True, exist_ok=True)
    _remove_stale_temp_folders(final)
    temp_root = _temp_name(final, "building")
    try:
        with minari_root(temp_root), warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # Minari nags about author e-mail and code links
            written = minari.create_dataset_from_buffers(
                dataset_id=dataset_id,
                buffer=buffers,
                env=env_spec,
                eval_env=env_spec,
                algorithm_name=f"scripted behaviour policies: {', '.join(recipe.behaviours)}",
                author="ttlib",
                code_permalink="ttlib/data/build.py",
                description=recipe.description,
                ref_min_score=ref_min_score,
                ref_max_score=ref_max_score,
                num_episodes_average_score=recipe.reference_episodes,
                data_format="hdf5",
            )
            written.storage.update_metadata({"ttlib_build": {"seed": seed, "n_episodes": n_episodes}})
        _move_into_place(temp_root / dataset_id, final, force)
    finally:
        shutil.rmtree(temp_root, ignore_errors=True)
    return str(final)


def _collect(dataset_id: str, recipe: _Recipe, seed: int, n_episodes: int, progress: bool):
    """Play the episodes -> (Minari episode buffers, the environment's spec). One generator drives everything
    (env reset seeds, noise, behaviour parameters), so the same seed gives bit-identical arrays."""
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
    return buffers, env_spec


def _move_into_place(new: Path, final: Path, force: bool) -> None:
    """Rename the finished dataset folder `new` to `final` (same filesystem, so atomic); with force, replacing
    what is there."""
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
