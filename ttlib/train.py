"""Train the Trajectory GPT on an offline dataset, and save/load checkpoints.

The recipe is nanoGPT's: AdamW (weight decay on matrices only), a linear warmup then a cosine decay of the
learning rate, gradient clipping, and a validation loss on held-out *episodes* every so often. Training data are
windows of `n_transitions` transitions cut from every episode (padded at episode ends, the padding masked out of
the loss). A checkpoint holds everything needed to plan with the model again: weights, model config, tokenizer,
and what we know of the dataset -- in one file, written to a temporary file and renamed into place.
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import asdict, dataclass, field, fields, replace

import numpy as np
import torch
from tqdm.auto import tqdm

from . import data as ttdata
from . import validate
from .files import atomic_path
from .model import GPTConfig, TrajectoryGPT
from .tokenizer import TrajectoryTokenizer

CHECKPOINT_FORMAT = "ttlib-checkpoint-v1"
ASSETS = os.environ.get("TTLIB_ASSETS", os.path.join(os.path.dirname(os.path.dirname(__file__)), "assets"))
COURSE_CHECKPOINT = "tt_lunarlander.pt"  # the shipped Trajectory GPT for the course dataset


class CheckpointError(ValueError):
    """A checkpoint that is missing, corrupt, of another kind, or does not fit the model/environment."""


class TrainingError(ValueError):
    """Training that cannot go on: the loss became NaN or infinite."""


# Settings a resumed run may change: how long it runs, where, and how often it checks itself. Every other one
# shapes the model, the data or the schedule, so a resumed run must keep the checkpoint's.
RESUMABLE = ("steps", "device", "eval_every", "eval_batches")


@dataclass
class RunConfig:
    """The settings every model ttlib trains shares (the Trajectory GPT here, the Decision Transformer in dt)."""
    dataset: str = ttdata.DEFAULT_DATASET  # dataset id (see ttlib.data.load)
    lr: float = 6e-4  # peak learning rate
    min_lr: float = 6e-5  # learning rate at the end of the cosine decay
    val_fraction: float = 0.05  # share of episodes held out for validation
    eval_every: int = 250  # steps between validation losses
    eval_batches: int = 10  # batches per validation estimate
    seed: int = 0  # seeds the split, initial weights and batch order
    device: str = "auto"  # "auto" (cuda if available), "cuda", "cpu"

    def settings(self) -> dict:
        """Every setting in one flat dict, the model's among them: what command-line options and resume checks
        name. (A model's obs/act dims and action bounds are the data's, not settings.)"""
        run = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "model"}
        model = {f.name: getattr(self.model, f.name) for f in fields(self.model) if f.name not in FROM_DATA}
        return {**run, **model}

    @classmethod
    def from_settings(cls, settings: dict):
        """The config for a flat dict of settings (see `settings`; unknown names are refused). Also reads a
        checkpoint's saved config, nested (`{"model": {...}}`) or flat."""
        settings = {**settings, **settings.get("model", {})} if isinstance(settings.get("model"), dict) else settings
        settings = {k: v for k, v in settings.items() if k != "model" and k not in FROM_DATA}
        model_class = next(f for f in fields(cls) if f.name == "model").default_factory
        model_names = {f.name for f in fields(model_class)}
        run_names = {f.name for f in fields(cls)} - {"model"}
        unknown = set(settings) - model_names - run_names
        if unknown:
            raise ValueError(f"{cls.__name__} has no setting {', '.join(sorted(unknown))}")
        model = model_class(**{k: v for k, v in settings.items() if k in model_names})
        return cls(**{k: v for k, v in settings.items() if k in run_names}, model=model)


FROM_DATA = ("obs_dim", "act_dim", "action_low", "action_high")  # model fields the dataset decides


@dataclass
class TrainConfig(RunConfig):
    model: GPTConfig = field(default_factory=GPTConfig)  # the model's shape and loss weights (obs/act: the data's)
    gamma: float = 0.99  # discount of the value targets
    strategy: str = "quantile"  # bin placement: "quantile" or "uniform" (the model's n_bins bins per dimension)
    batch_size: int = 64  # windows per step
    steps: int = 5400  # optimiser steps in total (about three passes over the course data)
    warmup_steps: int = 100  # linear warmup from 0 to lr
    weight_decay: float = 0.1  # AdamW decay on weight matrices
    grad_clip: float = 1.0  # clip the gradient's global norm to this

    def model_config(self, obs_dim: int, act_dim: int) -> GPTConfig:
        """The model for data with these dimensions."""
        return replace(self.model, obs_dim=obs_dim, act_dim=act_dim)


@dataclass
class TrainResult:
    model: TrajectoryGPT
    tokenizer: TrajectoryTokenizer
    history: list[dict] = field(default_factory=list)  # {"step", "train_loss", "val_loss", "lr", "seconds"}
    tokens_per_second: float = 0.0  # training throughput (input tokens processed per second)


def pick_device(device: str = "auto") -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def learning_rate(step: int, config: TrainConfig) -> float:
    """Linear warmup to lr, then cosine decay to min_lr at the last step."""
    if step < config.warmup_steps:
        return config.lr * (step + 1) / config.warmup_steps
    progress = (step - config.warmup_steps) / max(1, config.steps - config.warmup_steps)
    return config.min_lr + 0.5 * (config.lr - config.min_lr) * (1 + math.cos(math.pi * min(progress, 1.0)))


# ---- data ---------------------------------------------------------------------------------------------------
def split_episodes(data: ttdata.OfflineDataset, val_fraction: float, seed: int):
    """Indices of training and validation episodes (at least one of each when there are two or more)."""
    order = np.random.default_rng(seed).permutation(data.n_episodes)
    n_val = min(max(1, round(val_fraction * data.n_episodes)), data.n_episodes - 1) if data.n_episodes > 1 else 0
    return np.sort(order[n_val:]), np.sort(order[:n_val])


def subset(data: ttdata.OfflineDataset, episodes) -> ttdata.OfflineDataset:
    """The same dataset restricted to some episodes."""
    pick = [int(i) for i in episodes]
    per_episode = {f.name: [getattr(data, f.name)[i] for i in pick] for f in fields(data)
                   if f.name in ("observations", "actions", "rewards", "terminations", "truncations", "values")}
    behaviour = [data.behaviour[i] for i in pick] if data.behaviour is not None else None
    return ttdata.OfflineDataset(**{**{f.name: getattr(data, f.name) for f in fields(data)}, **per_episode,
                                    "behaviour": behaviour})


def window_tokens(data: ttdata.OfflineDataset, tokenizer: TrajectoryTokenizer, n_transitions: int):
    """All training windows as bins (N, n_transitions * td) int64 and a token mask (N, n_transitions * td)."""
    w = ttdata.make_windows(data, n_transitions)
    bins = tokenizer.encode_transitions(w["observations"], w["actions"], w["rewards"], w["values"],
                                        on_clip="ignore")  # (N, L, td); validation data may lie outside
    N, L, td = bins.shape
    mask = np.repeat(w["mask"][:, :, None], td, axis=2)  # (N, L, td)
    return torch.from_numpy(bins.reshape(N, L * td)), torch.from_numpy(mask.reshape(N, L * td).astype(np.float32))


def get_batch(bins, mask, batch_size, generator, device):
    """Random windows -> inputs (B, T-1), targets (B, T-1), target mask (B, T-1)."""
    index = torch.randint(0, bins.shape[0], (batch_size,), generator=generator)
    x, m = bins[index].to(device), mask[index].to(device)
    return x[:, :-1], x[:, 1:], m[:, 1:]


# ---- checkpoints --------------------------------------------------------------------------------------------
def dataset_summary(data: ttdata.OfflineDataset) -> dict:
    """What planning and evaluation need to know of the training data, kept in the checkpoint."""
    returns = data.returns()
    info = {"id": data.dataset_id, "env_id": data.env_id, "env_kwargs": dict(data.env_kwargs),
            "obs_dim": data.obs_dim, "act_dim": data.act_dim, "gamma": data.gamma,
            "n_episodes": data.n_episodes, "n_steps": data.n_steps,
            "mean_return": float(returns.mean()), "std_return": float(returns.std()),
            "ref_min_score": data.ref_min_score, "ref_max_score": data.ref_max_score,
            "action_low": data.action_low, "action_high": data.action_high}
    if data.behaviour is not None:
        info["mean_return_by_behaviour"] = {
            b: float(returns[[x == b for x in data.behaviour]].mean()) for b in sorted(set(data.behaviour))}
    return info


def save_checkpoint(path: str, model: TrajectoryGPT, tokenizer: TrajectoryTokenizer, *, dataset: dict,
                    train_config: dict | None = None, step: int = 0, history: list | None = None,
                    optimizer: torch.optim.Optimizer | None = None, generator: torch.Generator | None = None,
                    kind: str = "trajectory-gpt") -> None:
    """Write one self-contained file atomically. Without `optimizer` it is a slim file for shipping."""
    payload = {
        "format": CHECKPOINT_FORMAT, "kind": kind, "model_config": model.config_dict(),
        "model": {k: v.detach().cpu() for k, v in model.state_dict().items()},
        "tokenizer": tokenizer.state_dict() if tokenizer is not None else None, "dataset": dataset,
        "train_config": train_config, "step": step, "history": history or [],
    }
    if optimizer is not None:
        payload["optimizer"] = optimizer.state_dict()
    if generator is not None:
        payload["generator"] = generator.get_state()
    with atomic_path(path) as tmp:
        torch.save(payload, tmp)


def default_checkpoint(name: str = COURSE_CHECKPOINT) -> str:
    """Path of a checkpoint shipped in the repository's assets/ folder (override with TTLIB_ASSETS)."""
    path = os.path.join(ASSETS, name)
    if not os.path.isfile(path):
        raise CheckpointError(f"shipped checkpoint {name} not found in {ASSETS}: run from a clone of the course "
                              f"repository, set TTLIB_ASSETS, or train one with `ttlib train`")
    return path


def read_checkpoint(path: str, kind: str | None = "trajectory-gpt") -> dict:
    """Load a checkpoint file's payload, with a clear error for anything that is not a usable ttlib checkpoint."""
    if not os.path.isfile(path):
        raise CheckpointError(f"no checkpoint at {path}")
    try:
        payload = torch.load(path, map_location="cpu", weights_only=False)
    except Exception as e:  # truncated or foreign files fail in many ways inside torch/pickle
        raise CheckpointError(f"{path} is not a readable checkpoint (corrupt or truncated?): "
                              f"{type(e).__name__}") from None
    if not isinstance(payload, dict) or payload.get("format") != CHECKPOINT_FORMAT:
        raise CheckpointError(f"{path} is not a ttlib checkpoint (expected format {CHECKPOINT_FORMAT})")
    if kind is not None and payload.get("kind") != kind:
        raise CheckpointError(f"{path} holds a {payload.get('kind')!r} model, not a {kind!r} one")
    return payload


def load_weights(model: torch.nn.Module, state: dict, source: str = "checkpoint") -> None:
    """load_state_dict, but a shape mismatch names the parameters and both shapes in one line."""
    own = model.state_dict()
    missing = sorted(set(own) - set(state))
    unexpected = sorted(set(state) - set(own))
    mismatched = [f"{k}: {tuple(state[k].shape)} in {source} vs {tuple(v.shape)} in model"
                  for k, v in own.items() if k in state and state[k].shape != v.shape]
    if missing or unexpected or mismatched:
        parts = []
        if mismatched:
            parts.append("shape mismatch " + "; ".join(mismatched[:3]) + (" ..." if len(mismatched) > 3 else ""))
        if missing:
            parts.append(f"missing {missing[:3]}")
        if unexpected:
            parts.append(f"unexpected {unexpected[:3]}")
        raise CheckpointError(f"{source} does not fit the model: " + ", ".join(parts))
    broken = [k for k, v in state.items() if v.is_floating_point() and not torch.isfinite(v).all()]
    if broken:  # a model trained on NaN data, or one whose training diverged: it would only ever act NaN
        raise CheckpointError(f"{source} holds non-finite weights (NaN or inf, e.g. in {broken[0]}): its training "
                              "diverged or its data held NaN; train it again on finite data")
    model.load_state_dict(state)


def check_resume(config, payload: dict, source: str) -> None:
    """A resumed run must have the checkpoint's settings, except RESUMABLE ones; else CheckpointError naming
    every setting that differs (as a command-line option) and both values."""
    saved = type(config).from_settings(payload["train_config"]).settings() if payload.get("train_config") else {}
    differ = [f"--{name.replace('_', '-')} {value} (checkpoint: {saved[name]})"
              for name, value in config.settings().items() if name in saved and name not in RESUMABLE
              and value != saved[name]]
    if differ:
        raise CheckpointError(f"cannot resume {source} with other settings: {', '.join(differ)}; leave them out "
                              "to continue with the checkpoint's own, or start a new run without --resume")


def load_checkpoint(path: str, device: str = "auto", model: TrajectoryGPT | None = None):
    """-> (model in eval mode, tokenizer, payload). Pass `model` to load into an existing one (shapes checked)."""
    payload = read_checkpoint(path)
    config = GPTConfig(**payload["model_config"])
    if model is None:
        model = TrajectoryGPT(config)
    elif model.config.transition_dim != config.transition_dim:
        raise CheckpointError(
            f"{path} was trained for obs {config.obs_dim} / act {config.act_dim} but the model has obs "
            f"{model.config.obs_dim} / act {model.config.act_dim}")
    load_weights(model, payload["model"], source=path)
    tokenizer = TrajectoryTokenizer.from_state_dict(payload["tokenizer"])
    return model.to(pick_device(device)).eval(), tokenizer, payload


def load_critic(path: str, device: str = "auto", payload: dict | None = None):
    """The Q critic a Trajectory Transformer checkpoint carries (`ttlib train-critic`), or None if it has none.
    payload: the checkpoint's, when it has been read already (`load_checkpoint` returns it)."""
    from .critic import critic_from_payload

    payload = payload if payload is not None else read_checkpoint(path)
    if payload.get("critic") is None:
        return None
    info = payload["dataset"]
    return critic_from_payload(payload["critic"], info["obs_dim"], info["act_dim"], path).to(pick_device(device))


def add_critic(path: str, config=None, out: str | None = None, progress: bool = True):
    """Train a Q critic (`critic.train_critic`) on the dataset a Trajectory Transformer checkpoint was trained on,
    and write the checkpoint again with it (to `out`, default: in place, atomically). The critic discounts as the
    checkpoint's value targets do (its dataset's gamma), whatever `config` says. -> (critic, history)."""
    import dataclasses

    from .critic import CriticConfig, critic_payload, train_critic

    payload = read_checkpoint(path)
    info = payload["dataset"]
    config = dataclasses.replace(config or CriticConfig(), gamma=info["gamma"])
    data = ttdata.load(info["id"], gamma=info["gamma"], progress=progress)
    if (data.obs_dim, data.act_dim) != (info["obs_dim"], info["act_dim"]):
        raise CheckpointError(f"dataset {info['id']} has obs {data.obs_dim} / act {data.act_dim} but {path} was "
                              f"trained for obs {info['obs_dim']} / act {info['act_dim']}")
    critic, history = train_critic(data, config, progress=progress)
    payload["critic"] = critic_payload(critic, config, history)
    with atomic_path(out or path) as tmp:
        torch.save(payload, tmp)
    return critic, history


# ---- the loop -----------------------------------------------------------------------------------------------
@torch.no_grad()
def validation_loss(model, next_batch, n_batches: int) -> float:
    """Mean loss of `model(*next_batch())` over n_batches batches, in eval mode."""
    model.eval()
    losses = [model(*next_batch())[1].item() for _ in range(n_batches)]
    model.train()
    return float(np.mean(losses))


def train(config: TrainConfig | None = None, out: str | None = None, resume: str | None = None,
          data: ttdata.OfflineDataset | None = None, progress: bool = True) -> TrainResult:
    """Train a TrajectoryGPT. `out`: checkpoint path, written at every evaluation and at the end (with the
    optimiser state, so `resume` can continue exactly where it stopped). Returns the model, tokenizer, history."""
    config = config or TrainConfig()
    device = pick_device(config.device)
    torch.manual_seed(config.seed)
    data, train_data, val_data = load_and_split(config, data, config.gamma, progress)
    tokenizer = TrajectoryTokenizer.fit_dataset(train_data, config.model.n_bins, config.strategy)
    model = TrajectoryGPT(config.model_config(data.obs_dim, data.act_dim)).to(device)
    state, payload = start_training(model, config, resume, kind="trajectory-gpt")
    if payload is not None:
        tokenizer = TrajectoryTokenizer.from_state_dict(payload["tokenizer"])  # the windows need the saved bins

    train_bins, train_mask = window_tokens(train_data, tokenizer, config.model.n_transitions)
    val_bins, val_mask = window_tokens(val_data, tokenizer, config.model.n_transitions)
    val_generator = torch.Generator().manual_seed(config.seed + 1)

    def next_val_batch():
        return get_batch(val_bins, val_mask, config.batch_size, val_generator, device)

    tokens_per_second = fit(
        model, tokenizer, config, state, dataset_summary(data),
        lambda: get_batch(train_bins, train_mask, config.batch_size, state.generator, device),
        next_val_batch if len(val_bins) else None, out=out, kind="trajectory-gpt",
        tokens_per_step=config.batch_size * (train_bins.shape[1] - 1), progress=progress)
    return TrainResult(model, tokenizer, state.history, tokens_per_second)


def load_and_split(config, data: ttdata.OfflineDataset | None, gamma: float, progress: bool):
    """The dataset (loaded unless given), checked, and split by config.seed -> (data, training, validation)."""
    data = data if data is not None else ttdata.load(config.dataset, gamma=gamma, progress=progress)
    validate.check_trainable(data)
    train_eps, val_eps = split_episodes(data, config.val_fraction, config.seed)
    return data, subset(data, train_eps), subset(data, val_eps)


@dataclass
class TrainingState:
    """What a run carries from one step to the next and saves in its checkpoints, so `resume` can go on."""
    optimizer: torch.optim.Optimizer  # AdamW, with its moment estimates
    generator: torch.Generator  # draws the training batches
    step: int = 0  # the first step still to run
    history: list[dict] = field(default_factory=list)  # one row per evaluation (see run_loop)


def start_training(model: torch.nn.Module, config, resume: str | None, kind: str) -> tuple[TrainingState, dict | None]:
    """A fresh optimiser and batch generator, or, with `resume`, the ones its checkpoint saved (and its weights
    loaded into `model`). -> (state, the checkpoint's payload or None)."""
    optimizer = torch.optim.AdamW(model.optimizer_groups(config.weight_decay), lr=config.lr, betas=(0.9, 0.95))
    state = TrainingState(optimizer, torch.Generator().manual_seed(config.seed))
    if resume is None:
        return state, None
    payload = read_checkpoint(resume, kind=kind)
    check_resume(config, payload, resume)
    load_weights(model, payload["model"], source=resume)
    state.step, state.history = payload["step"], list(payload["history"])
    if "optimizer" in payload:
        optimizer.load_state_dict(payload["optimizer"])
    if "generator" in payload:
        state.generator.set_state(payload["generator"])
    return state, payload


def fit(model, tokenizer, config, state: TrainingState, summary: dict, next_batch, next_val_batch, *,
        out: str | None, kind: str, tokens_per_step: int, progress: bool) -> float:
    """run_loop from `state`, writing a resumable checkpoint to `out` (if given) at every evaluation.
    Returns the training throughput in tokens per second."""
    def checkpoint(step):
        if out is not None:
            save_checkpoint(out, model, tokenizer, dataset=summary, train_config=asdict(config), step=step,
                            history=state.history, optimizer=state.optimizer, generator=state.generator, kind=kind)

    return run_loop(model, state.optimizer, config, next_batch, next_val_batch, state.history, start=state.step,
                    checkpoint=checkpoint, tokens_per_step=tokens_per_step, progress=progress)


def run_loop(model, optimizer, config, next_batch, next_val_batch, history: list, *, start: int = 0,
             checkpoint=None, tokens_per_step: int = 0, progress: bool = True) -> float:
    """The optimisation loop every ttlib model trains with (the Trajectory GPT here, the Decision Transformer in
    ttlib.dt): `model(*next_batch())` returns (output, loss). Runs steps start .. config.steps-1 with the
    learning-rate schedule and gradient clipping; every `eval_every` steps and at the end it appends a row to
    `history` (validation loss from `next_val_batch`, None without one) and calls `checkpoint(step + 1)`.
    Returns the training throughput in tokens per second."""
    model.train()
    t0, tokens_seen, loss_ema = time.perf_counter(), 0, None
    bar = tqdm(range(start, config.steps), desc="training", disable=not progress, initial=start,
               total=config.steps)
    for step in bar:
        for group in optimizer.param_groups:
            group["lr"] = learning_rate(step, config)
        _, loss = model(*next_batch())
        value = loss.item()
        if not math.isfinite(value):  # stop before the step: the last checkpoint stays a good one
            raise TrainingError(f"the training loss became {value} at step {step}: training diverged; the "
                                "last checkpoint is untouched; lower the learning rate (--lr) or check the data")
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), config.grad_clip)
        optimizer.step()
        tokens_seen += tokens_per_step
        loss_ema = value if loss_ema is None else 0.95 * loss_ema + 0.05 * value
        last = step == config.steps - 1
        if step % config.eval_every == 0 or last:
            val = validation_loss(model, next_val_batch, config.eval_batches) if next_val_batch else None
            history.append({"step": step, "train_loss": loss_ema, "val_loss": val,
                            "lr": learning_rate(step, config), "seconds": time.perf_counter() - t0})
            bar.set_postfix(loss=f"{loss_ema:.3f}", val=f"{val:.3f}" if val is not None else "-")
            if checkpoint is not None:
                checkpoint(step + 1)
        elif step % 10 == 0:
            bar.set_postfix(loss=f"{loss_ema:.3f}")
    elapsed = time.perf_counter() - t0
    model.eval()
    return tokens_seen / elapsed if elapsed > 0 else 0.0


def export_checkpoint(source: str, destination: str) -> None:
    """Write a slim copy of a checkpoint of any ttlib model (no optimiser state): what ships in assets/."""
    payload = read_checkpoint(source, kind=None)
    payload.pop("optimizer", None)
    payload.pop("generator", None)
    with atomic_path(destination) as tmp:
        torch.save(payload, tmp)
