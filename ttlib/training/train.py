"""Train the Trajectory GPT on an offline dataset.

The recipe is nanoGPT's: AdamW (weight decay on matrices only), a linear warmup then a cosine decay of the
learning rate, gradient clipping, and a validation loss on held-out *episodes* every so often. Training data are
windows of `n_transitions` transitions cut from every episode (padded at episode ends, the padding masked out of
the loss). Left to choose, a run fits its length to the dataset's size (`fit_recipe`). At every evaluation it
writes a checkpoint (ttlib.training.checkpoints: one file, atomically) that holds the best model so far
(ttlib.training.best_model) and what `resume` needs to go on.
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass, field, fields, replace

import numpy as np
import torch
from tqdm.auto import tqdm

from ttlib.data import trajectories as ttdata
from ttlib.data import validate
from ttlib.data.trajectories import split_episodes, subset
from ttlib.errors import ConfigError, TTLibError
from ttlib.model.gpt import KINDS, GPTConfig, TrajectoryGPT
from ttlib.model.tokenizer import TrajectoryTokenizer
from ttlib.training.best_model import BestModel, overfitting
from ttlib.training.checkpoints import (
    check_resume,
    checkpoint_weights,
    dataset_summary,
    load_weights,
    pick_device,
    read_checkpoint,
    save_checkpoint,
)

__all__ = ["FROM_DATA", "KEEP_BEST_ON", "MIN_STEPS", "PASSES", "RECIPE_EVAL_EVERY", "RECIPE_STEPS", "RunConfig",
           "Shard", "TrainConfig", "TrainResult", "TrainingError", "TrainingState", "fit", "fit_recipe", "get_batch",
           "keep_best", "kind_sums", "learning_rate", "load_and_split", "run_loop", "start_training", "train",
           "validation_losses", "window_tokens"]


class TrainingError(TTLibError, ValueError):
    """Training that cannot go on: the loss became NaN or infinite."""


@dataclass
class RunConfig:
    """The settings every model ttlib trains shares (the Trajectory GPT here, the Decision Transformer in dt)."""
    dataset: str = ttdata.DEFAULT_DATASET  # dataset id (see ttlib.data.trajectories.load)
    lr: float = 6e-4  # peak learning rate
    min_lr: float = 6e-5  # learning rate at the end of the cosine decay
    val_fraction: float = 0.05  # share of episodes held out for validation
    eval_every: int = 250  # steps between validation losses
    eval_batches: int = 10  # batches per validation estimate
    seed: int = 0  # seeds the split, initial weights and batch order
    device: str = "auto"  # "auto" (cuda if available), "cuda", "cpu"
    early_stop: int = 0  # stop after this many evaluations in a row more than 1% (TIE) above the lowest (0: never)
    top_percent: float = 100.0  # learn from this percentage of the episodes, the highest returns first (100: all)

    @property
    def criterion(self) -> str:
        """The history's column that picks the model a run keeps (BestModel): here the validation loss."""
        return "val_loss"

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
            raise ConfigError(f"{cls.__name__} has no setting {', '.join(sorted(unknown))}")
        model = model_class(**{k: v for k, v in settings.items() if k in model_names})
        return cls(**{k: v for k, v in settings.items() if k in run_names}, model=model)


FROM_DATA = ("obs_dim", "act_dim", "action_low", "action_high")  # model fields the dataset decides
KEEP_BEST_ON = ("action", "total")  # TrainConfig.keep_best_on


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
    keep_best_on: str = "action"  # the validation loss that picks the model kept: "action" (the action tokens',
    #                               what the planner samples its proposals from) or "total" (all tokens, weighted)

    @property
    def criterion(self) -> str:
        """The history's column BestModel compares: val_action_loss or val_loss."""
        return "val_loss" if self.keep_best_on == "total" else f"val_{self.keep_best_on}_loss"

    def model_config(self, obs_dim: int, act_dim: int) -> GPTConfig:
        """The model for data with these dimensions."""
        return replace(self.model, obs_dim=obs_dim, act_dim=act_dim)


@dataclass
class TrainResult:
    model: TrajectoryGPT  # with the best evaluation's weights (the checkpoint's model; see BestModel)
    tokenizer: TrajectoryTokenizer
    history: list[dict] = field(default_factory=list)  # {"step", "train_loss", "val_loss", "val_obs_loss",
    #                 "val_action_loss", "val_reward_loss", "val_value_loss", "lr", "seconds", "windows"}
    tokens_per_second: float = 0.0  # training throughput (input tokens processed per second)
    config: TrainConfig | None = None  # the settings the run had (fitted ones filled in)
    best: dict | None = None  # which evaluation's model was kept (BestModel.summary); None without validation
    last_weights: dict | None = None  # the last step's state dict (on the CPU)
    restarts: int = 0  # data-parallel runs: how often the workers started again (one had died) ...
    resumed_from: int | None = None  # ... and the step of the checkpoint the last start went on from (or resume's)



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




# ---- data ---------------------------------------------------------------------------------------------------
def window_tokens(data: ttdata.OfflineDataset, tokenizer: TrajectoryTokenizer, n_transitions: int):
    """All training windows as bins (N, n_transitions * td) int64 and a token mask (N, n_transitions * td)."""
    w = ttdata.make_windows(data, n_transitions)
    bins = tokenizer.encode_transitions(w["observations"], w["actions"], w["rewards"], w["values"],
                                        on_clip="ignore")  # (N, L, td); validation data may lie outside
    N, L, td = bins.shape
    mask = np.repeat(w["mask"][:, :, None], td, axis=2)  # (N, L, td)
    return torch.from_numpy(bins.reshape(N, L * td)), torch.from_numpy(mask.reshape(N, L * td).astype(np.float32))


def get_batch(bins, mask, batch_size, generator, device, shard: tuple[int, int] = (0, 1)):
    """Random windows -> inputs (B, T-1), targets (B, T-1), target mask (B, T-1). With shard=(rank, world_size),
    the same batch is drawn and only slice `rank` of `world_size` near-equal slices is kept
    (ttlib.training.data_parallel)."""
    index = torch.randint(0, bins.shape[0], (batch_size,), generator=generator)
    index = index.tensor_split(shard[1])[shard[0]]  # (B / world_size,): this worker's windows of the batch
    x, m = bins[index].to(device), mask[index].to(device)
    return x[:, :-1], x[:, 1:], m[:, 1:]


@dataclass
class Shard:
    """Which part of every batch a process computes, and how its loss becomes the batch's. One process computes
    the whole batch (this class); each worker of a data-parallel run computes a slice (ttlib.training.data_parallel)."""
    rank: int = 0  # this process's slice of every batch
    world_size: int = 1  # into how many slices every batch is cut
    device: torch.device | None = None  # where this process computes (None: the config's device)

    @property
    def writes(self) -> bool:
        """Does this process write checkpoints and show progress? (Only one of a run's processes does.)"""
        return self.rank == 0

    def wrap(self, model: torch.nn.Module, seed: int) -> None:
        """Called once, with the model built and the run's state loaded, before the first step."""

    def step_loss(self, model, batch) -> tuple[torch.Tensor, float]:
        """(what to backpropagate, the whole batch's loss) for a training batch of this process."""
        _, loss = model(*batch)
        return loss, loss.item()

    def eval_loss(self, model, batch) -> float:
        """The whole batch's loss, in eval mode and without gradients."""
        return model(*batch)[1].item()

    def eval_kinds(self, model, batch) -> torch.Tensor:
        """(2, len(KINDS)) the whole batch's kind_sums (a data-parallel worker adds up every worker's)."""
        return kind_sums(model, *batch)


def kind_sums(model: TrajectoryGPT, inputs, targets, mask) -> torch.Tensor:
    """(2, len(KINDS)): for each kind of token, the summed cross-entropy of the batch's real targets (unweighted)
    and how many there are."""
    logits, _ = model(inputs)  # (B, T, n_bins)
    ce = torch.nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten(), reduction="none")
    ce = ce.view_as(mask) * mask  # (B, T)
    kinds = torch.nn.functional.one_hot(model.target_kinds(targets.shape[1]), len(KINDS)).to(ce.dtype)  # (T, 4)
    return torch.stack([ce.sum(0) @ kinds, mask.to(ce.dtype).sum(0) @ kinds])


# ---- the loop -----------------------------------------------------------------------------------------------
@torch.no_grad()
def validation_losses(model, next_batch, n_batches: int, shard: Shard | None = None) -> dict:
    """In eval mode, over n_batches batches: "val_loss", the mean of `model(*next_batch())`'s loss (weighted as
    training weights it), and for a Trajectory GPT "val_obs_loss", "val_action_loss", ...: the mean cross-entropy
    of each kind of token (KINDS), unweighted."""
    shard = shard or Shard()
    model.eval()
    losses, sums = [], 0
    for _ in range(n_batches):
        batch = next_batch()
        losses.append(shard.eval_loss(model, batch))
        if isinstance(model, TrajectoryGPT):
            sums = sums + shard.eval_kinds(model, batch)  # (2, len(KINDS))
    model.train()
    kinds = {f"val_{kind}_loss": float(sums[0, k] / sums[1, k]) for k, kind in enumerate(KINDS)
             if isinstance(sums, torch.Tensor) and sums[1, k] > 0}
    return {"val_loss": float(np.mean(losses)), **kinds}


def train(config: TrainConfig | None = None, out: str | None = None, resume: str | None = None,
          data: ttdata.OfflineDataset | None = None, progress: bool = True, *, dtype: torch.dtype = torch.float32,
          shard: Shard | None = None) -> TrainResult:
    """Train a TrajectoryGPT. `out`: checkpoint path, written at every evaluation and at the end (with the
    optimiser state, so `resume` can continue exactly where it stopped). Settings left None are fitted to the
    data (fit_recipe; said when progress is on). Returns the best model, the tokenizer, the history.
    dtype: the model's (float64 for exactness checks); shard: this process's part in a data-parallel run."""
    config, shard = config or TrainConfig(), shard or Shard()
    if config.keep_best_on not in KEEP_BEST_ON:
        raise ConfigError(f"keep_best_on must be one of {', '.join(KEEP_BEST_ON)}, got {config.keep_best_on!r}")
    device = shard.device or pick_device(config.device)
    torch.manual_seed(config.seed)
    data, train_data, val_data = load_and_split(config, data, config.gamma, progress)
    config, note = fit_recipe(config, train_data.n_steps)  # a training window starts at every step
    if note and progress:
        print(f"{data.dataset_id}: {note}")
    tokenizer = TrajectoryTokenizer.fit_dataset(train_data, config.model.n_bins, config.strategy)
    model = TrajectoryGPT(config.model_config(data.obs_dim, data.act_dim)).to(device, dtype)
    if config.model.value_embedding:
        model.set_bin_values(tokenizer.means)  # a resumed run loads its own with its weights
    state, payload = start_training(model, config, resume, kind="trajectory-gpt")
    if payload is not None:
        tokenizer = TrajectoryTokenizer.from_state_dict(payload["tokenizer"])  # the windows need the saved bins
    shard.wrap(model, config.seed)

    train_bins, train_mask = window_tokens(train_data, tokenizer, config.model.n_transitions)
    val_bins, val_mask = window_tokens(val_data, tokenizer, config.model.n_transitions)
    part = (shard.rank, shard.world_size)

    def next_val_batch():
        return get_batch(val_bins, val_mask, config.batch_size, state.val_generator, device, part)

    tokens_per_second = fit(
        model, tokenizer, config, state, dataset_summary(data),
        lambda: get_batch(train_bins, train_mask, config.batch_size, state.generator, device, part),
        next_val_batch if len(val_bins) else None, out=out if shard.writes else None, kind="trajectory-gpt",
        tokens_per_step=config.batch_size * (train_bins.shape[1] - 1), progress=progress and shard.writes,
        shard=shard)
    last_weights = keep_best(model, state)
    return TrainResult(model, tokenizer, state.history, tokens_per_second, config, state.best_summary(),
                       last_weights)


def load_and_split(config, data: ttdata.OfflineDataset | None, gamma: float, progress: bool):
    """The dataset (loaded unless given), checked, its best config.top_percent of episodes kept and split by
    config.seed -> (the whole dataset, training, validation)."""
    from ttlib.agents.baselines import best_episodes

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
        out: str | None, kind: str, tokens_per_step: int, progress: bool, shard: Shard | None = None) -> float:
    """run_loop from `state`, writing a resumable checkpoint to `out` (if given) at every evaluation: the best
    model and the last state. Returns the training throughput in tokens per second."""
    def checkpoint(step):
        if out is not None:
            save_checkpoint(out, model, tokenizer, dataset=summary, train_config=asdict(config), step=step,
                            history=state.history, optimizer=state.optimizer, generator=state.generator, kind=kind,
                            best=state.best, val_generator=state.val_generator)

    return run_loop(model, state.optimizer, config, next_batch, next_val_batch, state.history, start=state.step,
                    checkpoint=checkpoint, tokens_per_step=tokens_per_step, progress=progress, best=state.best,
                    shard=shard)


def run_loop(model, optimizer, config, next_batch, next_val_batch, history: list, *, start: int = 0,
             checkpoint=None, tokens_per_step: int = 0, progress: bool = True, best: BestModel | None = None,
             shard: Shard | None = None) -> float:
    """The optimisation loop every ttlib model trains with (the Trajectory GPT here, the Decision Transformer in
    ttlib.agents.dt): `model(*next_batch())` returns (output, loss) -- through `shard`, which in a data-parallel run
    turns a worker's slice into its part of the whole batch's loss. Runs steps start .. config.steps-1 with the
    learning-rate schedule and gradient clipping; every `eval_every` steps and at the end it appends a row to
    `history` (validation losses from `next_val_batch`, None without one; what the run has cost so far: windows
    seen, wall-clock seconds, resumed runs' included, and the device), shows `best` the evaluation's
    `config.criterion` (it keeps a copy of the weights if they are the best) and calls `checkpoint(step + 1)`. It
    warns once when the model overfits (`overfitting`), and stops early after `config.early_stop` evaluations in a
    row behind the best.
    Returns the training throughput in tokens per second."""
    model.train()
    shard = shard or Shard()
    best = best if best is not None else BestModel()
    warned = False
    t0, tokens_seen, loss_ema = time.perf_counter(), 0, None
    before = history[-1].get("seconds", 0.0) if history else 0.0  # a resumed run's time so far
    device = str(next(model.parameters()).device) + (f" x {shard.world_size}" if shard.world_size > 1 else "")
    bar = tqdm(range(start, config.steps), desc="training", disable=not progress, initial=start,
               total=config.steps)
    for step in bar:
        for group in optimizer.param_groups:
            group["lr"] = learning_rate(step, config)
        loss, value = shard.step_loss(model, next_batch())
        if not math.isfinite(value):  # stop before the step: the last checkpoint stays a good one
            raise TrainingError(f"the training loss became {value} at step {step}: training diverged; the "
                                "last checkpoint is untouched; lower the learning rate (--lr) or check the data")
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), config.grad_clip)
        optimizer.step()
        tokens_seen += tokens_per_step
        loss_ema = value if loss_ema is None else 0.95 * loss_ema + 0.05 * value
        if step % config.eval_every == 0 or step == config.steps - 1:
            vals = validation_losses(model, next_val_batch, config.eval_batches, shard) if next_val_batch else {}
            history.append({"step": step, "train_loss": loss_ema, "val_loss": None, **vals,
                            "lr": learning_rate(step, config), "seconds": before + time.perf_counter() - t0,
                            "windows": (step + 1) * config.batch_size, "device": device})
            if vals and best.observe(step, vals[config.criterion], config.criterion):
                best.keep(model)
            warning = overfitting(history)
            if warning and progress and not warned:
                tqdm.write(warning)
            warned = warned or warning is not None
            bar.set_postfix(_evaluation_postfix(loss_ema, vals, best, warning, history))
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


def _evaluation_postfix(loss_ema: float, vals: dict, best: BestModel, warning: str | None, history) -> dict:
    """What the progress bar shows after an evaluation: the losses (the action tokens' too), the best model (on
    its criterion), and overfitting (of the total)."""
    postfix = {"loss": f"{loss_ema:.3f}", "val": f"{vals['val_loss']:.3f}" if vals else "-"}
    if "val_action_loss" in vals:
        postfix["val action"] = f"{vals['val_action_loss']:.3f}"
    if best.step is not None:
        postfix["best"] = f"{best.val_loss:.3f}@{best.step}"
    if warning:
        lowest = min(row["val_loss"] for row in history if row.get("val_loss") is not None)
        postfix["OVERFITTING"] = f"+{vals['val_loss'] / lowest - 1:.0%}"
    return postfix
