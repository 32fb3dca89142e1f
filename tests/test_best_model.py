"""The best model, not the last: on a small real dataset a run keeps its best evaluation's model and hands it out,
says when it overfits, stops early when asked, resumes with its best, and checkpoints from before it kept one
still load everywhere.

The dataset is the README's example of a dataset of one's own (ttlib/data/examples/pendulum_dataset.py: Pendulum-v1, a
swing-up controller with noise and random torques), 6 episodes, written with Minari into the test's folder. The
model is small and its learning rate high, so that it learns the 4 training episodes by heart within seconds. The
overfitting run is a command of its own (what a terminal shows); the commands after it run in this process
(tests/commands.py `in_process`: the same output, without the imports' seconds).
"""

import json
from pathlib import Path

import pytest
import torch
from commands import in_process, ttlib  # tests/ is on sys.path

from ttlib.agents import dt
from ttlib.model.tokenizer import NoBinMeansWarning
from ttlib.training.best_model import TIE, BestModel, overfitting
from ttlib.training.checkpoint_files import CheckpointError, write_payload
from ttlib.training.checkpoints import (
    checkpoint_weights,
    export_checkpoint,
    load_checkpoint,
    read_checkpoint,
    weights_info,
)
from ttlib.training.train import TrainConfig, fit_recipe, train

ROOT = Path(__file__).resolve().parent.parent
DATASET = "user/pendulum/mixed-v0"
OVERFIT = dict(steps=120, eval_every=10, eval_batches=4, batch_size=32, lr=6e-3, min_lr=6e-3, warmup_steps=10,
               val_fraction=0.34, n_layer=2, n_embd=64, n_head=2, n_transitions=4, dropout=0.0)
FAST_PLAN = ["--beam-width", "2", "--horizon", "1", "--context", "1", "--expand", "1", "--top-k", "0"]


def options(settings: dict) -> list[str]:
    return [x for name, value in settings.items() for x in (f"--{name.replace('_', '-')}", str(value))]


def make_dataset(episodes: int = 6) -> None:
    """The README's example script, run as a user would (into MINARI_DATASETS_PATH)."""
    from ttlib.data.examples import pendulum_dataset

    pendulum_dataset.main(["--dataset", DATASET, "--episodes", str(episodes), "--seed", "3"])


@pytest.fixture(scope="module")
def overfit_run(tmp_path_factory):
    """`ttlib train` that overfits: its output and its checkpoint (with a slim export), in a Minari folder of its
    own."""
    folder = tmp_path_factory.mktemp("best")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("MINARI_DATASETS_PATH", str(folder / "datasets"))
        make_dataset()
        out, slim = folder / "tt.pt", folder / "slim.pt"
        result = ttlib("train", "--dataset", DATASET, "--out", str(out), "--export", str(slim), *options(OVERFIT))
        assert result.returncode == 0, result.stderr[-3000:]
        yield result, out, slim


def test_the_best_model_is_kept_beside_the_last(overfit_run):
    result, out, _ = overfit_run
    payload = read_checkpoint(str(out))
    history, best = payload["history"], payload["best"]
    last_step = history[-1]["step"]
    assert last_step == OVERFIT["steps"] - 1 and payload["step"] == OVERFIT["steps"]  # resume goes on from here
    # the kept evaluation: the latest within TIE of the lowest so far of the action tokens' validation loss (what
    # the planner samples from), replayed from the history
    assert best["on"] == "val_action_loss"
    replay = BestModel()
    for row in history:
        replay.observe(row["step"], row["val_action_loss"], "val_action_loss")
    assert best == replay.summary()
    lowest = min(row["val_action_loss"] for row in history)
    assert best["lowest"] == lowest and best["val_loss"] <= (1 + TIE) * lowest
    # this run overfits: its best is far back, and its last model is far worse on held-out episodes
    assert best["step"] <= last_step / 2 and history[-1]["val_action_loss"] > 1.2 * best["val_loss"], history
    assert best["behind"] == sum(row["step"] > best["step"] for row in history)
    # both models are in the one file: the best as "model", the last beside it
    assert not all(torch.equal(payload["model"][k], v) for k, v in payload["last_model"].items())
    model, _, _ = load_checkpoint(str(out), device="cpu")
    last, _, _ = load_checkpoint(str(out), device="cpu", which="last")
    for name, value in model.state_dict().items():
        assert torch.equal(value, payload["model"][name])
        assert torch.equal(last.state_dict()[name], payload["last_model"][name])
    assert weights_info(payload) == {"which": "best", "step": best["step"], "val_loss": best["val_loss"]}
    assert weights_info(payload, "last")["step"] == last_step
    with pytest.raises(CheckpointError, match="one of best, last"):
        load_checkpoint(str(out), which="first")


def test_training_says_it_overfits_and_which_model_it_kept(overfit_run):
    result, out, _ = overfit_run
    best = read_checkpoint(str(out))["best"]
    lines = result.stdout.strip().splitlines()
    assert sum(line.startswith("overfitting: the validation loss has been more than 10% above its lowest")
               for line in lines) == 1, result.stdout  # said once, the moment it is so
    final = lines[-1]
    assert f"best model: step {best['step']}, validation loss of the action tokens {best['val_loss']:.3f}" in final
    assert f"--which last for step {OVERFIT['steps'] - 1}'s" in final
    assert "Overfitting: the validation loss" in final
    for remedy in ("fewer --steps", "more --dropout", "a smaller model", "more data", "--early-stop 3"):
        assert remedy in final
    assert "OVERFITTING=+" in result.stderr  # on the progress bar


def test_evaluate_export_and_the_critic_use_the_best_model(overfit_run, tmp_path):
    _, out, slim = overfit_run
    payload = read_checkpoint(str(out))
    best_step, last_step = payload["best"]["step"], payload["history"][-1]["step"]
    # the slim copy ships the best model alone
    shipped = read_checkpoint(str(slim))
    assert {"last_model", "optimizer", "generator", "val_generator"}.isdisjoint(shipped)
    assert shipped["best"] == payload["best"]
    assert all(torch.equal(v, payload["model"][k]) for k, v in shipped["model"].items())
    last_copy = str(tmp_path / "last.pt")
    export_checkpoint(str(out), last_copy, which="last")
    last = read_checkpoint(last_copy)
    assert "best" not in last and weights_info(last)["step"] == last_step
    assert all(torch.equal(v, payload["last_model"][k]) for k, v in last["model"].items())

    # a critic is learnt from the data, not from the model: the checkpoint it is written into keeps both models
    with_critic = str(tmp_path / "critic.pt")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("MINARI_DATASETS_PATH", str(out.parent / "datasets"))
        result = in_process("train-critic", "--checkpoint", str(out), "--out", with_critic, "--steps", "20",
                            "--members", "2", "--hidden", "16", "--val-fraction", "0.34")
    assert result.returncode == 0, result.stderr[-2000:]
    held, fitted = (sum(row[key] for row in read_checkpoint(with_critic)["critic"]["history"] if row["step"] == 19)
                    / 2 for key in ("val_td_loss", "train_td_loss"))
    assert f"TD loss on the held-out episodes {held:.2f}, on as many training transitions {fitted:.2f}" in \
        result.stdout
    both = read_checkpoint(with_critic)
    assert both["best"] == payload["best"] and "last_model" in both and both["critic"] is not None

    for which, step in (("best", best_step), ("last", last_step)):
        args = ["evaluate", "--checkpoint", with_critic, "--episodes", "1", "--max-steps", "3", "--json", *FAST_PLAN]
        result = in_process(*args, *([] if which == "best" else ["--which", "last"]))
        assert result.returncode == 0, result.stderr[-2000:]
        report = json.loads(result.stdout)
        assert report["weights"]["which"] == which and report["weights"]["step"] == step
        assert report["planner"]["value"] == "critic"


def test_early_stop_stops_and_the_recipe_is_said(minari_root, tmp_path):
    make_dataset()
    out = str(tmp_path / "tt.pt")
    settings = {k: v for k, v in OVERFIT.items() if k != "eval_every"}  # left to the data: fitted, and said
    result = in_process("train", "--dataset", DATASET, "--out", out, *options(settings), "--early-stop", "3")
    assert result.returncode == 0, result.stderr[-3000:]
    payload = read_checkpoint(out)
    every = payload["train_config"]["eval_every"]
    assert every == round(250 * OVERFIT["steps"] / 5400)  # as many evaluations as the course's run
    assert f"{DATASET}: fitted to 800 training windows: a validation loss every {every} steps" in result.stdout
    history, best = payload["history"], payload["best"]
    ran = history[-1]["step"] + 1
    assert ran < OVERFIT["steps"] and payload["step"] == ran
    assert best["behind"] == 3 and [row["step"] for row in history[-3:]] == [best["step"] + every * k
                                                                              for k in (1, 2, 3)]
    assert f"trained {ran} of {OVERFIT['steps']} steps (stopped early: --early-stop 3)" in result.stdout


def test_resume_goes_on_from_the_last_and_keeps_the_best(minari_root, tmp_path):
    make_dataset()
    settings = {**OVERFIT, "steps": 100, "dataset": DATASET}
    straight = train(TrainConfig.from_settings(settings), progress=False)
    half = str(tmp_path / "half.pt")
    train(TrainConfig.from_settings({**settings, "steps": 41}), out=half, progress=False)  # evaluated at 40
    resumed = train(TrainConfig.from_settings(settings), out=half, resume=half, progress=False)
    # lr == min_lr: the schedule does not depend on the total, so resuming is the same run, evaluations included
    assert [row["step"] for row in resumed.history] == [row["step"] for row in straight.history]
    for a, b in zip(resumed.history, straight.history, strict=True):
        assert a["val_loss"] == pytest.approx(b["val_loss"], rel=1e-5)
    assert resumed.best == straight.best and resumed.best["step"] < 99
    for name, value in straight.model.state_dict().items():  # the best model, not the last
        torch.testing.assert_close(resumed.model.state_dict()[name], value)
        torch.testing.assert_close(resumed.last_weights[name], straight.last_weights[name])
    assert read_checkpoint(half)["best"] == straight.best


def test_checkpoints_from_before_the_best_was_kept_load_everywhere(minari_root, tmp_path):
    for name in ("tt_lunarlander.safetensors", "dt_lunarlander.safetensors"):  # shipped before: one model, no "best"
        payload = read_checkpoint(str(ROOT / "assets" / name), kind=None)
        assert "best" not in payload and checkpoint_weights(payload, "last") is payload["model"]
        assert weights_info(payload) == weights_info(payload, "last") == {
            "which": "last", "step": payload["history"][-1]["step"], "val_loss": payload["history"][-1]["val_loss"]}
    tt = str(ROOT / "assets" / "tt_lunarlander.safetensors")
    for which in ("best", "last"):
        model, _, _ = load_checkpoint(tt, device="cpu", which=which)
        dt.load_checkpoint(str(ROOT / "assets" / "dt_lunarlander.safetensors"), device="cpu", which=which)
    copy = str(tmp_path / "copy.pt")
    export_checkpoint(tt, copy)
    again, _, _ = load_checkpoint(copy, device="cpu")
    for name, value in model.state_dict().items():
        assert torch.equal(again.state_dict()[name], value)

    # resuming a run saved the old way: its only model is the last, and the comparison starts again from it
    make_dataset()
    settings = {**OVERFIT, "steps": 21, "dataset": DATASET}
    new = str(tmp_path / "new.pt")
    train(TrainConfig.from_settings(settings), out=new, progress=False)
    payload = read_checkpoint(new)
    payload["model"] = payload.pop("last_model", payload["model"])
    for key in ("best", "val_generator"):
        payload.pop(key)
    old = str(tmp_path / "old.pt")
    write_payload(old, payload)
    resumed = train(TrainConfig.from_settings({**settings, "steps": 31}), out=old, resume=old, progress=False)
    assert [row["step"] for row in resumed.history] == [0, 10, 20, 30]
    assert resumed.best["step"] in (20, 30) and read_checkpoint(old)["best"] == resumed.best


def test_a_decision_transformer_keeps_its_best_model_too(minari_root, tmp_path):
    make_dataset()
    config = dt.DTTrainConfig(dataset=DATASET, steps=60, eval_every=10, eval_batches=4, batch_size=32, lr=3e-3,
                              min_lr=3e-3, warmup_steps=10, val_fraction=0.34,
                              model=dt.DTConfig(context=4, n_layer=2, n_embd=64, dropout=0.0))
    out = str(tmp_path / "dt.pt")
    result = dt.train(config, out=out, progress=False)
    payload = read_checkpoint(out, kind=dt.KIND)
    replay = BestModel()
    for row in result.history:
        replay.observe(row["step"], row["val_loss"])
    assert payload["best"] == result.best == replay.summary()
    kept_last = result.best["step"] == result.history[-1]["step"]
    assert ("last_model" not in payload) == kept_last
    model, _ = dt.load_checkpoint(out, device="cpu")
    last, _ = dt.load_checkpoint(out, device="cpu", which="last")
    for name, value in model.state_dict().items():
        assert torch.equal(value, result.model.state_dict()[name].cpu())
        assert torch.equal(last.state_dict()[name], result.last_weights[name])


def test_the_recipe_fits_the_datasets_size():
    course, note = fit_recipe(TrainConfig(), 97_330)  # the course dataset's training windows
    assert (course.steps, course.eval_every) == (5400, 250) and "the course recipe's" in note
    small, note = fit_recipe(TrainConfig(), 11_400)  # 60 Pendulum episodes less 3 held out
    assert (small.steps, small.eval_every) == (712, 33) and "4 passes" in note
    tiny, note = fit_recipe(TrainConfig(), 1_000)
    assert (tiny.steps, tiny.eval_every) == (200, 9) and "the fewest" in note
    given, note = fit_recipe(TrainConfig(steps=100, eval_every=7), 1_000)
    assert (given.steps, given.eval_every, note) == (100, 7, None)
    assert fit_recipe(TrainConfig(steps=100), 1_000)[0].eval_every == 5


def test_no_alarm_and_the_last_model_kept_on_the_course_runs():
    """The shipped runs, replayed: the course's own data raise no overfitting warning, and the model the rule keeps
    is the last step's -- the one shipped. (They were kept on the total validation loss, the only one their
    histories log; runs now keep the best on the action tokens'.)"""
    for name in ("tt_lunarlander.safetensors", "dt_lunarlander.safetensors"):
        history = read_checkpoint(str(ROOT / "assets" / name), kind=None)["history"]
        assert overfitting(history) is None
        best = BestModel()
        for row in history:
            best.observe(row["step"], row["val_loss"])
        assert best.step == history[-1]["step"], name


def test_an_old_checkpoints_tokenizer_is_refreshed_with_its_bins_means(overfit_run, tmp_path):
    """tools/refresh_tokenizer: the means computed again from the data the checkpoint names are the ones a fresh run
    keeps; the model and the rest of the file stay as they were; data that fits other edges is refused."""
    from tools.refresh_tokenizer import refresh

    _, out, _ = overfit_run
    payload = read_checkpoint(str(out))
    fresh = payload["tokenizer"]
    assert "means" in fresh  # a run keeps them
    old = tmp_path / "old.pt"
    write_payload(str(old), {**payload, "tokenizer": {k: v for k, v in fresh.items() if k != "means"}})
    with pytest.warns(NoBinMeansWarning):
        load_checkpoint(str(old), device="cpu")
    refreshed = refresh(str(old), str(tmp_path / "new.pt"), progress=False)
    assert refreshed == fresh
    again = read_checkpoint(str(tmp_path / "new.pt"))
    assert again["tokenizer"] == fresh and all(torch.equal(again["model"][k], v) for k, v in payload["model"].items())
    other = {**payload, "train_config": {**payload["train_config"], "seed": 1}}  # another split: other edges
    write_payload(str(old), other)
    with pytest.raises(CheckpointError, match="not the checkpoint's"):
        refresh(str(old), progress=False)
