"""Run the planner in real environments: one at a time, or many at once with gymnasium.vector.

Planning dominates the cost of an episode, and a planning call on a batch of environments costs little more
than on one (the matrices just get taller). So the vectorized rollout steps E environments in lockstep and plans
for all still-running ones in a single `beam_plan` call. Every environment keeps its own context (its last
transitions as tokens), its own seed and its own random key per step, so an episode's return is the same
whether it ran alone or in a batch -- a property the tests check.

Gymnasium 1.x vector environments reset an environment automatically on the step *after* it finished
(autoreset "next step"). We stop planning for an environment once its episode ends and ignore whatever it
returns afterwards, so every episode is counted exactly once.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field

import gymnasium as gym
import numpy as np
import torch
from tqdm.auto import tqdm

from ttlib.files import atomic_path
from ttlib.model.gpt import TrajectoryGPT
from ttlib.model.tokenizer import TrajectoryTokenizer
from ttlib.planning.beam import Plan, PlannerConfig, beam_plan, check_critic, check_fits
from ttlib.planning.fast_decoder import BufferPool


@dataclass
class EvalResult:
    seeds: list[int]  # environment seed of every episode
    returns: np.ndarray  # (n_episodes,) undiscounted returns
    lengths: np.ndarray  # (n_episodes,) steps per episode
    seconds: float  # wall-clock time of the whole evaluation
    clipped_observations: int = 0  # observation entries outside the tokenizer's range (clipped)
    frames: list = field(default_factory=list)  # rgb frames of the first episode, if recorded
    plans: list = field(default_factory=list)  # (step, Plan) of the first episode, if recorded

    @property
    def steps(self) -> int:
        return int(self.lengths.sum())

    def return_stats(self) -> dict:
        """The returns in figures a comparison can trust: the mean with its standard error (None for one episode),
        the spread, and the share of episodes that ended below zero (crashes, mostly)."""
        n = len(self.returns)
        stderr = float(self.returns.std(ddof=1) / np.sqrt(n)) if n > 1 else None
        return {"episodes": n, "seeds": list(self.seeds), "mean_return": float(self.returns.mean()),
                "stderr_return": stderr, "std_return": float(self.returns.std()),
                "median_return": float(np.median(self.returns)), "min_return": float(self.returns.min()),
                "below_zero_fraction": float((self.returns < 0).mean())}

    def summary(self) -> str:
        stats = self.return_stats()
        stderr = "" if stats["stderr_return"] is None else f" +- {stats['stderr_return']:.1f} (SE)"
        first, last = self.seeds[0], self.seeds[-1]
        seeds = f" (seeds {first}-{last})" if list(self.seeds) == list(range(first, last + 1)) else ""
        return (f"{len(self.returns)} episodes{seeds}: return "
                f"{stats['mean_return']:.1f}{stderr}, std {stats['std_return']:.1f}, min {stats['min_return']:.1f}, "
                f"max {self.returns.max():.1f}, {stats['below_zero_fraction']:.0%} below zero; {self.steps} steps in "
                f"{self.seconds:.1f} s")


def make_env(env_id: str | None, env_kwargs: dict | None = None, render_mode: str | None = None) -> gym.Env:
    """gymnasium.make, with one clear line when there is no environment id or gymnasium does not know it."""
    if env_id is None:
        raise ValueError("no environment to evaluate in: the dataset names none; pass a gymnasium id "
                         "(`ttlib evaluate --env ENV_ID`)")
    try:
        return gym.make(env_id, render_mode=render_mode, **(env_kwargs or {}))
    except (gym.error.UnregisteredEnv, gym.error.DeprecatedEnv, ModuleNotFoundError) as error:
        raise ValueError(f"environment {env_id!r} is not registered in gymnasium ({error}); install the package "
                         "that provides it, or pass another with `ttlib evaluate --env ENV_ID`") from None
    except gym.error.DependencyNotInstalled as error:  # e.g. MuJoCo or Box2D missing
        raise ValueError(f"environment {env_id!r} needs a package that is not installed: "
                         f"{str(error).splitlines()[0]}") from None


class EpisodeSchedule(gym.Wrapper):
    """An environment that plays a fixed list of episodes, one seed each, in order: every reset without a seed --
    a vector environment's autoreset among them -- starts the next scheduled episode. Each episode is then the one
    `evaluate` plays for that seed, whichever environment of a vector plays it and whatever it played before."""

    def __init__(self, env: gym.Env, seeds):
        super().__init__(env)
        self.seeds = [int(s) for s in seeds]
        self.started = 0  # episodes started so far

    def reset(self, *, seed=None, options=None):
        if seed is None and self.started < len(self.seeds):
            seed = self.seeds[self.started]
        self.started += 1
        return self.env.reset(seed=seed, options=options)


def scheduled_vector_env(env_id: str, schedule, env_kwargs: dict | None = None,
                         max_steps: int | None = None) -> gym.vector.SyncVectorEnv:
    """A SyncVectorEnv whose environment e plays the episodes seeded schedule[e] one after another (reset() starts
    the first of each, autoresets the next ones). max_steps truncates every episode after that many steps."""
    kwargs = {**(env_kwargs or {}), **({"max_episode_steps": max_steps} if max_steps is not None else {})}
    return gym.vector.SyncVectorEnv([lambda seeds=seeds: EpisodeSchedule(make_env(env_id, kwargs), seeds)
                                     for seeds in schedule])


def check_episodes(seeds, n_envs: int | None, max_steps: int | None) -> None:
    """An evaluation must play something: at least one episode, batches of at least one, at least one step."""
    if len(seeds) < 1:
        raise ValueError("nothing to evaluate: give at least one episode (--episodes >= 1)")
    if n_envs is not None and n_envs < 1:
        raise ValueError(f"n_envs (--n-envs) must be >= 1, got {n_envs}")
    if max_steps is not None and max_steps < 1:
        raise ValueError(f"max_steps (--max-steps) must be >= 1, got {max_steps}")


def check_action_space(space, low, high, who: str) -> None:
    """Refuse to act in an environment whose action bounds are not the ones `who` learned to produce: its
    actions would be clipped or mean something else there, and the returns would look fine and be wrong."""
    low, high = np.asarray(low, np.float64), np.asarray(high, np.float64)
    if low.shape != space.low.shape or not (np.allclose(low, space.low) and np.allclose(high, space.high)):
        raise ValueError(f"{who} acts in [{_bounds(low)}, {_bounds(high)}] (its dataset's action space) but this "
                         f"environment's actions span [{_bounds(space.low)}, {_bounds(space.high)}]; evaluate "
                         "in the dataset's environment, or train on data from this one")


def _bounds(x) -> str:
    x = np.asarray(x, np.float64).ravel()
    return f"{x[0]:g}" if np.all(x == x[0]) else "(" + ", ".join(f"{v:g}" for v in x) + ")"


def check_env(space_obs, space_act, model: TrajectoryGPT) -> None:
    """The environment must have a continuous (Box) action space and the model's observation/action sizes."""
    if not isinstance(space_act, gym.spaces.Box):
        raise ValueError(f"the Trajectory Transformer plans continuous actions; this environment's action space "
                         f"is {type(space_act).__name__}, not Box")
    obs_dim, act_dim = int(np.prod(space_obs.shape)), int(np.prod(space_act.shape))
    c = model.config
    if (obs_dim, act_dim) != (c.obs_dim, c.act_dim):
        raise ValueError(f"the checkpoint is for observations of {c.obs_dim} and actions of {c.act_dim} "
                         f"dimensions, the environment has {obs_dim} and {act_dim}")


def step_key(seed: int, step: int) -> int:
    """The planner's random key for one decision of one episode."""
    return (int(seed) & 0xFFFFFFFF) << 32 | (int(step) & 0xFFFFFFFF)


class Contexts:
    """The last transitions of E environments as bins, and the prefix the planner sees."""

    def __init__(self, tokenizer: TrajectoryTokenizer, n_envs: int, context: int):
        self.tokenizer = tokenizer
        self.context = context
        self.history = [[] for _ in range(n_envs)]  # per environment: list of (td,) bins of past transitions
        self.clipped = 0

    def encode_obs(self, obs: np.ndarray) -> np.ndarray:
        tok = self.tokenizer
        dims = slice(0, tok.obs_dim)
        self.clipped += tok.out_of_range(obs, dims)
        return tok.encode(obs, dims, on_clip="ignore")

    def prefix(self, envs, observations) -> torch.Tensor:
        """(len(envs), P) bins: the last context-1 transitions of each environment, then its observation."""
        obs_bins = self.encode_obs(observations)  # (E, obs_dim)
        rows = [np.concatenate([*self.history[e][-(self.context - 1):], obs_bins[i]]) if self.context > 1
                else obs_bins[i] for i, e in enumerate(envs)]
        return torch.as_tensor(np.stack(rows), dtype=torch.long)

    def append(self, e: int, observation, action, reward) -> None:
        """Record a finished transition. Its value token is never attended to, so bin 0 stands in for it."""
        tok = self.tokenizer
        row = tok.encode(np.concatenate([observation, action, [reward, 0.0]]), on_clip="ignore")
        row[tok.value_dim] = 0
        self.history[e].append(row)
        del self.history[e][:-self.context]  # keep only what the planner can see


def evaluate(model: TrajectoryGPT, tokenizer: TrajectoryTokenizer, env_id: str, seeds, planner: PlannerConfig,
             env_kwargs: dict | None = None, vectorized: bool = True, n_envs: int | None = None,
             asynchronous: bool = False, max_steps: int | None = None, record: bool = False,
             progress: bool = True, critic=None) -> EvalResult:
    """Play one episode per seed with the planner; return their returns.

    vectorized=True steps up to `n_envs` (default: all seeds) environments together and plans for them in one
    batch; False plays the episodes one after another. `max_steps` cuts episodes short (fast demos). `record`
    keeps the first episode's frames (rgb_array) and plans, for videos and plots. `critic`: the Q critic a
    planner with value="critic" scores with (`critic.Critic`, e.g. `critic.load_critic`).
    """
    seeds = [int(s) for s in seeds]
    check_episodes(seeds, n_envs, max_steps)
    planner.validate()
    check_fits(model, planner.context, planner.horizon)
    check_critic(planner, critic)

    def play(group, first, bar):
        return _run_wave(model, tokenizer, env_id, env_kwargs, group, planner, asynchronous and vectorized,
                         max_steps, record and first, bar, critic)

    return play_in_waves(seeds, (n_envs or len(seeds)) if vectorized else 1, play, progress)


@dataclass
class Episodes:
    """What a group of episodes played together gives back, in the order of its seeds."""
    returns: list[float]  # undiscounted return of every episode
    lengths: list[int]  # steps of every episode
    clipped: int = 0  # observation entries outside the tokenizer's range (clipped)
    frames: list = field(default_factory=list)  # rgb frames of the group's first episode, if recorded
    plans: list = field(default_factory=list)  # (step, Plan) of the group's first episode, if recorded


def play_in_waves(seeds: list[int], wave: int, play, progress: bool) -> EvalResult:
    """Play `seeds` in groups of `wave`, each with play(group, first group?, progress bar) -> Episodes, and
    gather one EvalResult. The Trajectory Transformer (here) and the Decision Transformer (ttlib.agents.dt) share it."""
    t0 = time.perf_counter()
    returns, lengths, clipped, frames, plans = [], [], 0, [], []
    bar = tqdm(total=len(seeds), desc="episodes", unit="ep", disable=not progress, mininterval=1.0,
               miniters=0)  # redrawn once a second at most, also between episodes (update(0) each step)
    for start in range(0, len(seeds), wave):
        done = play(seeds[start:start + wave], start == 0, bar)
        returns, lengths, clipped = returns + done.returns, lengths + done.lengths, clipped + done.clipped
        frames, plans = frames + done.frames, plans + done.plans
    bar.close()
    return EvalResult(seeds, np.array(returns), np.array(lengths), time.perf_counter() - t0, clipped, frames, plans)


def record_step(returns: np.ndarray, lengths: np.ndarray, running: np.ndarray, reward, terminated, truncated,
                max_steps: int | None = None) -> np.ndarray:
    """Count one vector-env step for the environments still running, in place; return those that finished now.

    returns (E,) float, lengths (E,) int, running (E,) bool; reward, terminated, truncated (E,) from `envs.step`.
    Environments no longer running are left alone: under autoreset, what they return now belongs to a new
    episode that nobody plays.
    """
    returns[running] += np.asarray(reward)[running]
    lengths[running] += 1
    done = running & (np.asarray(terminated) | np.asarray(truncated))
    if max_steps is not None:
        done |= running & (lengths >= max_steps)
    running &= ~done
    return np.flatnonzero(done)


class EpisodeBatch:
    """E episodes stepped together in one vector environment: what the planner sees, and what it does.

    `observe()` gives the still-running environments, their contexts and random keys; `act(actions)` steps them
    and returns the ones that just finished. The same object serves one process (`evaluate`) and a distributed
    environment worker (`ttlib.evaluation.ray_evaluation`), so both step episodes exactly alike.
    """

    def __init__(self, env_id: str, seeds, tokenizer: TrajectoryTokenizer | None, context: int,
                 env_kwargs: dict | None = None, max_steps: int | None = None, asynchronous: bool = False,
                 render: bool = False):
        self.seeds = [int(s) for s in seeds]
        E = len(self.seeds)
        render_mode = "rgb_array" if render else None
        env_fns = [lambda: make_env(env_id, env_kwargs, render_mode) for _ in range(E)]
        self.envs = gym.vector.AsyncVectorEnv(env_fns) if asynchronous else gym.vector.SyncVectorEnv(env_fns)
        self.asynchronous, self.max_steps = asynchronous, max_steps
        self.contexts = Contexts(tokenizer, E, context) if tokenizer is not None else None  # None: no planner
        self.returns, self.lengths = np.zeros(E), np.zeros(E, dtype=int)
        self.reward = np.zeros(E)  # every environment's reward of the last step
        self.running = np.ones(E, dtype=bool)
        self.step = 0  # decisions taken so far (the same for every running environment)
        self.obs = None

    def reset(self) -> EpisodeBatch:
        self.obs, _ = self.envs.reset(seed=self.seeds)
        return self

    def observe(self):
        """-> (active (n,) indices, prefix (n, P) bins, keys (n,) int64) for the running environments."""
        active = np.flatnonzero(self.running)
        prefix = self.contexts.prefix(active, self.obs[active])
        keys = torch.tensor([step_key(self.seeds[e], self.step) for e in active], dtype=torch.int64)
        return active, prefix, keys

    def act(self, actions) -> list[int]:
        """Step the running environments with their actions (n, act_dim); -> indices of episodes that ended."""
        space = self.envs.single_action_space
        active = np.flatnonzero(self.running)
        full = np.zeros((len(self.seeds), *space.shape), dtype=np.float32)
        full[active] = np.clip(np.asarray(actions), space.low, space.high)
        next_obs, reward, terminated, truncated, _ = self.envs.step(full)
        for e in active if self.contexts is not None else ():
            self.contexts.append(e, self.obs[e], full[e], reward[e])
        self.reward = reward
        ended = record_step(self.returns, self.lengths, self.running, reward, terminated, truncated, self.max_steps)
        self.obs = next_obs
        self.step += 1
        return [int(e) for e in ended]

    def render_first(self):
        return self.envs.envs[0].render() if not self.asynchronous else self.envs.call("render")[0]

    def close(self) -> None:
        self.envs.close()


def _run_wave(model, tokenizer, env_id, env_kwargs, seeds, planner, asynchronous, max_steps, record, bar,
              critic=None):
    """Episodes for `seeds`, all stepped together in one vector environment."""
    batch = EpisodeBatch(env_id, seeds, tokenizer, planner.context, env_kwargs, max_steps, asynchronous, record)
    try:
        check_env(batch.envs.single_observation_space, batch.envs.single_action_space, model)
        batch.reset()
        frames, plans = [], []
        device = model.pos_emb.device
        critic = critic.to(device) if critic is not None else None
        buffers = BufferPool()  # the cache's buffers, kept from one plan to the next
        while batch.running.any():
            first = record and batch.running[0]
            if first:
                frames.append(batch.render_first())
            active, prefix, keys = batch.observe()
            plan = beam_plan(model, tokenizer, prefix.to(device), keys, planner, buffers, critic=critic,
                             observation=torch.as_tensor(batch.obs[active]))  # the critic scores the real one
            if first:
                plans.append((batch.step, _row(plan, 0)))
            # moves every step, also while no episode has ended yet; drawn at most once a second (tqdm's
            # mininterval): a notebook's progress widget then sends a few hundred messages, not one a step
            bar.set_postfix_str(f"step {batch.step + 1}", refresh=False)
            bar.update(len(batch.act(plan.actions[:, 0].numpy())))
        return Episodes(list(batch.returns), list(batch.lengths), batch.contexts.clipped, frames, plans)
    finally:
        batch.close()


def _row(plan: Plan, i: int) -> Plan:
    """One environment's part of a batched plan."""
    return Plan(*(getattr(plan, f)[i:i + 1] for f in plan.__dataclass_fields__))


def save_video(frames, path: str, fps: int = 30) -> str:
    """Write rgb frames to a GIF or MP4 (by extension), atomically. MP4 needs imageio-ffmpeg."""
    import imageio.v2 as imageio

    if not frames:
        raise ValueError("no frames to save: evaluate with record=True")
    suffix = os.path.splitext(path)[1].lower() or ".gif"
    with atomic_path(path) as tmp:
        if suffix == ".gif":
            imageio.mimsave(tmp, frames, format="GIF", duration=1000 / fps, loop=0)
        else:
            imageio.mimsave(tmp, frames, format=suffix[1:].upper(), fps=fps)
    return path
