"""Play agents in real environments: one at a time, or many at once with gymnasium.vector -- ttlib's one episode loop.

Every agent -- the Trajectory Transformer's planner (`PlannerAgent`, here), the Decision Transformer
(`ttlib.agents.dt`), the baselines' policies (`ttlib.agents.baselines`) -- is played by `play`, on Ray's workers too
(`ttlib.evaluation.ray_evaluation`). The loop asks each agent the few things of `ttlib.agents.protocol.Agent`:
act on the running environments' observations, hear what came of it, forget the episodes that ended.

Acting dominates the cost of an episode, and acting on a batch of environments costs little more than on one (the
matrices just get taller). So the vectorized loop steps E environments in lockstep and asks the agent for all
still-running ones in a single call. Every environment keeps its own seed (and, for the planner, its own context
and its own random key per step), so an episode's return is the same whether it ran alone or in a batch -- a
property the tests check.

Gymnasium 1.x vector environments reset an environment automatically on the step *after* it finished
(autoreset "next step"). We stop acting for an environment once its episode ends and ignore whatever it
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

from ttlib.agents.protocol import Agent
from ttlib.errors import ConfigError, MismatchError, UnavailableError
from ttlib.files import atomic_path
from ttlib.model.gpt import TrajectoryGPT
from ttlib.model.tokenizer import TrajectoryTokenizer
from ttlib.planning.beam import Plan, PlannerConfig, beam_plan, check_critic, check_fits
from ttlib.planning.fast_decoder import BufferPool

__all__ = ["Contexts", "EpisodeBatch", "EpisodeSchedule", "Episodes", "EvalResult", "PlannerAgent",
           "check_action_space", "check_episodes", "check_spaces", "evaluate", "make_env", "play", "record_step",
           "save_video", "scheduled_vector_env", "step_key"]


@dataclass
class EvalResult:
    seeds: list[int]  # environment seed of every episode
    returns: np.ndarray  # (n_episodes,) undiscounted returns
    lengths: np.ndarray  # (n_episodes,) steps per episode
    seconds: float  # wall-clock time of the whole evaluation
    clipped_observations: int = 0  # observation entries outside the tokenizer's range (clipped)
    frames: list = field(default_factory=list)  # rgb frames of the first episode, if recorded
    plans: list = field(default_factory=list)  # (step, Plan) of the first episode, if recorded (the planner)

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
        raise ConfigError("no environment to evaluate in: the dataset names none; pass a gymnasium id "
                          "(`ttlib evaluate --env ENV_ID`)")
    try:
        return gym.make(env_id, render_mode=render_mode, **(env_kwargs or {}))
    except (gym.error.UnregisteredEnv, gym.error.DeprecatedEnv, ModuleNotFoundError) as error:
        raise ConfigError(f"environment {env_id!r} is not registered in gymnasium ({error}); install the package "
                          "that provides it, or pass another with `ttlib evaluate --env ENV_ID`") from None
    except gym.error.DependencyNotInstalled as error:  # e.g. MuJoCo or Box2D missing
        raise UnavailableError(f"environment {env_id!r} needs a package that is not installed: "
                               f"{str(error).splitlines()[0]}") from None


class EpisodeSchedule(gym.Wrapper):
    """An environment that plays a fixed list of episodes, one seed each, in order: every reset without a seed --
    a vector environment's autoreset among them -- starts the next scheduled episode. Each episode is then the one
    `play` plays for that seed, whichever environment of a vector plays it and whatever it played before."""

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


# ---- the checks: an evaluation that plays something, in an environment that fits the agent -----------------------
def check_episodes(seeds, n_envs: int | None, max_steps: int | None) -> None:
    """An evaluation must play something: at least one episode, batches of at least one, at least one step."""
    if len(seeds) < 1:
        raise ConfigError("nothing to evaluate: give at least one episode (--episodes >= 1)")
    if n_envs is not None and n_envs < 1:
        raise ConfigError(f"n_envs (--n-envs) must be >= 1, got {n_envs}")
    if max_steps is not None and max_steps < 1:
        raise ConfigError(f"max_steps (--max-steps) must be >= 1, got {max_steps}")


def check_spaces(observation_space, action_space, agent: Agent) -> None:
    """The environment must fit the agent: continuous (Box) actions, the agent's observation and action sizes,
    and -- for an agent that knows them -- the action bounds it learned (`check_action_space`)."""
    if not isinstance(action_space, gym.spaces.Box):
        raise MismatchError(f"{agent.name} acts with continuous actions; this environment's action space is "
                         f"{type(action_space).__name__}, not Box")
    obs_dim, act_dim = int(np.prod(observation_space.shape)), int(np.prod(action_space.shape))
    if (obs_dim, act_dim) != (agent.obs_dim, agent.act_dim):
        raise MismatchError(f"{agent.name} is for observations of {agent.obs_dim} and actions of {agent.act_dim} "
                         f"dimensions, the environment has {obs_dim} and {act_dim}")
    bounds = agent.action_range()
    if bounds is not None:
        check_action_space(action_space, *bounds, agent.name)


def check_action_space(space, low, high, who: str) -> None:
    """Refuse to act in an environment whose action bounds are not the ones `who` learned to produce: its
    actions would be clipped or mean something else there, and the returns would look fine and be wrong."""
    low, high = np.asarray(low, np.float64), np.asarray(high, np.float64)
    if low.shape != space.low.shape or not (np.allclose(low, space.low) and np.allclose(high, space.high)):
        raise MismatchError(f"{who} acts in [{_bounds(low)}, {_bounds(high)}] (its dataset's action space) but this "
                            f"environment's actions span [{_bounds(space.low)}, {_bounds(space.high)}]; evaluate "
                            "in the dataset's environment, or train on data from this one")


def _bounds(x) -> str:
    x = np.asarray(x, np.float64).ravel()
    return f"{x[0]:g}" if np.all(x == x[0]) else "(" + ", ".join(f"{v:g}" for v in x) + ")"


# ---- the planner as an agent --------------------------------------------------------------------------------------
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


class PlannerAgent:
    """The Trajectory Transformer's planner as an agent (ttlib.agents.protocol.Agent): every running environment's
    last transitions as bins (`Contexts`), and one beam search for all of them per step, each environment with its
    own random key step_key(seed, step) -- so an episode plans alike alone or in a batch.

    `critic`: the Q critic a planner with value="critic" scores with. `buffers`: the decoder's buffers, kept from
    one plan to the next (default: a new pool per batch of episodes). model=None keeps the contexts and keys only
    (`request`): an agent checked against an environment, or a central-inference environment worker whose actions
    a planner actor elsewhere computes (ttlib.evaluation.ray_evaluation).
    """

    name = "the Trajectory Transformer"

    def __init__(self, model: TrajectoryGPT | None, tokenizer: TrajectoryTokenizer, planner: PlannerConfig | None,
                 critic=None, buffers: BufferPool | None = None):
        if model is not None:
            planner.validate()
            check_fits(model, planner.context, planner.horizon)
            check_critic(planner, critic)
        self.model, self.tokenizer, self.planner = model, tokenizer, planner
        self.kept = self.buffers = buffers  # kept: the pool to plan with in every batch (None: a new one each)
        self.device = model.pos_emb.device if model is not None else None
        self.critic = critic.to(self.device) if critic is not None and model is not None else critic
        self.obs_dim, self.act_dim = tokenizer.obs_dim, tokenizer.act_dim
        self.contexts, self.seeds, self.step = None, [], 0  # per row (running environment): its bins and seed
        self.observed, self.plan = None, None  # the observations of the last request, and the last plan

    @property
    def clipped(self) -> int:
        return self.contexts.clipped if self.contexts is not None else 0

    def action_range(self) -> None:
        return None  # the tokenizer's bins span the data's actions, not necessarily the action space

    def start(self, seeds) -> None:
        self.seeds, self.step = [int(s) for s in seeds], 0
        self.contexts = Contexts(self.tokenizer, len(self.seeds), self.planner.context)
        self.buffers = self.kept if self.kept is not None else BufferPool()

    def request(self, observations) -> tuple[torch.Tensor, torch.Tensor]:
        """(n, obs_dim) observations of the running rows -> (prefix (n, P) bins, keys (n,) int64): what one beam
        search plans from. The observations are kept for `observe` (and for the critic, which scores them)."""
        self.observed = np.asarray(observations)
        prefix = self.contexts.prefix(range(len(self.seeds)), self.observed)
        keys = torch.tensor([step_key(seed, self.step) for seed in self.seeds], dtype=torch.int64)
        return prefix, keys

    def act(self, observations) -> np.ndarray:
        prefix, keys = self.request(observations)
        self.plan = beam_plan(self.model, self.tokenizer, prefix.to(self.device), keys, self.planner, self.buffers,
                              critic=self.critic, observation=torch.as_tensor(self.observed))  # the real one
        return self.plan.actions[:, 0].numpy()

    def observe(self, rewards, actions) -> None:
        for row in range(len(self.seeds)):
            self.contexts.append(row, self.observed[row], actions[row], rewards[row])
        self.step += 1

    def keep_rows(self, rows) -> None:
        self.seeds = [self.seeds[r] for r in rows]
        self.contexts.history = [self.contexts.history[r] for r in rows]

    def decision(self, row: int) -> Plan:
        """One environment's part of the last batched plan."""
        return Plan(*(getattr(self.plan, f)[row:row + 1] for f in self.plan.__dataclass_fields__))


def evaluate(model: TrajectoryGPT, tokenizer: TrajectoryTokenizer, env_id: str, seeds, planner: PlannerConfig,
             env_kwargs: dict | None = None, vectorized: bool = True, n_envs: int | None = None,
             asynchronous: bool = False, max_steps: int | None = None, record: bool = False,
             progress: bool = True, critic=None) -> EvalResult:
    """Play one episode per seed with the planner (`play` with a `PlannerAgent`); return their returns.

    `critic`: the Q critic a planner with value="critic" scores with (`critic.Critic`, e.g. `critic.load_critic`).
    `record` keeps the first episode's frames and plans, for videos and plots. The rest is `play`'s.
    """
    return play(PlannerAgent(model, tokenizer, planner, critic), env_id, seeds, env_kwargs, vectorized, n_envs,
                asynchronous, max_steps, record, progress)


# ---- the loop -----------------------------------------------------------------------------------------------------
@dataclass
class Episodes:
    """What a group of episodes played together gives back, in the order of its seeds."""
    returns: list[float]  # undiscounted return of every episode
    lengths: list[int]  # steps of every episode
    clipped: int = 0  # observation entries the agent clipped (the planner: outside the tokenizer's range)
    frames: list = field(default_factory=list)  # rgb frames of the group's first episode, if recorded
    plans: list = field(default_factory=list)  # (step, the agent's decision) of the group's first episode, if recorded


def play(agent: Agent, env_id: str, seeds, env_kwargs: dict | None = None, vectorized: bool = True,
         n_envs: int | None = None, asynchronous: bool = False, max_steps: int | None = None, record: bool = False,
         progress: bool = True) -> EvalResult:
    """Play one episode per seed with `agent` (ttlib.agents.protocol.Agent); return their returns.

    vectorized=True steps up to `n_envs` (default: all seeds) environments together and asks the agent for all of
    them in one call; False plays the episodes one after another. `asynchronous`: each environment in a process of
    its own (gymnasium's AsyncVectorEnv). `max_steps` cuts episodes short (fast demos). `record` keeps the first
    episode's frames (rgb_array) and the agent's decisions (the planner's plans), for videos and plots.
    """
    seeds = [int(s) for s in seeds]
    check_episodes(seeds, n_envs, max_steps)
    wave = (n_envs or len(seeds)) if vectorized else 1
    t0 = time.perf_counter()
    played = []
    bar = tqdm(total=len(seeds), desc="episodes", unit="ep", disable=not progress, mininterval=1.0,
               miniters=0)  # redrawn once a second at most, also between episodes (update(0) each step)
    for start in range(0, len(seeds), wave):
        first = record and start == 0
        batch = EpisodeBatch(agent, env_id, seeds[start:start + wave], env_kwargs, max_steps,
                             asynchronous and vectorized, render=first)
        try:
            played.append(batch.reset().play(bar, record=first))
        finally:
            batch.close()
    bar.close()
    return EvalResult(seeds, np.array([r for p in played for r in p.returns]),
                      np.array([n for p in played for n in p.lengths]), time.perf_counter() - t0,
                      sum(p.clipped for p in played), played[0].frames, played[0].plans)


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
    """E episodes played together by one agent in one vector environment: the one place ttlib steps environments
    to evaluate an agent (tests/test_structure.py checks it).

    `observations()` are the running environments' observations, in the agent's row order; `act(actions)` steps
    them, tells the agent what came of it, drops the rows of the episodes that ended and returns those episodes'
    indices; `play()` does both until every episode has ended. The same object serves one process (`play`) and
    Ray's workers (ttlib.evaluation.ray_evaluation), so every layout steps episodes exactly alike.
    """

    def __init__(self, agent: Agent, env_id: str, seeds, env_kwargs: dict | None = None,
                 max_steps: int | None = None, asynchronous: bool = False, render: bool = False):
        self.agent, self.seeds = agent, [int(s) for s in seeds]
        E = len(self.seeds)
        render_mode = "rgb_array" if render else None
        env_fns = [lambda: make_env(env_id, env_kwargs, render_mode) for _ in range(E)]
        self.envs = gym.vector.AsyncVectorEnv(env_fns) if asynchronous else gym.vector.SyncVectorEnv(env_fns)
        try:
            check_spaces(self.envs.single_observation_space, self.envs.single_action_space, agent)
        except BaseException:
            self.envs.close()
            raise
        self.asynchronous, self.max_steps = asynchronous, max_steps
        self.returns, self.lengths = np.zeros(E), np.zeros(E, dtype=int)
        self.running = np.ones(E, dtype=bool)
        self.step = 0  # steps taken so far (the same for every running environment)
        self.obs = None

    def reset(self) -> EpisodeBatch:
        self.obs, _ = self.envs.reset(seed=self.seeds)
        self.agent.start(self.seeds)
        return self

    def observations(self) -> np.ndarray:
        """(n, obs_dim): what the running environments show, in the agent's row order."""
        return self.obs[np.flatnonzero(self.running)]

    def act(self, actions) -> list[int]:
        """Step the running environments with their actions (n, act_dim); -> indices of episodes that ended."""
        space = self.envs.single_action_space
        active = np.flatnonzero(self.running)
        full = np.zeros((len(self.seeds), *space.shape), dtype=np.float32)
        full[active] = np.clip(np.asarray(actions), space.low, space.high)
        next_obs, reward, terminated, truncated, _ = self.envs.step(full)
        self.agent.observe(reward[active], full[active])
        ended = record_step(self.returns, self.lengths, self.running, reward, terminated, truncated, self.max_steps)
        if len(ended):
            self.agent.keep_rows(np.flatnonzero(self.running[active]))
        self.obs = next_obs
        self.step += 1
        return [int(e) for e in ended]

    def play(self, bar=None, record: bool = False) -> Episodes:
        """Act and step until every episode has ended; `bar` (tqdm) counts the episodes; `record`: keep the first
        episode's frames and the agent's decisions for it."""
        frames, decisions = [], []
        while self.running.any():
            first = record and self.running[0]
            if first:
                frames.append(self.render_first())
            actions = self.agent.act(self.observations())
            decision = self.agent.decision(0) if first else None
            if decision is not None:
                decisions.append((self.step, decision))
            ended = self.act(actions)
            if bar is not None:  # moves every step, also while no episode has ended yet; drawn at most once a
                bar.set_postfix_str(f"step {self.step}", refresh=False)  # second (tqdm's mininterval): a notebook's
                bar.update(len(ended))  # progress widget then sends a few hundred messages, not one a step
        return Episodes(list(self.returns), list(self.lengths), self.agent.clipped, frames, decisions)

    def render_first(self):
        return self.envs.envs[0].render() if not self.asynchronous else self.envs.call("render")[0]

    def close(self) -> None:
        self.envs.close()


def save_video(frames, path: str, fps: int = 30) -> str:
    """Write rgb frames to a GIF or MP4 (by extension), atomically. MP4 needs imageio-ffmpeg."""
    import imageio.v2 as imageio

    if not frames:
        raise ConfigError("no frames to save: evaluate with record=True")
    suffix = os.path.splitext(path)[1].lower() or ".gif"
    with atomic_path(path) as tmp:
        if suffix == ".gif":
            imageio.mimsave(tmp, frames, format="GIF", duration=1000 / fps, loop=0)
        else:
            imageio.mimsave(tmp, frames, format=suffix[1:].upper(), fps=fps)
    return path
