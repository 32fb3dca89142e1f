"""Notebook 10's open challenge: beat %BC on the lander's data without the expert, graded by the return your agent
reaches on episodes you never see.

    challenge.save_policy(policy, config, data, history)   # or challenge.save_checkpoint("runs/my_tt.safetensors")
    challenge.preview()      # your agent and %BC on the public seeds, and the bands that reaches there

The rules, as the notebook announces them:
- the data is `DATASET` (no expert flight in it: %BC copies a late, shaky pilot);
- your agent is any checkpoint ttlib can load (`ttlib evaluate --checkpoint` plays it: a Trajectory Transformer with
  or without a critic, a Decision Transformer, a BC or IQL policy), trained on that data, in the file `FILE` beside
  your notebook. It is data (tensors and JSON): the grader plays it with ttlib's own code, so no code of yours runs
  while it is graded, and the return it gets is the return your agent earned;
- the grader plays it on `HIDDEN_EPISODES` seeds that are the course's secret, beside %BC on the same seeds (the
  shipped `PBC_CHECKPOINT`, the best tenth of the episodes), and awards each band whose margin your mean return
  clears (`BANDS`).

`python -m ttlib.course.challenge play FILE --seeds 1,2,3` is what the grader runs, in a sandbox
(ttlib.grading.challenge): one JSON line, the returns of both agents, or the message saying what is wrong.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys
from dataclasses import dataclass

import numpy as np

from ttlib.errors import TTLibError

__all__ = ["BANDS", "Band", "ChallengeError", "DATASET", "FILE", "HIDDEN_EPISODES", "MAX_BYTES", "NOTEBOOK",
           "PBC_CHECKPOINT", "PUBLIC_SEEDS", "TT_CHECKPOINT", "bands_reached", "check_band", "load_agent", "main",
           "play_both", "preview", "save_checkpoint", "save_policy", "shipped_name"]

DATASET = "ttlib/lunarlander/no-expert-v0"  # the lander without the expert (ttlib.data.NO_EXPERT_DATASET, not imported)
FILE = "challenge.safetensors"  # your agent, handed in beside your notebook
NOTEBOOK = "10_beat_pbc"  # the notebook (and nbgrader assignment) of the challenge
PBC_CHECKPOINT = "pbc_no_expert_lunarlander.safetensors"  # the bar: %BC on the best 10% of the episodes (assets/)
TT_CHECKPOINT = "tt_no_expert_lunarlander.safetensors"  # the course's Trajectory Transformer (and critic) on it
PUBLIC_SEEDS = tuple(range(10))  # the episodes `preview` plays; the graded ones are others, and secret
HIDDEN_EPISODES = 20  # episodes the grader plays, on the course's secret seeds
MAX_BYTES = 64 * 2**20  # the largest agent file the grader reads


class ChallengeError(TTLibError, ValueError):
    """An agent file the challenge cannot play: missing, not a ttlib checkpoint, or trained on other data."""


@dataclass(frozen=True)
class Band:
    grade_id: str  # nbgrader's grade_id of the test cell that awards it
    margin: float  # your mean return must be at least %BC's plus this, on the same episodes
    points: int  # what the cell is worth
    says: str  # what reaching it means, for messages and the notebook


BANDS = (
    Band("10-your-agent-test", 0.0, 2, "beats %BC"),
    Band("10-your-agent-by-75-test", 75.0, 2, "beats %BC by 75 or more"),
    Band("10-your-agent-by-150-test", 150.0, 2, "beats %BC by 150 or more"),
)


def bands_reached(mean_return: float, pbc_return: float) -> list[Band]:
    """The bands a mean return clears against %BC's mean on the same episodes."""
    return [band for band in BANDS if mean_return >= pbc_return + band.margin]


# ---- your agent's file -----------------------------------------------------------------------------------------
def save_policy(policy, config, data, history, path: str = FILE) -> str:
    """Write a BC or IQL policy you trained (ttlib.agents.baselines.train_policy) as your challenge agent."""
    from ttlib.agents.baselines import save_policy as write
    from ttlib.training.checkpoints import dataset_summary

    write(path, policy, config, dataset_summary(data), history)
    return path


def save_checkpoint(checkpoint: str, path: str = FILE, **settings) -> str:
    """Hand in a checkpoint ttlib wrote (`ttlib train`: a Trajectory Transformer, with its critic if it has one, a
    Decision Transformer, a BC or IQL policy) as your challenge agent, with the `settings` it is to play with -- what
    `ttlib evaluate` takes for it: the planner's (PlannerConfig fields and `value`, e.g. beam_width=64, top_k_action=
    50) for a Trajectory Transformer, `target_return` for a Decision Transformer, none for a policy. It is loaded
    with them (a setting it does not take is named), then written atomically to `path`, the settings in its JSON
    (ttlib.agents.registry.save_with_settings). Returns `path`."""
    from ttlib.agents import registry

    payload, name = _checked_payload(checkpoint), registry.name_of(checkpoint)  # a checkpoint of the right data
    if settings and name in ("bc", "iql"):
        raise ChallengeError(f"a {name} policy acts without settings: leave out {', '.join(sorted(settings))}")
    try:
        return registry.save_with_settings(checkpoint, path, **{**registry.play_settings(payload), **settings})
    except Exception as error:  # noqa: BLE001 (a setting it does not take: one sentence, never a traceback)
        raise ChallengeError(f"{checkpoint} could not be loaded: {error}") from None


def load_agent(path: str = FILE):
    """The agent in `path`, ready to play (ttlib.agents.protocol.Loaded) with the settings saved in it, or a
    ChallengeError saying what is wrong."""
    from ttlib.agents import registry

    _checked_payload(path)
    try:
        return registry.load(registry.name_of(path), checkpoint=path)  # with the settings it carries
    except Exception as error:  # noqa: BLE001 (a damaged checkpoint: one sentence, never a traceback from torch)
        raise ChallengeError(f"{path} could not be loaded: {error}") from None


def _checked_payload(path: str) -> dict:
    """The JSON of a checkpoint that exists, is not too large, and learnt from the challenge's data."""
    from ttlib.training.checkpoints import read_checkpoint

    if not os.path.isfile(path):
        raise ChallengeError(f"no agent file {path}: save your agent first (challenge.save_policy or "
                             "challenge.save_checkpoint), and hand it in beside your notebook")
    if os.path.getsize(path) > MAX_BYTES:
        raise ChallengeError(f"{path} is {os.path.getsize(path) / 2**20:.0f} MiB: the grader reads agents of at most "
                             f"{MAX_BYTES >> 20} MiB")
    try:
        payload = read_checkpoint(path, kind=None)
    except Exception as error:  # noqa: BLE001 (whatever the file holds, the learner reads one sentence)
        raise ChallengeError(f"{path} is not a ttlib checkpoint ({error})") from None
    trained_on = (payload.get("dataset") or {}).get("id")
    if trained_on != DATASET:
        raise ChallengeError(f"the agent in {path} learnt from {trained_on}: the challenge is on {DATASET}, the data "
                             "without the expert")
    return payload


def _pbc():
    from ttlib.agents import registry
    from ttlib.training.checkpoints import default_checkpoint

    return registry.load("bc", checkpoint=default_checkpoint(PBC_CHECKPOINT))


def play_both(path: str = FILE, seeds=PUBLIC_SEEDS, progress: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """(your agent's returns, %BC's returns), one episode per seed each, the same seeds."""
    from ttlib.evaluation.rollout import play

    yours, pbc = load_agent(path), _pbc()
    env_id, env_kwargs = pbc.dataset["env_id"], pbc.dataset["env_kwargs"]
    mine = play(yours.agent, env_id, seeds, env_kwargs, progress=progress).returns
    theirs = play(pbc.agent, env_id, seeds, env_kwargs, progress=progress).returns
    return np.asarray(mine, dtype=float), np.asarray(theirs, dtype=float)


def preview(path: str = FILE, seeds=PUBLIC_SEEDS, plot: bool = True) -> dict:
    """Your agent beside %BC on the public seeds: a plot, the means, and the bands that would be reached *there*
    (the grade is decided on other episodes: a few lucky seeds here prove little)."""
    mine, theirs = play_both(path, seeds)
    reached = bands_reached(mine.mean(), theirs.mean())
    if plot:
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(8, 3))
        x = np.arange(len(mine))
        ax.bar(x - 0.2, theirs, 0.4, label=f"%BC (mean {theirs.mean():.1f})", color="tab:olive")
        ax.bar(x + 0.2, mine, 0.4, label=f"your agent (mean {mine.mean():.1f})", color="tab:blue")
        for band in BANDS:
            ax.axhline(theirs.mean() + band.margin, color="grey", lw=0.8, ls=":")
        ax.set(xticks=x, xticklabels=[str(s) for s in seeds], xlabel="seed", ylabel="return",
               title="your agent beside %BC (dotted: the bands' bars on these seeds)")
        ax.legend(loc="lower right")
        plt.show()
    print(f"on seeds {seeds[0]}-{seeds[-1]}: your agent {mine.mean():.1f}, %BC {theirs.mean():.1f} "
          f"(margin {mine.mean() - theirs.mean():+.1f}); bands reached here: "
          + (", ".join(band.says for band in reached) or "none"))
    return {"return": float(mine.mean()), "pbc": float(theirs.mean()), "bands": len(reached)}


_checked: dict = {}  # the train_agent last run, the path it gave, that file's (path, size, mtime) and its preview


def _weights_digest(path: str) -> str | None:
    """sha256 of a checkpoint's model weights (names and values), whatever else its JSON holds; None if unreadable."""
    import hashlib

    from ttlib.training.checkpoint_files import read_payload

    try:
        model = read_payload(path).get("model")
    except Exception:  # noqa: BLE001 (not a checkpoint: it is no shipped one's copy either)
        return None
    if not isinstance(model, dict):
        return None
    digest = hashlib.sha256()
    for name in sorted(model):
        digest.update(name.encode() + np.ascontiguousarray(np.asarray(model[name].detach().cpu())).tobytes())
    return digest.hexdigest()


def shipped_name(path: str = FILE) -> str | None:
    """The name of the shipped checkpoint whose weights `path` holds (re-saved or not), or None."""
    from ttlib.training.checkpoints import ASSETS

    mine = _weights_digest(path)
    for name in sorted(os.listdir(ASSETS)) if os.path.isdir(ASSETS) and mine else []:
        shipped = os.path.join(ASSETS, name)
        if name.endswith(".safetensors") and _shipped_digest(shipped, os.path.getmtime(shipped)) == mine:
            return name
    return None


@functools.lru_cache(maxsize=32)
def _shipped_digest(path: str, mtime: float) -> str | None:
    return _weights_digest(path)  # once per file and version: the band cells ask three times


def check_band(index: int, train_agent) -> None:
    """A band cell. In your notebook: `train_agent(data)` is run (once for the three cells, until you redefine it),
    and whether its agent clears band `index` on the public seeds is checked. Your grade is decided by the grader,
    on hidden episodes: in the grader's kernel this does nothing, and `train_agent` is not run."""
    from ttlib.exercises import GRADING_ENV, ExerciseFailed

    band = BANDS[index]
    if os.environ.get(GRADING_ENV) == "1":
        return
    try:
        if _checked.get("train_agent") is not train_agent:
            from ttlib.data import trajectories as ttdata

            _checked.clear()
            try:
                path = train_agent(ttdata.load(DATASET, progress=False))
            except NotImplementedError:
                raise ExerciseFailed("train_agent is not implemented yet: fill in the cell above (replace the "
                                     "`raise NotImplementedError()`) and run it, then run this cell again.") from None
            _checked["train_agent"], _checked["path"] = train_agent, path
        path = _checked["path"]
        key = (path, os.path.getsize(path), os.path.getmtime(path)) if isinstance(path, str) else None
        if key is None:
            raise ChallengeError(f"train_agent returned {path!r}, not the path of your agent's file")
        if _checked.get("key") != key:
            _checked["key"], _checked["seen"] = key, preview(path)
    except OSError:
        raise ExerciseFailed(f"Band {index + 1} not reached yet: train_agent returned {_checked.get('path')!r}, and "
                             "there is no such file") from None
    except ChallengeError as error:
        raise ExerciseFailed(f"Band {index + 1} not reached yet: {error}") from None
    seen, placeholder = _checked["seen"], shipped_name(path)
    if placeholder:  # the course's own agent: shown, never graded, so nothing to check
        print(f"Band {index + 1} (\"{band.says}\"): {path} is the course's own {placeholder}; on the public seeds it "
              f"scores {seen['return']:.1f} against %BC's {seen['pbc']:.1f}, and the grader gives it no points: "
              "hand in an agent you trained.")
        return
    if seen["return"] < seen["pbc"] + band.margin:
        raise ExerciseFailed(f"Band {index + 1} (\"{band.says}\") not reached on the public seeds: your agent "
                             f"{seen['return']:.1f}, %BC {seen['pbc']:.1f}; the band asks for "
                             f"{seen['pbc'] + band.margin:.1f}")
    print(f"Band {index + 1} (\"{band.says}\") reached on the public seeds; the grade is decided on "
          f"{HIDDEN_EPISODES} hidden episodes.")


# ---- the grader's side: `python -m ttlib.course.challenge play FILE --seeds ...` ----------------------------------
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ttlib.course.challenge", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("play", help="play an agent file and %BC on the same seeds; one JSON line")
    p.add_argument("path", help="the agent's checkpoint")
    p.add_argument("--seeds", required=True, help="comma-separated episode seeds")
    args = parser.parse_args(argv)
    try:
        seeds = [int(s) for s in args.seeds.split(",") if s]
        mine, theirs = play_both(args.path, seeds, progress=False)
        if not (np.isfinite(mine).all() and np.isfinite(theirs).all()):
            raise ChallengeError("an episode's return was not a number")
        result = {"returns": mine.tolist(), "pbc": theirs.tolist()}
    except TTLibError as error:  # the agent's file is wrong, or does not fit the environment: what the student reads
        result = {"error": str(error)}
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
