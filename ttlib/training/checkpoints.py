"""Checkpoints: one self-contained file per run, written atomically, read back with one clear error per fault.

A checkpoint is data, never a program: tensors and JSON in a safetensors file (ttlib.training.checkpoint_files), so
loading a file someone shared runs nothing. It holds everything needed to plan with a model again -- weights,
model config, tokenizer, and what we know of the dataset -- and, while a run is going, what `resume` needs to go
on exactly where it stopped: the optimiser's state, the batch generators, the history of evaluations and the best
model so far (ttlib.training.best_model). It is written to a temporary file and renamed into place, so a crash never
leaves half of one. Every ttlib model uses this format (the Trajectory GPT, the Decision Transformer in
ttlib.agents.dt, the policies of ttlib.agents.baselines); `kind` tells them apart, and every entry's type is checked
when it is read.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

from ttlib.data import trajectories as ttdata
from ttlib.model.gpt import GPTConfig, TrajectoryGPT
from ttlib.model.tokenizer import TrajectoryTokenizer
from ttlib.training.checkpoint_files import CHECKPOINT_FORMAT, CheckpointError, read_payload, write_payload

__all__ = ["ASSETS", "COURSE_CHECKPOINT", "DATASET_TYPES", "FIELD_TYPES", "REQUIRED", "REQUIRED_BY_KIND", "RESUMABLE",
           "SHIPPED_TT", "WHICH", "check_fields", "check_resume", "checkpoint_weights", "dataset_summary",
           "default_checkpoint", "export_checkpoint", "from_fields", "load_checkpoint", "load_weights", "pick_device",
           "read_checkpoint", "save_checkpoint", "shipped_checkpoint", "weights_info"]

ASSETS = os.environ.get("TTLIB_ASSETS", str(Path(__file__).resolve().parents[2] / "assets"))
COURSE_CHECKPOINT = "tt_lunarlander.safetensors"  # the shipped Trajectory GPT for the course dataset
SHIPPED_TT = {  # dataset id -> the Trajectory GPT (with its critic) shipped for it: what `--dataset ID` plays
    ttdata.DEFAULT_DATASET: COURSE_CHECKPOINT,
    ttdata.NO_EXPERT_DATASET: "tt_no_expert_lunarlander.safetensors",  # challenge.TT_CHECKPOINT (notebook 10)
}
WHICH = ("best", "last")  # the models a checkpoint holds: the best evaluation's, the last step's

# Settings a resumed run may change: how long it runs, where, and how often it checks itself. Every other one
# shapes the model, the data or the schedule, so a resumed run must keep the checkpoint's.
RESUMABLE = ("steps", "device", "eval_every", "eval_batches", "early_stop")

# What each entry of a payload must be, when it is there ("tensors": a dict of named tensors); the entries every
# checkpoint has, and those each kind adds. A file whose JSON was edited into something else is refused by name.
FIELD_TYPES = {"kind": str, "model": "tensors", "dataset": dict, "history": (list, dict), "step": int,
               "model_config": dict, "tokenizer": (dict, type(None)), "train_config": (dict, type(None)),
               "policy_config": dict, "shape": dict, "critic": (dict, type(None)), "best": dict,
               "last_model": "tensors", "optimizer": dict, "generator": torch.Tensor, "val_generator": torch.Tensor,
               "play_settings": dict, "challenge_settings": dict}
REQUIRED = ("kind", "model", "dataset")
REQUIRED_BY_KIND = {"trajectory-gpt": ("model_config", "tokenizer"), "decision-transformer": ("model_config",),
                    "policy": ("policy_config", "shape")}
DATASET_TYPES = {"id": str, "env_id": (str, type(None)), "env_kwargs": dict, "obs_dim": int, "act_dim": int,
                 "gamma": (int, float)}


def pick_device(device: str = "auto") -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)



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
                    kind: str = "trajectory-gpt", best=None,
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
    write_payload(path, payload)


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


def shipped_checkpoint(dataset_id: str | None = None, shipped: dict[str, str] = SHIPPED_TT,
                       train: str = "ttlib train") -> str:
    """Path of the checkpoint shipped for `dataset_id` (default: the course dataset) among `shipped` (dataset id ->
    file in assets/); for a dataset with none, a CheckpointError that says how to train one (`train`: the command)."""
    dataset_id = dataset_id or ttdata.DEFAULT_DATASET
    if dataset_id not in shipped:
        raise CheckpointError(f"no checkpoint is shipped for {dataset_id} (only for {', '.join(shipped)}): train "
                              f"one with `{train} --dataset {dataset_id} --out runs/model.safetensors` and pass it "
                              "with --checkpoint")
    return default_checkpoint(shipped[dataset_id])


def read_checkpoint(path: str, kind: str | None = "trajectory-gpt") -> dict:
    """Load a checkpoint file's payload, with a clear error for anything that is not a usable ttlib checkpoint.
    Nothing in the file is run: it is parsed as data (ttlib.training.checkpoint_files), then its entries' types
    checked."""
    payload = read_payload(path)
    if payload.get("format") != CHECKPOINT_FORMAT:
        raise CheckpointError(f"{path} is not a ttlib checkpoint (expected format {CHECKPOINT_FORMAT})")
    check_fields(payload, path)
    if kind is not None and payload.get("kind") != kind:
        raise CheckpointError(f"{path} holds a {payload.get('kind')!r} model, not a {kind!r} one")
    return payload


def _is(value, expected) -> bool:
    if expected == "tensors":
        return isinstance(value, dict) and all(isinstance(v, torch.Tensor) for v in value.values())
    if expected is int or expected == (int, float):  # JSON's true is not a count
        return isinstance(value, expected) and not isinstance(value, bool)
    return isinstance(value, expected)


def check_fields(payload: dict, source: str) -> None:
    """CheckpointError naming the first entry of a payload that is missing or of the wrong type."""
    required = REQUIRED + REQUIRED_BY_KIND.get(payload.get("kind"), ())
    missing = [name for name in required if name not in payload]
    if missing:
        raise CheckpointError(f"{source} is not a complete ttlib checkpoint: it has no {', '.join(missing)}")
    for entries, types, where in ((payload, FIELD_TYPES, ""), (payload["dataset"], DATASET_TYPES, "dataset.")):
        for name, expected in types.items():
            if name in entries and not _is(entries[name], expected):
                want = "named tensors" if expected == "tensors" else getattr(expected, "__name__", "a number")
                raise CheckpointError(f"{source} is damaged: its {where}{name} should be {want}, not "
                                      f"{type(entries[name]).__name__}")


def from_fields(make, fields: dict, what: str, source: str):
    """make(**fields), with a CheckpointError naming `what` when the checkpoint's fields do not describe one."""
    try:
        return make(**fields)
    except (TypeError, ValueError, KeyError) as e:
        raise CheckpointError(f"{source}: its {what} does not describe one ({e})") from None


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
    config = from_fields(GPTConfig, payload["model_config"], "model_config", path)
    if model is None:
        model = TrajectoryGPT(config)
    elif model.config.transition_dim != config.transition_dim:
        raise CheckpointError(
            f"{path} was trained for obs {config.obs_dim} / act {config.act_dim} but the model has obs "
            f"{model.config.obs_dim} / act {model.config.act_dim}")
    load_weights(model, weights, source=path)
    tokenizer = from_fields(TrajectoryTokenizer.from_state_dict, {"state": payload["tokenizer"]}, "tokenizer", path)
    return model.to(pick_device(device)).eval(), tokenizer, payload



def export_checkpoint(source: str, destination: str, which: str = "best") -> None:
    """Write a slim copy of a checkpoint of any ttlib model: one model, `which` (see checkpoint_weights), and no
    optimiser state. What ships in assets/."""
    payload = read_checkpoint(source, kind=None)
    if which == "last" and "last_model" in payload:
        payload.pop("best")  # the model it holds is the last step's, not the best
    payload["model"] = checkpoint_weights(payload, which)
    for name in ("last_model", "optimizer", "generator", "val_generator"):
        payload.pop(name, None)
    write_payload(destination, payload)
