"""Every agent `ttlib evaluate` and the notebooks play, by name: how each is loaded, ready for `rollout.play`.

    loaded = registry.load("dt", target_return=250.0)   # the shipped Decision Transformer, asking for 250
    info = loaded.dataset
    result = rollout.play(loaded.agent, info["env_id"], range(10), info["env_kwargs"])

AGENTS maps a name (`ttlib evaluate --model NAME`) to an `Entry`: the function that loads the agent -- from a
checkpoint, with options named as `ttlib evaluate`'s -- and which checkpoints hold it. An agent is added in two
places: its own module (the agent, after ttlib.agents.protocol.Agent, and how its checkpoints load) and one entry
here.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import os
from collections.abc import Callable
from dataclasses import dataclass

from ttlib.agents import baselines, dt
from ttlib.agents.critic import load_critic
from ttlib.agents.protocol import Loaded
from ttlib.errors import ConfigError, MismatchError
from ttlib.evaluation.rollout import PlannerAgent
from ttlib.planning.beam import PlannerConfig, course_planner, critic_planner, imitation_planner
from ttlib.training.checkpoints import load_checkpoint, read_checkpoint, shipped_checkpoint, weights_info

__all__ = ["AGENTS", "Entry", "PLAY_SETTINGS", "load", "load_baseline", "load_dt", "load_tt", "name_of", "options_of",
           "planner_for", "play_settings", "save_with_settings", "training_seconds", "weights_words"]

PLAY_SETTINGS = "play_settings"  # the key of a checkpoint's JSON that holds what it plays with (save_with_settings)


def weights_words(info: dict) -> str:
    """"the best model, step 500" -- which of a checkpoint's models was loaded (checkpoints.weights_info)."""
    step = f", step {info['step']}" if info.get("step") is not None else ""
    return f"the {info['which']} model{step}"


def training_seconds(history) -> float | None:
    """How long a training run took, from a checkpoint's history: a list of evaluations (the last one's
    "seconds"), or a baseline's dict."""
    if isinstance(history, dict):
        return history.get("seconds")
    return history[-1].get("seconds") if history else None


def _check_settings(settings: dict, config_class, fixed=()) -> None:
    """Settings given by name are fields of `config_class` (but the `fixed` ones), or a ConfigError names them."""
    unknown = sorted(set(settings) - {f.name for f in dataclasses.fields(config_class)} | set(fixed) & set(settings))
    if unknown:
        raise ConfigError(f"no setting {', '.join(unknown)}: the settings are {config_class.__name__}'s fields"
                          + (f" but {', '.join(fixed)}" if fixed else ""))


# ---- the settings a checkpoint plays with ----------------------------------------------------------------------
def play_settings(payload: dict) -> dict:
    """The settings a checkpoint plays with unless told otherwise (save_with_settings): {} if it carries none.
    (Notebook 10's agent files of before this key carry theirs as "challenge_settings".)"""
    return payload.get(PLAY_SETTINGS) or payload.get("challenge_settings") or {}


def save_with_settings(checkpoint: str, path: str, **settings) -> str:
    """Write a copy of `checkpoint` to `path` that plays with `settings` unless told otherwise: what `ttlib evaluate`
    takes for its agent (the planner's PlannerConfig fields and `value` for a Trajectory Transformer, e.g.
    beam_width=64; `target_return` for a Decision Transformer). The copy is loaded with them first -- a setting it
    does not take is named -- and only then written, atomically, so a failed setting never replaces `path`.
    `path` may be `checkpoint` itself. Returns `path`."""
    import shutil
    import tempfile

    from ttlib.files import atomic_path
    from ttlib.training.checkpoint_files import read_payload, write_payload

    wrong = sorted(k for k, v in settings.items() if not isinstance(v, (bool, int, float, str, type(None))))
    if wrong:
        raise ConfigError(f"settings are numbers, words or None: {', '.join(wrong)} is not")
    payload = read_payload(checkpoint)
    payload.pop("challenge_settings", None)
    payload[PLAY_SETTINGS] = settings
    with tempfile.TemporaryDirectory() as folder:  # checked before it replaces what `path` held
        trial = os.path.join(folder, os.path.basename(path))
        write_payload(trial, payload)
        load(name_of(trial), checkpoint=trial)
        with atomic_path(path) as tmp:
            shutil.copyfile(trial, tmp)
    return path


# ---- the Trajectory Transformer's planner ---------------------------------------------------------------------
def planner_for(critic, payload: dict | None = None, value: str | None = None, **overrides) -> PlannerConfig:
    """The planner a checkpoint plays with: the settings it carries (save_with_settings) over `critic_planner()`
    when scoring with its critic (value="critic", the default when it has one), `imitation_planner()` for
    value="likelihood" (the default for a model trained on the best episodes only, --top-percent), else
    `course_planner()`; `overrides` (PlannerConfig fields) change single settings, top_k_action=0 meaning all bins
    (as `ttlib evaluate --top-k 0`) and action_mean_beta=0 the best proposal (`--action-mean-beta 0`: no weighted
    mean, where a checkpoint's own settings ask for one)."""
    overrides = {**play_settings(payload or {}), **overrides}  # the checkpoint's own settings, then those given
    saved_value = overrides.pop("value", None)
    value = value or saved_value
    imitates = ((payload or {}).get("train_config") or {}).get("top_percent", 100.0) < 100
    value = value or ("critic" if critic is not None else "likelihood" if imitates else "token")
    if value == "critic" and critic is None:
        raise ConfigError("--value critic: this checkpoint has no critic; add one with `ttlib train-critic "
                          "--checkpoint PATH`, or plan with --value token")
    _check_settings(overrides, PlannerConfig)
    for name in ("top_k_action", "action_mean_beta"):
        if overrides.get(name) == 0:
            overrides[name] = None  # all bins; the best proposal
    preset = {"critic": critic_planner, "likelihood": imitation_planner}.get(value, course_planner)
    planner = preset(**overrides, value=value)
    planner.validate()  # a value of none of the presets among the rest
    return planner


def _trained_on(path: str, payload: dict, dataset: str | None) -> None:
    """A checkpoint asked to play `dataset` (--dataset beside --checkpoint) was trained on it, or a MismatchError."""
    trained_on = payload["dataset"].get("id")
    if dataset is not None and trained_on != dataset:
        raise MismatchError(f"{path} was trained on {trained_on}, not {dataset}: leave out --dataset, or give a "
                            "checkpoint trained on it")


def load_tt(checkpoint: str | None = None, device: str = "auto", which: str = "best", dataset: str | None = None,
            **planner) -> Loaded:
    """The planner on a Trajectory GPT checkpoint (default: the one shipped for `dataset`, the course dataset if
    none) and its critic, if it has one. `planner`: PlannerConfig fields, `value` choosing the preset the others
    change (planner_for)."""
    path = checkpoint or shipped_checkpoint(dataset)
    model, tokenizer, payload = load_checkpoint(path, device=device, which=which)
    _trained_on(path, payload, dataset)
    critic = load_critic(path, device=device, payload=payload)
    planner = planner_for(critic, payload, **planner)
    weights = weights_info(payload, which)
    notes = ["planned with the value token: this checkpoint has no critic (`ttlib train-critic` adds one)"] \
        if planner.value == "token" and critic is None else []
    return Loaded(PlannerAgent(model, tokenizer, planner, critic), payload["dataset"], weights_words(weights),
                  {"model": "tt", "planner": dataclasses.asdict(planner), "weights": weights}, notes,
                  training_seconds(payload.get("history")))


# ---- the Decision Transformer ----------------------------------------------------------------------------------
def load_dt(checkpoint: str | None = None, device: str = "auto", which: str = "best", dataset: str | None = None,
            target_return: float | None = None) -> Loaded:
    """A Decision Transformer checkpoint (default: the one shipped for `dataset`, the course dataset if none)
    asking for `target_return` (default: its dataset's expert reference score)."""
    path = checkpoint or shipped_checkpoint(dataset, dt.SHIPPED, "ttlib train --model dt")
    model, payload = dt.load_checkpoint(path, device=device, which=which)
    _trained_on(path, payload, dataset)
    info, saved = payload["dataset"], play_settings(payload)
    if set(saved) - {"target_return"}:
        raise ConfigError(f"no setting {', '.join(sorted(set(saved) - {'target_return'}))}: a Decision Transformer "
                          "plays with target_return only")
    target = target_return if target_return is not None else saved.get("target_return", dt.default_target(info))
    weights = weights_info(payload, which)
    return Loaded(dt.DTAgent(model, target), info,
                  f"Decision Transformer ({weights_words(weights)}), target return {target:.1f}",
                  {"model": "dt", "target_return": target, "weights": weights},
                  training_seconds=training_seconds(payload.get("history")))


# ---- the baselines ---------------------------------------------------------------------------------------------
def load_baseline(kind: str, checkpoint: str | None = None, dataset: str | None = None, critic: str | None = None,
                  progress: bool = True, **settings) -> Loaded:
    """A baseline policy of `kind` ("bc" or "iql"): a checkpoint's, or (without one) trained now in seconds on
    `dataset` (default: the course dataset) with `settings` (PolicyConfig fields but kind: top_percent, seed, beta,
    ...)."""
    if checkpoint:
        if settings:
            raise ConfigError(f"{', '.join(sorted(settings))} say how to train a baseline; {checkpoint} holds one "
                              "trained already")
        policy, config, payload = baselines.load_policy(checkpoint)
        if play_settings(payload):
            raise ConfigError(f"{checkpoint} carries settings ({', '.join(sorted(play_settings(payload)))}), but a "
                              f"{config.kind} policy acts without any")
        info, trained, history = payload["dataset"], "checkpoint " + checkpoint, payload.get("history")
        if config.kind != kind:
            raise MismatchError(f"{checkpoint} holds a {config.kind} policy, not {kind}")
    else:
        _check_settings(settings, baselines.PolicyConfig, fixed={"kind"})
        policy, config, info, history = baselines.trained_policy(baselines.PolicyConfig(**settings, kind=kind),
                                                                 dataset, critic, progress=progress)
        trained = f"trained now in {history['seconds']:.0f} s on {history['episodes']} episodes"
    return Loaded(policy, info, f"{config.name} ({trained})",
                  {"model": kind, "agent": config.name, "dataset": info["id"]},
                  training_seconds=training_seconds(history))


# ---- the registry ----------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Entry:
    load: Callable[..., Loaded]  # options -> the agent, ready to play
    holds: Callable[[dict], bool]  # is a checkpoint's payload (read_checkpoint) one of this agent's?
    about: str  # what it is, in a few words (`ttlib evaluate --help`)


def _policy_of(kind: str) -> Callable[[dict], bool]:
    return lambda payload: payload.get("kind") == baselines.POLICY_KIND and payload["policy_config"]["kind"] == kind


AGENTS = {
    "tt": Entry(load_tt, lambda payload: payload.get("kind") == "trajectory-gpt", "the Trajectory Transformer"),
    "dt": Entry(load_dt, lambda payload: payload.get("kind") == dt.KIND, "the Decision Transformer"),
    "bc": Entry(functools.partial(load_baseline, "bc"), _policy_of("bc"), "behaviour cloning; with --top-percent, %BC"),
    "iql": Entry(functools.partial(load_baseline, "iql"), _policy_of("iql"), "IQL's policy"),
}


def load(name: str, **options) -> Loaded:
    """The agent `name` (a key of AGENTS), loaded with `options` (its loader's keyword arguments)."""
    if name not in AGENTS:
        raise ConfigError(f"no agent named {name!r}; the agents are {', '.join(AGENTS)}")
    return AGENTS[name].load(**options)


def options_of(name: str) -> list[str]:
    """The options agent `name`'s loader takes by name (besides its config's fields: the planner's PlannerConfig,
    a baseline's PolicyConfig)."""
    parameters = inspect.signature(AGENTS[name].load).parameters.values()
    return [p.name for p in parameters if p.kind is not p.VAR_KEYWORD]


def name_of(checkpoint: str) -> str:
    """The agent a checkpoint holds, by its kind (a checkpoint of no known kind: "tt", whose loader then says
    what it holds)."""
    payload = read_checkpoint(checkpoint, kind=None)
    return next((name for name, entry in AGENTS.items() if entry.holds(payload)), "tt")
