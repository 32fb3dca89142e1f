"""Notebook 07's exercises: a transition's tokens and the batched prefix, one planning call for all running
environments, and the vectorized rollout loop through Gymnasium's autoresets.

The planning exercises use a tiny random Trajectory GPT in float64 (its plans compare exactly however they are
batched) and the shipped checkpoint's tokenizer and environment. The loop is checked step by step: at every step,
which episodes it planned for and the actions it sent to the environments that play; then every episode's length
and return, and the steps it reported to the progress bar.
"""

from __future__ import annotations

import dataclasses
import functools

import gymnasium as gym
import numpy as np
import torch

from ttlib.evaluation import rollout
from ttlib.exercises import Exercise, Mistake
from ttlib.model.gpt import GPTConfig, TrajectoryGPT
from ttlib.planning import beam as planning

__all__ = ["EXERCISES", "LENT", "PLAN_TRIAL", "ROLLOUT_PLANNER", "StepCounter", "batched_planning", "contexts",
           "contexts_prefix", "contexts_trial", "course", "plan_trial", "recorded_plan_actions", "rollout_loop",
           "rollout_loop_single", "rollout_trial", "run_contexts", "run_plan", "run_rollout", "single_episode_trial",
           "tiny_model", "trial_envs", "ttlib_build_prefix", "ttlib_encode_transition", "ttlib_plan_actions"]


@functools.cache
def course():
    """(tokenizer, env_id, env_kwargs) of the shipped checkpoint: the notebook's `tok` and environment."""
    from ttlib.training.checkpoints import default_checkpoint, load_checkpoint

    _, tok, payload = load_checkpoint(default_checkpoint())
    return tok, payload["dataset"]["env_id"], payload["dataset"]["env_kwargs"]


def tiny_model(tok) -> TrajectoryGPT:
    """A small random model in float64, from the torch seed of the trial."""
    return TrajectoryGPT(GPTConfig(obs_dim=tok.obs_dim, act_dim=tok.act_dim, n_bins=tok.n_bins, n_layer=1, n_head=2,
                                   n_embd=32, n_transitions=4, dropout=0.0)).double().eval()


# ---- ttlib's pieces, as the notebook names them -----------------------------------------------------------------
def ttlib_encode_transition(tok, obs, action, reward):
    """The row rollout.Contexts keeps of a transition."""
    contexts = rollout.Contexts(tok, 1, 1)
    contexts.append(0, obs, action, reward)
    return contexts.history[0][-1]


def contexts_prefix(history, obs_bins, context):
    """rollout.Contexts.prefix of these histories, for observations already encoded."""
    contexts = rollout.Contexts(course()[0], len(history), context)
    contexts.history = [list(h) for h in history]
    contexts.encode_obs = np.asarray  # the bins are given
    return contexts.prefix(range(len(history)), obs_bins)


def ttlib_build_prefix(history, obs_bins, context):
    """Exercise 1's prefix, lent to the exercises after it (they may not call rollout.Contexts)."""
    rows = [np.concatenate([*h[len(h) - min(len(h), context - 1):], o]) for h, o in zip(history, obs_bins,
                                                                                         strict=True)]
    return torch.as_tensor(np.stack(rows), dtype=torch.long)  # (n, P)


def ttlib_plan_actions(model, tok, planner, history, observations, seeds, steps, buffers=None):
    """One beam_plan call per prefix length, keys from each episode's seed and step, as rollout.evaluate plans."""
    obs_bins = tok.encode(np.asarray(observations), slice(0, tok.obs_dim), on_clip="ignore")  # (n, obs_dim)
    keys = torch.tensor([rollout.step_key(s, t) for s, t in zip(seeds, steps, strict=True)], dtype=torch.int64)
    sizes = np.array([min(len(past), planner.context - 1) for past in history])
    actions = np.zeros((len(history), tok.act_dim), dtype=np.float32)
    for size in np.unique(sizes):
        group = np.flatnonzero(sizes == size)
        prefix = ttlib_build_prefix([history[i] for i in group], obs_bins[group], planner.context)
        plan = planning.beam_plan(model, tok, prefix.to(model.pos_emb.device), keys[group], planner, buffers)
        actions[group] = plan.actions[:, 0].cpu().numpy()
    return actions


# ---- exercise 1: a transition's tokens, the batched prefix -------------------------------------------------------
def contexts_trial(rng):
    """A transition (some values a little outside the tokenizer's range, as real observations can be), and the
    histories of 1-5 environments with as many past transitions each (with context 1, at least two: the prefix
    must leave them all out)."""
    tok = course()[0]
    low, high = tok.edges[:, 0], tok.edges[:, -1]
    row = rng.uniform(low - 0.1 * (high - low), high + 0.1 * (high - low))
    transition = row[:tok.obs_dim], row[tok.obs_dim:tok.obs_dim + tok.act_dim], float(row[tok.reward_dim])
    E, context = int(rng.integers(1, 6)), int(rng.integers(1, 6))
    n_past = int(rng.integers(2, 4) if context == 1 else rng.integers(0, context + 3))
    history = [[rng.integers(0, tok.n_bins, size=tok.transition_dim) for _ in range(n_past)] for _ in range(E)]
    return transition, (history, rng.integers(0, tok.n_bins, size=(E, tok.obs_dim)), context)


def run_contexts(answer, trial):
    tok = course()[0]
    (obs, action, reward), (history, obs_bins, context) = trial
    row = answer.encode_transition(tok, obs.copy(), action.copy(), reward)
    prefix = answer.build_prefix([list(h) for h in history], obs_bins.copy(), context)
    where = f"{len(history)} environments with {len(history[0])} past transitions each, context {context}"
    return {"encode_transition(tok, obs, action, reward)": row,
            f"build_prefix ({where}): its type and dtype":
                f"{type(prefix).__name__} {str(getattr(prefix, 'dtype', '')).replace('torch.', '')}",
            f"build_prefix ({where})": prefix}


def _encode_with(value_bin_zero=True):
    def encode_transition(tok, obs, action, reward):
        bins = tok.encode(np.concatenate([obs, action, [reward, 0.0]]), on_clip="ignore")
        if value_bin_zero:
            bins[tok.value_dim] = 0
        return bins

    return encode_transition


def _prefix_with(recent):
    """A wrong build_prefix: recent(past, context) -> the transitions it keeps, then the observation."""
    def build_prefix(history, obs_bins, context):
        rows = [np.concatenate([*recent(past, context), obs]) for past, obs in zip(history, obs_bins, strict=True)]
        return torch.as_tensor(np.stack(rows), dtype=torch.long)

    return build_prefix


def _obs_first(history, obs_bins, context):
    rows = [np.concatenate([obs, *past[len(past) - min(len(past), context - 1):]])
            for past, obs in zip(history, obs_bins, strict=True)]
    return torch.as_tensor(np.stack(rows), dtype=torch.long)


def _contexts_with(encode=ttlib_encode_transition, prefix=ttlib_build_prefix):
    return {"encode_transition": encode, "build_prefix": prefix}


contexts = Exercise(
    id="07-contexts", number=1, what="your encode_transition and build_prefix",
    names=("encode_transition", "build_prefix"), trial=contexts_trial, run=run_contexts,
    reference=_contexts_with(prefix=contexts_prefix),
    forbid=(rollout.Contexts.append, rollout.Contexts.prefix, rollout.Contexts.encode_obs,
            rollout.PlannerAgent.request),
    trials=12, hidden_trials=20, passed="your transitions and prefixes are the ones ttlib's rollout plans from.",
    mistakes=[
        Mistake("the value token keeps the bin of the value 0.0: it never reaches the model (the value rule), so "
                "the rollout sets its bin to 0 -- `bins[tok.value_dim] = 0`.",
                _contexts_with(encode=_encode_with(value_bin_zero=False))),
        Mistake("the prefix holds the last `context` transitions, one too many: with the observation the planner "
                "sees context - 1 past transitions.",
                _contexts_with(prefix=_prefix_with(lambda past, c: past[len(past) - min(len(past), c):]))),
        Mistake("with context 1 the prefix must hold the observation only, but `h[-(context - 1):]` is `h[-0:]`, "
                "the whole history: take `h[len(h) - min(len(h), context - 1):]`.",
                _contexts_with(prefix=_prefix_with(lambda past, c: past[-(c - 1):]))),
        Mistake("the observation comes before the history: a prefix reads in time order, the past transitions "
                "first, then the current observation.", _contexts_with(prefix=_obs_first)),
        Mistake("the history is in reverse order: its transitions are oldest first, as the episode played them.",
                _contexts_with(prefix=_prefix_with(lambda past, c: past[len(past) - min(len(past), c - 1):][::-1]))),
        Mistake("the prefix takes the *first* transitions of the history, not the last: the planner needs the most "
                "recent ones, `h[len(h) - min(len(h), context - 1):]`.",
                _contexts_with(prefix=_prefix_with(lambda past, c: past[:min(len(past), c - 1)]))),
    ],
)


# ---- exercise 2: one planning call per prefix length -------------------------------------------------------------
PLAN_TRIAL = dict(beam_width=3, horizon=2, sample_expand=2)


def plan_trial(rng):
    """n environments, each with a history of its own length, their observations, seeds and steps."""
    tok = course()[0]
    model = tiny_model(tok)
    n, context = int(rng.integers(1, 6)), int(rng.integers(1, 4))
    planner = planning.PlannerConfig(**PLAN_TRIAL, context=context)
    low, high = tok.edges[:, 0], tok.edges[:, -1]
    history = [[rng.integers(0, tok.n_bins, size=tok.transition_dim) for _ in range(int(rng.integers(0, 4)))]
               for _ in range(n)]
    observations = rng.uniform(low[:tok.obs_dim], high[:tok.obs_dim], size=(n, tok.obs_dim))
    return model, planner, history, observations, rng.integers(0, 1000, size=n), rng.integers(0, 300, size=n)


def run_plan(answer, trial):
    tok = course()[0]
    model, planner, history, observations, seeds, steps = trial
    calls, search = [], planning.search_beams

    def counted(model, tokenizer, prefix, keys, *rest, **kwargs):  # every search beam_plan runs, however called
        calls.append(keys.to(torch.int64).cpu().numpy().copy())
        return search(model, tokenizer, prefix, keys, *rest, **kwargs)

    planning.search_beams = counted
    try:
        actions = answer.plan_actions(model, tok, planner, [list(h) for h in history], observations.copy(),
                                      seeds.copy(), steps.copy(), None)
    finally:
        planning.search_beams = search
    keys = np.sort(np.concatenate(calls)) if calls else np.zeros(0, dtype=np.int64)
    sizes = [min(len(h), planner.context - 1) for h in history]
    return {"the random keys of every beam_plan call (sorted)": keys,
            f"environments in each beam_plan call (sorted; past transitions per prefix: {sizes})":
                np.sort(np.array([len(c) for c in calls], dtype=np.int64)),
            f"plan_actions for {len(history)} environments: the first action of every best plan": actions}


def _plan_with(keys_from="seed", first=True, with_history=True, grouped=True, per_environment=False):
    def plan_actions(model, tok, planner, history, observations, seeds, steps, buffers=None):
        obs_bins = tok.encode(np.asarray(observations), slice(0, tok.obs_dim), on_clip="ignore")
        pairs = {"seed": zip(seeds, steps, strict=True), "place": zip(range(len(seeds)), steps, strict=True),
                 "swapped": zip(steps, seeds, strict=True)}[keys_from]
        keys = torch.tensor([rollout.step_key(s, t) for s, t in pairs], dtype=torch.int64)
        sizes = np.array([min(len(past), planner.context - 1) for past in history])
        if per_environment:
            sizes = np.arange(len(history))
        elif not grouped:
            sizes = np.zeros(len(history))
        actions = np.zeros((len(history), tok.act_dim), dtype=np.float32)
        for size in np.unique(sizes):
            group = np.flatnonzero(sizes == size)
            past = [history[i] if with_history else [] for i in group]
            prefix = ttlib_build_prefix(past, obs_bins[group], planner.context)
            plan = planning.beam_plan(model, tok, prefix, keys[group], planner, buffers)
            actions[group] = plan.actions[:, 0 if first else -1].numpy()
        return actions

    return {"plan_actions": plan_actions}


LENT = {"encode_transition": ttlib_encode_transition, "build_prefix": ttlib_build_prefix}

batched_planning = Exercise(
    id="07-plan-actions", number=2, what="your plan_actions", names=("plan_actions",), trial=plan_trial,
    run=run_plan, reference={"plan_actions": ttlib_plan_actions}, lends=LENT,
    forbid=(rollout.Contexts.prefix, rollout.Contexts.encode_obs, rollout.PlannerAgent.request,
            rollout.PlannerAgent.act, rollout.evaluate, rollout.play),
    atol=1e-6, trials=6, hidden_trials=10,
    passed="one planning call per prefix length, and the actions ttlib's rollout takes.",
    mistakes=[
        Mistake("the random keys come from the environments' places in the batch, not their episodes' seeds: "
                "key = rollout.step_key(seed, step), so an episode plans the same wherever it runs.",
                _plan_with(keys_from="place")),
        Mistake("seed and step are swapped in the key: rollout.step_key(seed, step).", _plan_with(keys_from="swapped")),
        Mistake("this executes the *last* action of every plan: the rollout takes the first, plan.actions[:, 0], "
                "and plans again at the next step.", _plan_with(first=False)),
        Mistake("the history is left out of the prefix: each environment's prefix holds its last context - 1 "
                "transitions, then its observation (build_prefix with its history).",
                _plan_with(with_history=False)),
        Mistake("prefixes of different lengths go into one call: a batch is one tensor, so plan once per prefix "
                "length (min(len(h), context - 1) past transitions), each call for the environments that share it.",
                _plan_with(grouped=False)),
        Mistake("this makes one beam_plan call per environment: the point of a vector rollout is one call for all "
                "environments whose prefixes have the same length.", _plan_with(per_environment=True)),
    ],
)


# ---- exercise 3: the loop ------------------------------------------------------------------------------------------
ROLLOUT_PLANNER = planning.PlannerConfig(beam_width=2, horizon=1, sample_expand=2, context=2)


class _Recording:
    """The loop's trial as the answer sees it: a vector environment that writes down every step, and the lent
    plan_actions writing down whom it planned for."""

    active: _Recording | None = None  # the recording under way, if any

    def __init__(self, envs: gym.vector.SyncVectorEnv, schedule, limits):
        self.envs, self.schedule = envs, schedule
        self.steps = 0  # envs.step calls so far
        self.planned: dict[int, list] = {}  # step -> [(seed, step of its episode)] planned for before it
        self.actions: list[np.ndarray] = []  # per step: the actions of the environments that play
        self.autoreset = np.zeros(len(schedule), dtype=bool)
        # every scheduled episode is over by then (+1: an autoreset step after each)
        self.most_steps = max(sum(limit + 1 for _ in seeds) for seeds, limit in zip(schedule, limits, strict=True))

    def plays(self) -> np.ndarray:
        """(E,) bool: the environments that play a scheduled episode at the next step (not an autoreset)."""
        started = np.array([env.started for env in self.envs.envs])  # EpisodeSchedule: episodes started so far
        return ~self.autoreset & (started <= np.array([len(seeds) for seeds in self.schedule]))


class _RecordingEnvs:
    """What the answer gets as `envs`: the trial's SyncVectorEnv, whose steps are recorded."""

    def __init__(self, recording: _Recording):
        self._recording = recording

    def step(self, actions):
        rec = self._recording
        rec.steps += 1
        if rec.steps > rec.most_steps:
            raise AssertionError(f"your loop stepped the environments {rec.steps} times, but every scheduled episode "
                                 f"is over after {rec.most_steps}: does it stop once every environment has played its "
                                 "schedule, and move on to the next episode when one ends?")
        playing = rec.plays()
        rec.actions.append(np.array(actions, dtype=np.float64)[playing])
        observations, reward, terminated, truncated, info = rec.envs.step(actions)
        rec.autoreset = np.asarray(terminated) | np.asarray(truncated)
        return observations, reward, terminated, truncated, info

    def __getattr__(self, name):
        return getattr(self._recording.envs, name)


def recorded_plan_actions(model, tok, planner, history, observations, seeds, steps, buffers=None):
    """ttlib's plan_actions, lent to the loop: it also writes down the episodes it plans for."""
    recording = _Recording.active
    if recording is not None:
        recording.planned.setdefault(recording.steps + 1, []).extend(
            (int(s), int(t)) for s, t in zip(seeds, steps, strict=True))
    return ttlib_plan_actions(model, tok, planner, history, observations, seeds, steps, buffers)


def rollout_trial(rng):
    """2-3 environments playing 3-6 episodes (one environment may have none), each environment's episodes cut after
    its own number of steps, so that they end and autoreset at different times."""
    tok = course()[0]
    model = tiny_model(tok)
    E = int(rng.integers(2, 4))
    seeds = [int(s) for s in rng.choice(1000, size=int(rng.integers(E + 1, 2 * E + 1)), replace=False)]
    schedule = [seeds[e::E] for e in range(E)] + ([[]] if rng.random() < 0.3 else [])
    limits = [int(rng.integers(3, 9)) for _ in schedule]
    return model, schedule, limits


def trial_envs(schedule, limits) -> gym.vector.SyncVectorEnv:
    """Environment e plays the seeds schedule[e], each episode cut (truncated) after limits[e] steps."""
    _, env_id, env_kwargs = course()
    return gym.vector.SyncVectorEnv([
        lambda seeds=seeds, limit=limit: rollout.EpisodeSchedule(
            rollout.make_env(env_id, {**(env_kwargs or {}), "max_episode_steps": limit}), seeds)
        for seeds, limit in zip(schedule, limits, strict=True)])


class StepCounter:  # stands in for a progress bar: adds up what the loop reports
    def __init__(self):
        self.n = 0

    def update(self, n=1):
        self.n += int(n)


def run_rollout(answer, trial):
    tok = course()[0]
    model, schedule, limits = trial
    recording, counter = _Recording(trial_envs(schedule, limits), schedule, limits), StepCounter()
    _Recording.active = recording
    try:
        got = answer.vector_rollout(model, tok, _RecordingEnvs(recording), [list(s) for s in schedule],
                                    ROLLOUT_PLANNER, counter)
    finally:
        _Recording.active = None
        recording.envs.close()
    if not (isinstance(got, tuple) and len(got) == 2 and all(isinstance(d, dict) for d in got)):
        raise AssertionError("vector_rollout should return two dicts, returns[seed] and lengths[seed]")
    returns, lengths = got
    seeds = [seed for seeds in schedule for seed in seeds]
    missing = [s for s in seeds if s not in returns or s not in lengths]
    if missing:
        raise AssertionError(f"vector_rollout returned no return or length for the seeds {missing} (schedule "
                             f"{schedule})")
    outputs = {}
    for step, actions in enumerate(recording.actions, start=1):
        outputs[f"step {step}: the episodes planned for"] = ", ".join(
            f"seed {seed} at its step {t}" for seed, t in sorted(recording.planned.get(step, []))) or "none"
        outputs[f"step {step}: the actions sent to the environments that play"] = actions
    outputs[f"episode lengths (seeds {seeds})"] = np.array([lengths[s] for s in seeds], dtype=np.int64)
    outputs[f"episode returns (seeds {seeds})"] = np.array([returns[s] for s in seeds], dtype=np.float64)
    outputs["environment steps reported to the progress bar"] = counter.n
    return outputs


def _rollout_with(count_autoreset=False, reset_return=True, clear_history=True, keys="seed", bar="step",
                  until="any", step_from="episode"):
    """The loop of the notebook's solution; its arguments make the known mistakes."""

    def vector_rollout(model, tok, envs, schedule, planner, bar_=None):
        E, space = envs.num_envs, envs.single_action_space
        n_scheduled = np.array([len(seeds) for seeds in schedule])
        episode = np.zeros(E, dtype=int)  # which of its scheduled episodes each environment plays
        ep_return, ep_length = np.zeros(E), np.zeros(E, dtype=int)
        history = [[] for _ in range(E)]
        autoreset = np.zeros(E, dtype=bool)  # True: this environment's next step is Gymnasium's autoreset
        returns, lengths, t = {}, {}, 0
        obs, _ = envs.reset()
        while (episode < n_scheduled).any() if until == "any" else (episode < n_scheduled).all():
            playing = episode < n_scheduled
            active = np.flatnonzero(playing if count_autoreset else ~autoreset & playing)
            actions = np.zeros((E, *space.shape), dtype=np.float32)
            if len(active):
                seeds = [schedule[e][episode[e]] for e in active] if keys == "seed" else list(active)
                steps = ep_length[active] if step_from == "episode" else np.full(len(active), t)
                planned = recorded_plan_actions(model, tok, planner, [history[e] for e in active], obs[active],
                                                seeds, steps)
                actions[active] = np.clip(planned, space.low, space.high)
            next_obs, reward, terminated, truncated, _ = envs.step(actions)
            t += 1
            for e in active:
                history[e].append(ttlib_encode_transition(tok, obs[e], actions[e], reward[e]))
                del history[e][:-planner.context]
                ep_return[e] += reward[e]
                ep_length[e] += 1
                if terminated[e] or truncated[e]:
                    seed = schedule[e][episode[e]]
                    returns[seed], lengths[seed] = float(ep_return[e]), int(ep_length[e])
                    episode[e] += 1
                    ep_length[e] = 0
                    if reset_return:
                        ep_return[e] = 0.0
                    if clear_history:
                        history[e] = []
            autoreset = terminated | truncated
            obs = next_obs
            if bar_ is not None:
                bar_.update(len(active) if bar == "step" else int((terminated | truncated)[active].sum()))
        return returns, lengths

    return {"vector_rollout": vector_rollout}


rollout_loop = Exercise(
    id="07-vector-rollout", number="3b", what="your vector_rollout", names=("vector_rollout",), trial=rollout_trial,
    run=run_rollout, reference=_rollout_with(),
    lends={**LENT, "plan_actions": recorded_plan_actions},
    forbid=(rollout.evaluate, rollout.play, rollout.record_step, rollout.EpisodeBatch.__init__,
            rollout.EpisodeBatch.reset, rollout.EpisodeBatch.observations, rollout.EpisodeBatch.act,
            rollout.EpisodeBatch.play, rollout.PlannerAgent.act, rollout.PlannerAgent.observe),
    atol=1e-6, rtol=1e-9, trials=2, hidden_trials=4,
    passed="your loop plays ttlib's episodes, autoresets and all.",
    mistakes=[
        Mistake("an autoreset step is counted as a transition: on the step after an episode ends, Gymnasium only "
                "resets that environment (its action is ignored, reward 0). Do not plan for that step, count it or "
                "add it to a history.", _rollout_with(count_autoreset=True)),
        Mistake("the return is not reset when an environment starts its next episode: start every episode at "
                "return 0, length 0 and an empty history.", _rollout_with(reset_return=False)),
        Mistake("the history is not cleared when an environment starts its next episode: the planner saw the last "
                "episode's transitions. Start every episode with an empty history.",
                _rollout_with(clear_history=False)),
        Mistake("the random keys come from the environment's index, not the episode's seed: plan with the seed of "
                "the episode each environment plays (schedule[e][episode[e]]).", _rollout_with(keys="index")),
        Mistake("the step in the random key is the loop's step count, not the step of the environment's episode: "
                "an episode that starts later must plan as if it ran alone, from step 0.",
                _rollout_with(step_from="loop")),
        Mistake("the progress bar moves per finished episode: move it at every step by the number of environments "
                "that really stepped, so it moves long before the first episode ends.", _rollout_with(bar="episode")),
        Mistake("the loop stops as soon as one environment has played its schedule: go on while *any* environment "
                "still has an episode to play.", _rollout_with(until="all")),
    ],
)


# ---- exercise 3's first graded stage: one episode per environment ------------------------------------------------
def single_episode_trial(rng):
    """rollout_trial's environments with one episode each (or none), still cut at different steps: the lockstep
    loop -- who plays, one planning call, the step, the returns, the bar -- without a second episode, so without
    an autoreset that starts one."""
    model, schedule, limits = rollout_trial(rng)
    return model, [seeds[:1] for seeds in schedule], limits


rollout_loop_single = dataclasses.replace(
    rollout_loop, id="07-vector-rollout-single", number="3a", trial=single_episode_trial, trials=2, hidden_trials=3,
    passed="your loop plays one episode per environment as ttlib's does.", cell=rollout_loop.id)

EXERCISES = [contexts, batched_planning, rollout_loop_single, rollout_loop]
