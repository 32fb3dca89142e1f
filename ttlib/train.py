"""Train the Trajectory GPT on an offline dataset, and save/load checkpoints.

The recipe is nanoGPT's: AdamW (weight decay on matrices only), a linear warmup then a cosine decay of the
learning rate, gradient clipping, and a validation loss on held-out *episodes* every so often. Training data are
windows of `n_transitions` transitions cut from every episode (padded at episode ends, the padding masked out of
the loss). A checkpoint holds everything needed to plan with the model again: weights, model config, tokenizer,
and what we know of the dataset -- in one file, written to a temporary file and renamed into place.

The best model, not the last. A model trained too long on little data learns its training episodes by heart: the
validation loss bottoms out and climbs again. So a run keeps, beside its last state (which `resume` goes on
from), the weights of its best evaluation, and that is the model a checkpoint hands out unless asked for the
last (`which="last"`). A run also says when its validation loss has climbed well above its best and stayed there
(`overfitting`), can stop early, and -- left to choose -- fits its length to the dataset's size (`fit_recipe`).
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
from . import threads, validate
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
RESUMABLE = ("steps", "device", "eval_every", "eval_batches", "early_stop")

# Which evaluation's model a run keeps, and when it warns. A validation loss is an estimate (eval_batches random
# batches of held-out windows): on the course data it moves by about 1% from one evaluation to the next while the
# model stands still, so losses within TIE of the lowest are a tie, which the later, longer-trained model wins.
TIE = 0.01
OVERFIT_MARGIN = 0.10  # overfitting: the validation loss more than 10% above its lowest ...
OVERFIT_EVALS = 3  # ... for this many evaluations in a row
WHICH = ("best", "last")  # the models a checkpoint holds: the best evaluation's, the last step's


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
    early_stop: int = 0  # stop after this many evaluations in a row more than TIE above the lowest (0: never)
    top_percent: float = 100.0  # learn from this percentage of the episodes, the highest returns first (100: all)

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
    steps: int | None = None  # optimiser steps in total; None: fitted to the data (fit_recipe; 5400 for the course's)
    eval_every: int | None = None  # steps between validation losses; None: fitted (250 of 5400, in proportion)
    warmup_steps: int = 100  # linear warmup from 0 to lr
    weight_decay: float = 0.1  # AdamW decay on weight matrices
    grad_clip: float = 1.0  # clip the gradient's global norm to this

    def model_config(self, obs_dim: int, act_dim: int) -> GPTConfig:
        """The model for data with these dimensions."""
        return replace(self.model, obs_dim=obs_dim, act_dim=act_dim)


@dataclass
class TrainResult:
    model: TrajectoryGPT  # with the best evaluation's weights (the checkpoint's model; see BestModel)
    tokenizer: TrajectoryTokenizer
    history: list[dict] = field(default_factory=list)  # {"step", "train_loss", "val_loss", "lr", "seconds"}
    tokens_per_second: float = 0.0  # training throughput (input tokens processed per second)
    config: TrainConfig | None = None  # the settings the run had (fitted ones filled in)
    best: dict | None = None  # which evaluation's model was kept (BestModel.summary); None without validation
    last_weights: dict | None = None  # the last step's state dict (on the CPU)


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


# ---- a recipe that fits the data ----------------------------------------------------------------------------
RECIPE_STEPS = 5400  # the course's run: 3.6 passes over its 97,330 training windows; the most a fitted run takes
RECIPE_EVAL_EVERY = 250  # and its evaluations, every 250 steps
PASSES = 4  # a fitted run makes about this many passes over the training windows ...
MIN_STEPS = 200  # ... and at least this many steps (twice the warmup)


def fit_recipe(config: TrainConfig, n_windows: int) -> tuple[TrainConfig, str | None]:
    """`config` with the settings it leaves to the data (None) fitted to `n_windows` training windows, and a
    line that says what was chosen and why (None when nothing was left to choose).

    steps: about PASSES passes over the windows, at least MIN_STEPS, at most RECIPE_STEPS. A model learns a small
    dataset by heart within a few passes -- its validation loss bottoms out, then climbs -- so a fixed step count
    that suits the course's 100,000 steps is many passes too many for 10,000. eval_every: as many evaluations per
    run as the course's (every 250 of 5400 steps), so that a short run is watched as closely.
    """
    if config.steps is not None and config.eval_every is not None:
        return config, None
    chosen = []
    steps = config.steps
    if steps is None:
        steps = min(RECIPE_STEPS, max(MIN_STEPS, round(PASSES * n_windows / config.batch_size)))
        passes = steps * config.batch_size / n_windows
        if steps == MIN_STEPS:
            why = f"the fewest a fitted run takes: {passes:.1f} passes"
        elif steps == RECIPE_STEPS:
            why = f"the course recipe's, the most a fitted run takes: {passes:.1f} passes"
        else:
            why = f"{PASSES} passes over them in batches of {config.batch_size}"
        chosen.append(f"{steps} steps ({why})")
    eval_every = config.eval_every
    if eval_every is None:
        eval_every = max(1, round(RECIPE_EVAL_EVERY * min(steps, RECIPE_STEPS) / RECIPE_STEPS))
        chosen.append(f"a validation loss every {eval_every} steps")
    note = (f"fitted to {n_windows:,} training windows: {', '.join(chosen)}; --steps and --eval-every choose "
            "others")
    return replace(config, steps=steps, eval_every=eval_every), note


# ---- the best model ---------------------------------------------------------------------------------------
@dataclass
class BestModel:
    """The model a run keeps: that of the latest evaluation whose validation loss was within TIE of the lowest
    so far (closer than that is the estimate's noise, and a tie goes to the longer-trained model)."""
    step: int | None = None  # the kept evaluation's step (None until one is kept)
    val_loss: float | None = None  # its validation loss
    lowest: float = math.inf  # the lowest validation loss so far
    lowest_step: int | None = None  # the step it was measured at
    behind: int = 0  # evaluations since the kept one, in a row (each more than TIE above the lowest)
    weights: dict | None = field(default=None, repr=False)  # the kept model's state dict (copies on the CPU)
    latest: bool = True  # the kept model is the latest evaluation's (so the last step's is the same)

    def observe(self, step: int, val_loss: float) -> bool:
        """Record an evaluation. True if its model is now the one to keep (then call `keep`)."""
        if val_loss < self.lowest:
            self.lowest, self.lowest_step = val_loss, step
        self.latest = val_loss <= (1 + TIE) * self.lowest
        if self.latest:
            self.step, self.val_loss, self.behind = step, val_loss, 0
        else:
            self.behind += 1
        return self.latest

    def keep(self, model: torch.nn.Module) -> None:
        self.weights = {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}

    def summary(self) -> dict:
        """What a checkpoint records of it (beside the weights)."""
        return {"step": self.step, "val_loss": self.val_loss, "lowest": self.lowest, "lowest_step": self.lowest_step,
                "behind": self.behind}

    @classmethod
    def from_payload(cls, payload: dict) -> BestModel:
        """The best model a checkpoint holds. A checkpoint from before ttlib kept one holds only its last model:
        that one, with its history's last validation loss, is where the comparison starts again."""
        if payload.get("best") is not None:
            return cls(**payload["best"], weights=payload["model"], latest="last_model" not in payload)
        best = cls()
        rows = [row for row in payload.get("history", []) if row.get("val_loss") is not None]
        if rows and rows[-1] is payload["history"][-1]:
            best.observe(rows[-1]["step"], rows[-1]["val_loss"])
            best.weights = payload["model"]
        return best


def overfitting(history: list[dict]) -> str | None:
    """A warning, with what to try, when the last OVERFIT_EVALS validation losses in `history` were all more than
    OVERFIT_MARGIN above the lowest; else None."""
    losses = [(row["step"], row["val_loss"]) for row in history if row.get("val_loss") is not None]
    if not losses:
        return None
    lowest_step, lowest = min(losses, key=lambda x: x[1])
    above = 0  # evaluations in a row, up to the latest, more than the margin above the lowest
    while above < len(losses) and losses[-1 - above][1] > (1 + OVERFIT_MARGIN) * lowest:
        above += 1
    if above < OVERFIT_EVALS:
        return None
    return (f"overfitting: the validation loss has been more than {OVERFIT_MARGIN:.0%} above its lowest "
            f"({lowest:.3f}, step {lowest_step}) for {above} evaluations, now {losses[-1][1]:.3f}; the checkpoint "
            f"keeps the best model. Try fewer --steps, more --dropout, a smaller model (--n-layer, --n-embd), "
            f"more data, or --early-stop {OVERFIT_EVALS}")


def best_line(best: dict | None, history: list[dict]) -> str:
    """One line on which model a run kept, for `ttlib train`'s last words."""
    if best is None or best.get("step") is None:
        return "no validation loss was measured: the checkpoint holds the last step's model"
    last = history[-1]["step"]
    line = f"best model: step {best['step']}, validation loss {best['val_loss']:.3f}"
    if best["lowest_step"] != best["step"]:
        line += f" (within {TIE:.0%} of the lowest, {best['lowest']:.3f} at step {best['lowest_step']})"
    if best["step"] == last:
        return line + ", which is also the last step's"
    return line + f" -- what evaluate and --export use; --which last for step {last}'s"


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
                    kind: str = "trajectory-gpt", best: BestModel | None = None,
                    val_generator: torch.Generator | None = None) -> None:
    """Write one self-contained file atomically. Without `optimizer` it is a slim file for shipping.

    The file's "model" is the model to use: `best`'s when given (its step and losses under "best"), else
    `model`'s own. When the best is not `model`'s current state, that goes under "last_model" (for resume)."""
    weights = {k: v.detach().cpu() for k, v in model.state_dict().items()}
    payload = {
        "format": CHECKPOINT_FORMAT, "kind": kind, "model_config": model.config_dict(), "model": weights,
        "tokenizer": tokenizer.state_dict() if tokenizer is not None else None, "dataset": dataset,
        "train_config": train_config, "step": step, "history": history or [],
    }
    if best is not None and best.weights is not None:
        payload["best"] = best.summary()
        if not best.latest:
            payload["model"], payload["last_model"] = best.weights, weights
    if optimizer is not None:
        payload["optimizer"] = optimizer.state_dict()
    if generator is not None:
        payload["generator"] = generator.get_state()
    if val_generator is not None:
        payload["val_generator"] = val_generator.get_state()
    with atomic_path(path) as tmp:
        torch.save(payload, tmp)


def checkpoint_weights(payload: dict, which: str = "best") -> dict:
    """The state dict of one of the models a checkpoint holds: "best" (the best evaluation's; a checkpoint from
    before ttlib kept one has only its last) or "last" (the last step's, which `resume` goes on from)."""
    if which not in WHICH:
        raise CheckpointError(f"which model: one of {', '.join(WHICH)}, not {which!r}")
    return payload.get("last_model", payload["model"]) if which == "last" else payload["model"]


def weights_info(payload: dict, which: str = "best") -> dict:
    """{"which", "step", "val_loss"}: which model `checkpoint_weights(payload, which)` is, by its evaluation."""
    rows = payload.get("history") or [{}]
    best = payload.get("best")
    if which == "best" and best is not None:
        return {"which": which, "step": best["step"], "val_loss": best["val_loss"]}
    return {"which": which if best is not None else "last", "step": rows[-1].get("step"),
            "val_loss": rows[-1].get("val_loss")}


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


def load_checkpoint(path: str, device: str = "auto", model: TrajectoryGPT | None = None, which: str = "best"):
    """-> (model in eval mode, tokenizer, payload). Pass `model` to load into an existing one (shapes checked).
    which: "best" (the best evaluation's model) or "last" (the last step's; see checkpoint_weights)."""
    payload = read_checkpoint(path)
    weights = checkpoint_weights(payload, which)
    config = GPTConfig(**payload["model_config"])
    if model is None:
        model = TrajectoryGPT(config)
    elif model.config.transition_dim != config.transition_dim:
        raise CheckpointError(
            f"{path} was trained for obs {config.obs_dim} / act {config.act_dim} but the model has obs "
            f"{model.config.obs_dim} / act {model.config.act_dim}")
    load_weights(model, weights, source=path)
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
    optimiser state, so `resume` can continue exactly where it stopped). Settings left None are fitted to the
    data (fit_recipe; said when progress is on). Returns the best model, the tokenizer, the history."""
    config = config or TrainConfig()
    device = pick_device(config.device)
    torch.manual_seed(config.seed)
    data, train_data, val_data = load_and_split(config, data, config.gamma, progress)
    config, note = fit_recipe(config, train_data.n_steps)  # a training window starts at every step
    if note and progress:
        print(f"{data.dataset_id}: {note}")
    tokenizer = TrajectoryTokenizer.fit_dataset(train_data, config.model.n_bins, config.strategy)
    model = TrajectoryGPT(config.model_config(data.obs_dim, data.act_dim)).to(device)
    state, payload = start_training(model, config, resume, kind="trajectory-gpt")
    if payload is not None:
        tokenizer = TrajectoryTokenizer.from_state_dict(payload["tokenizer"])  # the windows need the saved bins

    train_bins, train_mask = window_tokens(train_data, tokenizer, config.model.n_transitions)
    val_bins, val_mask = window_tokens(val_data, tokenizer, config.model.n_transitions)

    def next_val_batch():
        return get_batch(val_bins, val_mask, config.batch_size, state.val_generator, device)

    tokens_per_second = fit(
        model, tokenizer, config, state, dataset_summary(data),
        lambda: get_batch(train_bins, train_mask, config.batch_size, state.generator, device),
        next_val_batch if len(val_bins) else None, out=out, kind="trajectory-gpt",
        tokens_per_step=config.batch_size * (train_bins.shape[1] - 1), progress=progress)
    last_weights = keep_best(model, state)
    return TrainResult(model, tokenizer, state.history, tokens_per_second, config, state.best_summary(),
                       last_weights)


def load_and_split(config, data: ttdata.OfflineDataset | None, gamma: float, progress: bool):
    """The dataset (loaded unless given), checked, its best config.top_percent of episodes kept and split by
    config.seed -> (the whole dataset, training, validation)."""
    from .baselines import best_episodes

    data = data if data is not None else ttdata.load(config.dataset, gamma=gamma, progress=progress)
    validate.check_trainable(data)
    kept = subset(data, best_episodes(data.returns(), config.top_percent)) if config.top_percent < 100 else data
    validate.check_trainable(kept)
    train_eps, val_eps = split_episodes(kept, config.val_fraction, config.seed)
    return data, subset(kept, train_eps), subset(kept, val_eps)


@dataclass
class TrainingState:
    """What a run carries from one step to the next and saves in its checkpoints, so `resume` can go on."""
    optimizer: torch.optim.Optimizer  # AdamW, with its moment estimates
    generator: torch.Generator  # draws the training batches
    val_generator: torch.Generator  # draws the validation batches
    step: int = 0  # the first step still to run
    history: list[dict] = field(default_factory=list)  # one row per evaluation (see run_loop)
    best: BestModel = field(default_factory=BestModel)  # the model the run keeps

    def best_summary(self) -> dict | None:
        return self.best.summary() if self.best.step is not None else None


def start_training(model: torch.nn.Module, config, resume: str | None, kind: str) -> tuple[TrainingState, dict | None]:
    """A fresh optimiser and batch generators, or, with `resume`, the ones its checkpoint saved (its last model
    loaded into `model`, its best kept as the best so far). -> (state, the checkpoint's payload or None)."""
    optimizer = torch.optim.AdamW(model.optimizer_groups(config.weight_decay), lr=config.lr, betas=(0.9, 0.95))
    state = TrainingState(optimizer, torch.Generator().manual_seed(config.seed),
                          torch.Generator().manual_seed(config.seed + 1))
    if resume is None:
        return state, None
    payload = read_checkpoint(resume, kind=kind)
    check_resume(config, payload, resume)
    load_weights(model, checkpoint_weights(payload, "last"), source=resume)
    state.step, state.history = payload["step"], list(payload["history"])
    state.best = BestModel.from_payload(payload)
    if "optimizer" in payload:
        optimizer.load_state_dict(payload["optimizer"])
    for name in ("generator", "val_generator"):
        if name in payload:
            getattr(state, name).set_state(payload[name])
    return state, payload


def keep_best(model: torch.nn.Module, state: TrainingState) -> dict:
    """At the end of a run: load the best model's weights into `model`; return the last step's (on the CPU)."""
    last = {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}
    if state.best.weights is not None and not state.best.latest:
        model.load_state_dict(state.best.weights)
    return last


def fit(model, tokenizer, config, state: TrainingState, summary: dict, next_batch, next_val_batch, *,
        out: str | None, kind: str, tokens_per_step: int, progress: bool) -> float:
    """run_loop from `state`, writing a resumable checkpoint to `out` (if given) at every evaluation: the best
    model and the last state. Returns the training throughput in tokens per second."""
    def checkpoint(step):
        if out is not None:
            save_checkpoint(out, model, tokenizer, dataset=summary, train_config=asdict(config), step=step,
                            history=state.history, optimizer=state.optimizer, generator=state.generator, kind=kind,
                            best=state.best, val_generator=state.val_generator)

    return run_loop(model, state.optimizer, config, next_batch, next_val_batch, state.history, start=state.step,
                    checkpoint=checkpoint, tokens_per_step=tokens_per_step, progress=progress, best=state.best)


def run_loop(model, optimizer, config, next_batch, next_val_batch, history: list, *, start: int = 0,
             checkpoint=None, tokens_per_step: int = 0, progress: bool = True, best: BestModel | None = None) -> float:
    """The optimisation loop every ttlib model trains with (the Trajectory GPT here, the Decision Transformer in
    ttlib.dt): `model(*next_batch())` returns (output, loss). Runs steps start .. config.steps-1 with the
    learning-rate schedule and gradient clipping; every `eval_every` steps and at the end it appends a row to
    `history` (validation loss from `next_val_batch`, None without one), shows `best` the evaluation (it keeps a
    copy of the weights if they are the best) and calls `checkpoint(step + 1)`. It warns once when the model
    overfits (`overfitting`), and stops early after `config.early_stop` evaluations in a row behind the best.
    Returns the training throughput in tokens per second."""
    model.train()
    best = best if best is not None else BestModel()
    warned = False
    t0, tokens_seen, loss_ema = time.perf_counter(), 0, None
    bar = tqdm(range(start, config.steps), desc="training", disable=not progress, initial=start,
               total=config.steps)
    for step in bar:
        threads.keep_fitting()  # as many torch threads as other programs leave cores free
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
            if val is not None and best.observe(step, val):
                best.keep(model)
            postfix = {"loss": f"{loss_ema:.3f}", "val": f"{val:.3f}" if val is not None else "-"}
            if best.step is not None:
                postfix["best"] = f"{best.val_loss:.3f}@{best.step}"
            warning = overfitting(history)
            if warning:
                postfix["OVERFITTING"] = f"+{val / best.lowest - 1:.0%}"
                if progress and not warned:
                    tqdm.write(warning)
                warned = True
            bar.set_postfix(postfix)
            if checkpoint is not None:
                checkpoint(step + 1)
            if config.early_stop and best.behind >= config.early_stop:
                break  # the checkpoint is written: resume would go on
        elif step % 10 == 0:
            bar.set_postfix(loss=f"{loss_ema:.3f}")
    bar.close()
    elapsed = time.perf_counter() - t0
    model.eval()
    return tokens_seen / elapsed if elapsed > 0 else 0.0


def export_checkpoint(source: str, destination: str, which: str = "best") -> None:
    """Write a slim copy of a checkpoint of any ttlib model: one model, `which` (see checkpoint_weights), and no
    optimiser state. What ships in assets/."""
    payload = read_checkpoint(source, kind=None)
    if which == "last" and "last_model" in payload:
        payload.pop("best")  # the model it holds is the last step's, not the best
    payload["model"] = checkpoint_weights(payload, which)
    for name in ("last_model", "optimizer", "generator", "val_generator"):
        payload.pop(name, None)
    with atomic_path(destination) as tmp:
        torch.save(payload, tmp)
