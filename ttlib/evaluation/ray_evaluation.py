"""Evaluation spread over Ray actors: more processes (or machines), the same returns as one process.

When evaluating outgrows one process, we hand the work to Ray, an existing distributed engine: it starts worker
processes ("actors") on the machines of a cluster -- or on this machine with `ray.init()` -- and moves Python
objects between them through its object store. Two layouts, after the two big designs of distributed RL:

    local inference (Menger)      K workers; each holds a copy of the model and a slice of the episodes in its own
                                  vector environment, plans for them itself and sends back only their returns.
                                  Messages: one per slice. Inference: K smaller batches, side by side.

    central inference (SEED RL)   K environment workers only step environments. At every step each sends its
                                  contexts (a few bins per environment) to one planner actor, which holds the only
                                  model, plans for all environments in one beam search and sends each worker its
                                  actions. Messages: two per worker per step. Inference: one large batch, where an
                                  accelerator is at its best.

The weights travel once: the driver puts them into the object store (`ray.put`) and every model-holding actor is
created with that reference -- also when Ray restarts it after a crash. An episode's planner keys depend only on
its seed and step (rollout.py), so both layouts return the returns `rollout.evaluate` returns for the same seeds.

Actors die (a machine is preempted, a process runs out of memory). Ray restarts a dead actor (`max_restarts`);
the driver notices the failed call and runs the episodes that were not finished again -- a local worker's whole
slice, or an environment worker's unfinished episodes. Every episode's result is recorded exactly once, by its
position in `seeds`.
"""

from __future__ import annotations

import contextlib
import os
import time
import warnings
from collections import deque
from dataclasses import dataclass

import numpy as np
import torch
from tqdm.auto import tqdm

from ttlib.agents.critic import Critic, critic_from_payload, critic_payload
from ttlib.course import threads as torch_threads
from ttlib.errors import ConfigError
from ttlib.evaluation.ray_cluster import DistributedError, cluster_cpus, connect
from ttlib.evaluation.rollout import EpisodeBatch, EvalResult, PlannerAgent, check_episodes, check_spaces, make_env
from ttlib.model.gpt import GPTConfig, TrajectoryGPT
from ttlib.model.tokenizer import TrajectoryTokenizer
from ttlib.planning.beam import PlannerConfig, beam_plan
from ttlib.planning.fast_decoder import BufferPool

__all__ = ["DiesAt", "DistributedResult", "EnvWorker", "LocalWorker", "MAX_ATTEMPTS", "MAX_RESTARTS", "ModelActor",
           "Planner", "RayEvaluator", "evaluate_distributed", "fetch", "merge_observations", "pack", "slices",
           "split_actions", "unpack", "unpack_critic"]

MAX_RESTARTS = 3  # times Ray restarts a dead actor
MAX_ATTEMPTS = 3  # times an episode is started before the evaluation gives up on it


@dataclass
class DistributedResult(EvalResult):
    layout: str = "local"  # "local" (every worker holds the model) or "central" (one planner actor)
    workers: int = 1  # workers holding environments
    actor_deaths: int = 0  # failed calls because an actor died (each actor is restarted by Ray)
    reruns: int = 0  # episodes started again because the actor running them died


# ---- what the object store holds: the model, once ---------------------------------------------------------
def pack(model: TrajectoryGPT, tokenizer: TrajectoryTokenizer, critic: Critic | None = None) -> dict:
    """Everything an actor needs to rebuild the model: config, weights (on the CPU), dtype, tokenizer, and the
    Q critic a planner with value="critic" scores with (None: none)."""
    return {"config": model.config_dict(), "state": {k: v.detach().cpu() for k, v in model.state_dict().items()},
            "dtype": str(next(model.parameters()).dtype).removeprefix("torch."), "tokenizer": tokenizer.state_dict(),
            "critic": critic_payload(critic) if critic is not None else None}


def unpack(bundle: dict, device: str = "cpu"):
    """-> (model in eval mode, tokenizer), exactly the packed ones."""
    from ttlib.training.checkpoints import load_weights

    model = TrajectoryGPT(GPTConfig(**bundle["config"])).to(getattr(torch, bundle["dtype"]))
    load_weights(model, bundle["state"], source="the object store")
    return model.to(device).eval(), TrajectoryTokenizer.from_state_dict(bundle["tokenizer"])


def unpack_critic(bundle: dict, device: str = "cpu") -> Critic | None:
    """The packed critic, or None."""
    if bundle.get("critic") is None:
        return None
    c = bundle["config"]
    return critic_from_payload(bundle["critic"], c["obs_dim"], c["act_dim"], "the object store").to(device)


# ---- the actors (plain classes; Ray turns them into actors with ray.remote) ---------------------------------
def fetch(shared: list):
    """The object behind [reference]: an actor fetches the weights from the object store itself (also after a
    restart); wrapping the reference in a list keeps Ray from resolving it as a constructor argument."""
    import ray

    return ray.get(shared[0])


class ModelActor:
    """An actor that holds the model: its weights fetched from the object store, on `threads` CPU threads."""

    def __init__(self, weights: list, threads: int = 1, device: str = "cpu"):
        torch_threads.fit(threads)  # kept: the episode loop's keep_fitting leaves a chosen count alone
        bundle = fetch(weights)
        self.model, self.tokenizer = unpack(bundle, device)
        self.critic = unpack_critic(bundle, device)
        self.device = device
        self.buffers = BufferPool()  # the planner's cache buffers, kept from one plan to the next

    def ping(self, payload=None) -> int:
        return os.getpid()


class LocalWorker(ModelActor):
    """Local inference: a model of its own, and one slice of episodes at a time, played by rollout's loop."""

    def run(self, env_id, env_kwargs, seeds, planner, max_steps, kill_at_step=None):
        """Play `seeds` to the end; -> (returns, lengths, clipped observations). kill_at_step: exit abruptly there."""
        agent = PlannerAgent(self.model, self.tokenizer, planner, self.critic, self.buffers)
        batch = EpisodeBatch(DiesAt(agent, kill_at_step), env_id, seeds, env_kwargs, max_steps)
        try:
            played = batch.reset().play()
            return played.returns, played.lengths, played.clipped
        finally:
            batch.close()


class DiesAt:
    """An agent that makes its process exit abruptly when it is asked to act at step `step` (None: never), as a
    preempted machine would: a test hook. Everything else is the agent's."""

    def __init__(self, agent, step: int | None):
        self.agent, self.step, self.acted = agent, step, 0

    def __getattr__(self, name):
        return getattr(self.agent, name)

    def act(self, observations):
        if self.acted == self.step:
            os._exit(1)
        self.acted += 1
        return self.agent.act(observations)


class EnvWorker:
    """Central inference: environments only. Sends contexts out, takes actions in."""

    def __init__(self, env_id: str, env_kwargs: dict | None, weights: list):
        self.env_id, self.env_kwargs = env_id, env_kwargs
        self.tokenizer = TrajectoryTokenizer.from_state_dict(fetch(weights)["tokenizer"])
        self.batch = None

    def ping(self, payload=None) -> int:
        return os.getpid()

    def start(self, seeds, planner: PlannerConfig, max_steps: int | None) -> dict:
        if self.batch is not None:
            self.batch.close()
        self.agent = PlannerAgent(None, self.tokenizer, planner)  # the contexts and keys: the planning is elsewhere
        self.batch = EpisodeBatch(self.agent, self.env_id, seeds, self.env_kwargs, max_steps).reset()
        return self._observation([])

    def step(self, actions, kill: bool = False) -> dict:
        if kill:
            os._exit(1)  # a test hook: die mid-episode
        return self._observation(self.batch.act(actions))

    def _observation(self, ended) -> dict:
        """What the driver and the planner need: the running environments' contexts, and finished episodes."""
        b = self.batch
        out = {"ended": [(int(e), float(b.returns[e]), int(b.lengths[e])) for e in ended],
               "running": int(b.running.sum()), "clipped": self.agent.clipped}
        if b.running.any():
            observations = b.observations()
            prefix, keys = self.agent.request(observations)
            out["prefix"], out["keys"] = prefix.numpy(), keys.numpy()  # (n, P) bins, (n,) random keys
            out["observation"] = np.asarray(observations, dtype=np.float32)  # (n, O) as the environments gave them
        return out


class Planner(ModelActor):
    """Central inference: the only model. Plans for every environment of every worker in one beam search."""

    def plan(self, planner: PlannerConfig, kill: bool, *observations):
        """observations: one dict per worker (its contexts) -> one (n_i, act_dim) action array per worker."""
        if kill:
            os._exit(1)  # a test hook
        prefix, keys, counts = merge_observations(observations)
        real = [o.get("observation") for o in observations]  # what the critic scores (None: the decoded prefix)
        real = None if any(r is None for r in real) else torch.as_tensor(np.concatenate(real))  # (N, O)
        plan = beam_plan(self.model, self.tokenizer, prefix.to(self.device), keys, planner, self.buffers,
                         critic=self.critic, observation=real)
        parts = split_actions(plan.actions[:, 0].numpy(), counts)
        return tuple(parts) if len(parts) > 1 else parts[0]


# ---- the bookkeeping both layouts share -----------------------------------------------------------------------
def slices(n: int, workers: int) -> list[list[int]]:
    """Positions 0..n-1 cut into contiguous slices, one per worker, sizes differing by at most one (the first
    n % workers slices get the extra one); never an empty slice, so fewer slices than workers if n < workers."""
    return [list(s) for s in np.array_split(np.arange(n), min(workers, n)) if len(s)] if n else []


def merge_observations(observations):
    """Central inference: every worker's contexts in one batch, in worker order.

    observations: one dict per worker with "prefix" (n_i, P) bins and "keys" (n_i,) -> (prefix (N, P) long
    tensor, keys (N,) int64 tensor, counts [n_i]), N = sum n_i.
    """
    prefix = torch.as_tensor(np.concatenate([o["prefix"] for o in observations]), dtype=torch.long)  # (N, P)
    keys = torch.as_tensor(np.concatenate([o["keys"] for o in observations]), dtype=torch.int64)  # (N,)
    return prefix, keys, [len(o["keys"]) for o in observations]


def split_actions(actions, counts) -> list:
    """(N, act_dim) actions of the merged batch -> one (n_i, act_dim) array per worker, in worker order."""
    return np.split(np.asarray(actions), np.cumsum(counts)[:-1])


# ---- the driver -----------------------------------------------------------------------------------------------
class RayEvaluator:
    """Ray actors ready to evaluate a model: `workers` local-inference workers, or (central=True) that many
    environment workers and one planner. Create once, evaluate many times, close (or use `with`).

    address: an existing cluster ("host:port", "ray://host:port"; default $RAY_ADDRESS); none starts a local one
    (`num_cpus`, `temp_dir`) that `close()` shuts down again. A cluster that was already running stays up.
    critic: the Q critic that planners with value="critic" score with, sent to the actors with the weights.
    """

    def __init__(self, model: TrajectoryGPT, tokenizer: TrajectoryTokenizer, env_id: str, workers: int = 2,
                 central: bool = False, env_kwargs: dict | None = None, address: str | None = None,
                 num_cpus: int | None = None, temp_dir: str | None = None, planner_cpus: int = 1,
                 device: str = "cpu", critic: Critic | None = None):
        if workers < 1:
            raise ConfigError(f"workers must be >= 1, got {workers}")
        env = make_env(env_id, env_kwargs)  # a misfit fails here, in this process, before any actor starts
        try:
            check_spaces(env.observation_space, env.action_space, PlannerAgent(None, tokenizer, None))
        finally:
            env.close()
        self.model, self.tokenizer, self.critic = model, tokenizer, critic
        self.env_id, self.env_kwargs = env_id, env_kwargs
        self.n_workers, self.central, self.workers, self.planner = workers, central, [], None
        self.ray, self.started = connect(address, num_cpus, temp_dir)
        ray = self.ray
        try:
            cpus = cluster_cpus(ray)
            if workers > cpus:
                warnings.warn(f"{workers} workers on a cluster of {cpus:g} CPUs: they will share CPUs (correct, "
                              f"but not faster than {cpus:g} workers)", stacklevel=2)
            gpus = 1 if device.startswith("cuda") else 0
            self.weights = ray.put(pack(model, tokenizer, critic))  # the one copy of the weights, in the object store
            restartable = dict(max_restarts=MAX_RESTARTS, max_task_retries=0)
            if central:
                planner_cpus = min(planner_cpus, cpus)
                share = max(0.01, min(1.0, (cpus - planner_cpus) / workers))
                self.planner = ray.remote(Planner).options(num_cpus=planner_cpus, num_gpus=gpus, **restartable) \
                    .remote([self.weights], max(1, int(planner_cpus)), device)
                self.tokenizer_ref = ray.put({"tokenizer": tokenizer.state_dict()})  # kept: restarts read it
                self.workers = [ray.remote(EnvWorker).options(num_cpus=share, **restartable)
                                .remote(env_id, env_kwargs, [self.tokenizer_ref]) for _ in range(workers)]
            else:
                share = min(1.0, cpus / workers)
                self.workers = [ray.remote(LocalWorker).options(num_cpus=share, num_gpus=gpus / workers,
                                                                **restartable)
                                .remote([self.weights], 1, device) for _ in range(workers)]
            ray.get([w.ping.remote() for w in self.actors])  # wait until every actor is up
        except BaseException:
            self.close()
            raise

    @property
    def actors(self) -> list:
        return self.workers + ([self.planner] if self.planner is not None else [])

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def close(self) -> None:
        """Stop the actors; shut the cluster down if this evaluator started it."""
        ray = self.ray
        for actor in self.actors:
            with contextlib.suppress(Exception):
                ray.kill(actor)
        self.workers, self.planner = [], None
        if self.started and ray.is_initialized():
            ray.shutdown()
        self.started = False

    def call_seconds(self, repeats: int = 200, payload=None) -> float:
        """Median seconds of one round trip to an actor (a method that does nothing), `payload` as argument."""
        actor = self.workers[0]
        self.ray.get(actor.ping.remote(payload))
        times = []
        for _ in range(repeats):
            t = time.perf_counter()
            self.ray.get(actor.ping.remote(payload))
            times.append(time.perf_counter() - t)
        return float(np.median(times))

    def evaluate(self, seeds, planner: PlannerConfig, max_steps: int | None = None, progress: bool = True,
                 kill_worker_at: tuple[int, int] | None = None, kill_planner_at: int | None = None
                 ) -> DistributedResult:
        """Play one episode per seed, spread over the workers; -> the returns, in the order of `seeds`.

        kill_worker_at=(worker, step): that worker exits abruptly at that step of its first slice, and
        kill_planner_at=step makes the central planner do so -- to watch recovery (tests, notebook 08).
        """
        seeds = [int(s) for s in seeds]
        PlannerAgent(self.model, self.tokenizer, planner, self.critic)  # fails if the planner does not fit them
        t0 = time.perf_counter()
        bar = tqdm(total=len(seeds), desc=f"episodes on {self.n_workers} Ray workers", unit="ep",
                   disable=not progress)
        try:
            run = self._evaluate_central if self.central else self._evaluate_local
            returns, lengths, clipped, deaths, reruns = run(seeds, planner, max_steps, bar, kill_worker_at,
                                                            kill_planner_at)
        finally:
            bar.close()
        return DistributedResult(seeds, returns, lengths, time.perf_counter() - t0, clipped,
                                 layout="central" if self.central else "local", workers=self.n_workers,
                                 actor_deaths=deaths, reruns=reruns)

    def _wait_restarted(self, actor, timeout: float = 120.0) -> None:
        """Block until Ray has restarted a dead actor (calls to an actor that is restarting fail at once)."""
        ray, deadline = self.ray, time.monotonic() + timeout
        while True:
            try:
                ray.get(actor.ping.remote(), timeout=timeout)
                return
            except ray.exceptions.RayActorError as e:
                if time.monotonic() > deadline:
                    raise DistributedError(f"a dead actor did not come back within {timeout:g} s: {e}") from None
                time.sleep(0.2)

    def _evaluate_local(self, seeds, planner, max_steps, bar, kill_worker_at, kill_planner_at):
        ray = self.ray
        returns, lengths = np.full(len(seeds), np.nan), np.zeros(len(seeds), dtype=int)
        done = np.zeros(len(seeds), dtype=bool)
        queue = deque(slices(len(seeds), self.n_workers))  # slices waiting for a worker
        attempts = {tuple(s): 0 for s in queue}
        idle, in_flight = deque(range(self.n_workers)), {}
        clipped = deaths = reruns = 0
        while queue or in_flight:
            while queue and idle:
                w, positions = idle.popleft(), queue.popleft()
                kill = None
                if kill_worker_at is not None and kill_worker_at[0] == w:
                    kill, kill_worker_at = kill_worker_at[1], None  # once
                attempts[tuple(positions)] += 1
                ref = self.workers[w].run.remote(self.env_id, self.env_kwargs, [seeds[p] for p in positions],
                                                 planner, max_steps, kill)
                in_flight[ref] = (w, positions)
            [ref], _ = ray.wait(list(in_flight), num_returns=1)
            w, positions = in_flight.pop(ref)
            idle.append(w)
            try:
                r, n, c = ray.get(ref)
            except ray.exceptions.RayActorError:
                deaths += 1
                self._wait_restarted(self.workers[w])
                if attempts[tuple(positions)] >= MAX_ATTEMPTS:
                    raise DistributedError(f"episodes {[seeds[p] for p in positions]} failed {MAX_ATTEMPTS} times: "
                                           f"their worker keeps dying") from None
                reruns += len(positions)
                queue.appendleft(positions)
                continue
            for p, ret, length in zip(positions, r, n, strict=True):
                _record(p, ret, length, returns, lengths, done, seeds)
            clipped += c
            bar.update(len(positions))
        return returns, lengths, clipped, deaths, reruns

    def _evaluate_central(self, seeds, planner, max_steps, bar, kill_worker_at, kill_planner_at):
        ray = self.ray
        returns, lengths = np.full(len(seeds), np.nan), np.zeros(len(seeds), dtype=int)
        done = np.zeros(len(seeds), dtype=bool)
        attempts = np.zeros(len(seeds), dtype=int)
        clipped = deaths = reruns = 0
        waiting = slices(len(seeds), self.n_workers)  # per worker: positions still to play
        while any(waiting):
            # a wave: every worker with episodes to play plays them, all in lockstep with the planner
            assignment = {w: positions for w, positions in enumerate(waiting) if positions}
            waiting = [[] for _ in range(self.n_workers)]
            for positions in assignment.values():
                attempts[positions] += 1
            refs = {w: self.workers[w].start.remote([seeds[p] for p in ps], planner, max_steps)
                    for w, ps in assignment.items()}
            step = 0
            while refs:
                observations = {}
                for w, ref in refs.items():  # gather every worker's contexts (and its finished episodes)
                    try:
                        observations[w] = ray.get(ref)
                    except ray.exceptions.RayActorError:
                        deaths += 1
                        self._wait_restarted(self.workers[w])
                        lost = [p for p in assignment[w] if not done[p]]
                        if (attempts[lost] >= MAX_ATTEMPTS).any():
                            raise DistributedError(f"episodes {[seeds[p] for p in lost]} failed {MAX_ATTEMPTS} "
                                                   f"times: their environment worker keeps dying") from None
                        reruns += len(lost)
                        waiting[w] = lost  # run again in the next wave, on the restarted worker
                for w, obs in observations.items():
                    for i, ret, length in obs["ended"]:
                        _record(assignment[w][i], ret, length, returns, lengths, done, seeds)
                        bar.update(1)
                    if not obs["running"]:
                        clipped += obs["clipped"]
                live = [w for w, obs in observations.items() if obs["running"]]
                if not live:
                    break
                kill = kill_planner_at is not None and step == kill_planner_at
                kill_planner_at = None if kill else kill_planner_at
                action_refs, planner_deaths = self._plan_for(planner, [refs[w] for w in live], kill)
                deaths += planner_deaths
                refs = {}
                for w, actions in zip(live, action_refs, strict=True):
                    kill = kill_worker_at is not None and kill_worker_at == (w, step)
                    kill_worker_at = None if kill else kill_worker_at
                    refs[w] = self.workers[w].step.remote(actions, kill)
                step += 1
                bar.set_postfix_str(f"step {step}")  # moves every step, also while no episode has ended yet
        return returns, lengths, clipped, deaths, reruns


    def _plan_for(self, planner, obs_refs: list, kill: bool):
        """One beam search for every running environment of every worker, in worker order. A planner that dies
        is restarted by Ray and asked again. -> (one actions ref per worker, how often the planner died)."""
        ray, deaths = self.ray, 0
        for attempt in range(MAX_ATTEMPTS + 1):
            action_refs = self.planner.plan.options(num_returns=len(obs_refs)).remote(planner, kill, *obs_refs)
            action_refs = action_refs if len(obs_refs) > 1 else [action_refs]
            try:
                ray.wait(action_refs, num_returns=len(action_refs))
                ray.get(action_refs[0])
                return action_refs, deaths
            except ray.exceptions.RayActorError:
                deaths += 1  # the planner died: Ray restarts it, and we ask again
                if attempt == MAX_ATTEMPTS:
                    raise DistributedError(f"the planner actor died {MAX_ATTEMPTS + 1} times") from None
                self._wait_restarted(self.planner)
                kill = False  # the test hook kills it once

def _record(p, ret, length, returns, lengths, done, seeds) -> None:
    """Store episode p's result: exactly once."""
    if done[p]:
        raise RuntimeError(f"episode {p} (seed {seeds[p]}) finished twice: a bug in the bookkeeping")
    returns[p], lengths[p], done[p] = ret, length, True


def evaluate_distributed(model: TrajectoryGPT, tokenizer: TrajectoryTokenizer, env_id: str, seeds,
                         planner: PlannerConfig, workers: int = 2, central: bool = False,
                         env_kwargs: dict | None = None, max_steps: int | None = None, address: str | None = None,
                         progress: bool = True, **options) -> DistributedResult:
    """One evaluation on Ray: start the actors, play the episodes, stop them (and a local cluster we started)."""
    check_episodes(list(seeds), None, max_steps)
    with RayEvaluator(model, tokenizer, env_id, workers, central, env_kwargs, address, **options) as evaluator:
        return evaluator.evaluate(seeds, planner, max_steps, progress)
