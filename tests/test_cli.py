"""The command line, run as a learner would: python -m ttlib ...

A command of its own (tests/commands.py `ttlib`: what a terminal shows, imports and all) where a learner's first
step is: making a dataset, training, a bad input; the commands after it run through the same main function in this
process (`in_process`), which prints what the command prints without paying its imports again."""

import argparse
import dataclasses
import enum
import json
import os
import subprocess
import sys
import types
import typing

import numpy as np
import pytest
import torch
from commands import in_process, one_line_error, ttlib  # tests/ is on sys.path

from ttlib.bench.decoding import PRESETS, random_model
from ttlib.bench.flops import plan_flops
from ttlib.data import trajectories as ttdata
from ttlib.errors import TTLibError
from ttlib.planning.beam import PlannerConfig


def test_make_dataset_and_list(minari_root):
    result = ttlib("make-dataset", "--dataset", ttdata.HALFCHEETAH_DATASET)
    assert result.returncode == 0, result.stderr
    assert "20 episodes" in result.stdout and "HalfCheetah-v5" in result.stdout
    listed = in_process("datasets")
    assert ttdata.HALFCHEETAH_DATASET in listed.stdout and "4000 steps" in listed.stdout
    assert f"{ttdata.DEFAULT_DATASET}" in listed.stdout and "not built yet" in listed.stdout


def test_the_grading_commands_start_without_pytorch():
    """`ttlib grade` needs neither PyTorch nor the datasets: an instructor's collect or release starts in about
    2 s instead of 6 (a class's grading runs a dozen of them); the other commands still have their options."""
    code = ("import sys\nfrom ttlib.cli.main import build_parser, main\nmain(['grade', 'doctor'])\n"
            "print('torch imported:', 'torch' in sys.modules)\nbuild_parser().parse_args(['evaluate', '--help'])")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert "torch imported: False" in result.stdout and "--beam-width" in result.stdout, result.stderr[-2000:]


@pytest.mark.parametrize("args, message", [
    (["make-dataset", "--dataset", "ttlib/nope-v0"], "ttlib/lunarlander/mixed-v0"),
    (["evaluate", "--checkpoint", "no/such/file.pt"], "no checkpoint at no/such/file.pt"),
    (["evaluate", "--beam-width", "0", "--episodes", "1"], "beam_width must be >= 1"),
    (["evaluate", "--decoder", "static", "--value", "likelihood", "--episodes", "1"],
     "decoder='static' is the static search, which scores with the value token"),
    (["bench", "planning", "--preset", "tiny", "--repeats", "0"], "repeats"),
    (["bench", "planning", "--preset", "tiny", "--repeats", "1", "--uncached-repeats", "0", "--faster-tt",
      "no/such/dir"], "no faster-TT checkout at no/such/dir"),
])
def test_bad_input_gives_one_clear_line(args, message, minari_root):
    """Each check in this process; the missing checkpoint also as a command of its own (what a terminal shows)."""
    if args[:2] == ["evaluate", "--checkpoint"]:
        one_line_error(ttlib(*args), message)
    one_line_error(in_process(*args), message)


def test_bench_planning_json_has_the_promised_keys():
    result = in_process("bench", "planning", "--preset", "tiny", "--repeats", "2", "--json")
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)
    for key in ("ms_per_plan_cached", "ms_per_plan_uncached", "gflop_per_plan", "gflops_achieved", "batch",
                "beam_width", "horizon", "context", "sample_expand", "device", "torch_threads", "cpu", "load_1min"):
        assert key in out
    assert 0 <= out["max_logit_gap"] < 1e-3 and out["ms_per_plan_cached"] > 0 and out["device"] == "cpu"
    # the floor: the plan's FLOPs at the machine's matmul rate; each timed plan is one ratio to it
    assert out["matmul_gflops"] > 0
    assert out["floor_ms"] == pytest.approx(out["gflop_per_plan"] / out["matmul_gflops"] * 1000)
    over, share = out["plan_over_floor"], out["share_of_matmul_rate"]
    assert over["n"] == share["n"] == 2 and over["min"] <= over["median"] <= over["max"]
    assert share["max"] == pytest.approx(1 / over["min"]) and share["min"] == pytest.approx(1 / over["max"])
    p = PRESETS["tiny"]  # the figure is the count test_planning checks in closed form, for this preset
    planner = PlannerConfig(beam_width=p.beam_width, horizon=p.horizon, context=p.context,
                            sample_expand=p.sample_expand)
    config = random_model(p)[0].config
    assert out["gflop_per_plan"] == plan_flops(config, planner, batch=1) / 1e9
    # the products replayed alone are the plan's: its linear FLOPs are the count's (plus the expectations'
    # matrix-vector products, 0.03%), and each replay is one ratio to the floor and one to the plan
    assert out["gflop_linear_made"] == pytest.approx(plan_flops(config, planner, 1, attention=False) / 1e9, rel=1e-3)
    assert out["gflop_attention_made"] > 0 and out["ms_products_alone"] > 0
    alone, plan_over = out["products_alone_over_floor"], out["plan_over_products_alone"]
    assert alone["n"] == plan_over["n"] == 2 and alone["min"] <= alone["median"] <= alone["max"]


def test_bench_profile_splits_the_time_of_a_plan():
    result = in_process("bench", "profile", "--preset", "tiny", "--json")
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)
    shares = out["time_shares"]
    assert abs(sum(shares.values()) - 1) < 0.01
    assert shares["matmul: linear layers and heads"] > 0 and shares["matmul: attention (scores, weighted values)"] > 0
    assert out["aten_ops_per_plan"] > 100 and out["op_time_ms"] > 0


def test_bench_rollouts_json_times_the_same_episodes_both_ways():
    result = in_process("bench", "rollouts", "--episodes", "3", "--max-steps", "3", "--repeats", "2", "--json")
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)
    assert out["same_returns"] is True and out["episodes"] == 3 and out["steps"] == 9 and out["repeats"] == 2
    assert out["vectorized_s"] > 0 and out["sequential_s"] > 0
    assert out["speedup"] == pytest.approx(out["sequential_s"] / out["vectorized_s"])


def test_bench_decoding_json():
    result = in_process("bench", "decoding", "--preset", "tiny", "--repeats", "1", "--json")
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)
    assert out["tokens_per_s_cached"] > 0 and out["tokens_per_s_recompute"] > 0


def test_train_then_evaluate_from_the_command_line(tmp_path):
    ckpt = str(tmp_path / "tiny.pt")
    result = ttlib("train", "--out", ckpt, "--steps", "5", "--n-layer", "1", "--n-embd", "32", "--n-head", "2",
                   "--n-transitions", "4", "--batch-size", "8", "--eval-every", "5", "--eval-batches", "1",
                   "--export", str(tmp_path / "slim.pt"))
    assert result.returncode == 0, result.stderr
    assert "validation loss" in result.stdout
    assert os.path.getsize(tmp_path / "slim.pt") < os.path.getsize(ckpt)  # no optimiser state
    result = in_process("evaluate", "--checkpoint", ckpt, "--episodes", "2", "--max-steps", "5", "--beam-width", "2",
                        "--horizon", "2", "--context", "2", "--decoder", "readable", "--json")
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)
    assert out["episodes"] == 2 and out["steps"] == 10 and "dataset_mean_return" in out
    assert out["expert_mean_return"] > out["dataset_mean_return"]
    returns = np.array(out["returns"])  # the report's statistics are those of its own returns
    assert out["seeds"] == [0, 1] and out["mean_return"] == pytest.approx(returns.mean())
    assert out["stderr_return"] == pytest.approx(returns.std(ddof=1) / np.sqrt(2))
    assert out["below_zero_fraction"] == pytest.approx((returns < 0).mean())
    assert out["planner"]["value"] == "token" and out["planner"]["horizon"] == 2
    assert out["planner"]["decoder"] == "readable"

    refused = in_process("evaluate", "--checkpoint", ckpt, "--episodes", "1", "--value", "critic")
    assert refused.returncode == 2 and "has no critic" in refused.stderr and "ttlib train-critic" in refused.stderr
    with_critic = str(tmp_path / "with_critic.pt")
    result = in_process("train-critic", "--checkpoint", ckpt, "--steps", "20", "--out", with_critic)
    assert result.returncode == 0, result.stderr
    assert "critic trained 3 x 20 steps" in result.stdout and "no validation" in result.stdout
    result = in_process("evaluate", "--checkpoint", with_critic, "--episodes", "2", "--max-steps", "5", "--json")
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)
    assert out["planner"]["value"] == "critic" and out["planner"]["horizon"] == 1 and out["steps"] == 10


def test_the_default_checkpoint_follows_the_dataset(capsys):
    """`ttlib evaluate --dataset ID` plays the Trajectory Transformer shipped for that dataset, with its critic:
    the same episodes as naming its file; a checkpoint of another dataset, or a dataset nothing is shipped for,
    is refused by name."""
    from ttlib.cli.main import main
    from ttlib.course import challenge
    from ttlib.training.checkpoints import SHIPPED_TT, default_checkpoint

    assert SHIPPED_TT[challenge.DATASET] == challenge.TT_CHECKPOINT  # notebook 10 plays the same file
    short = ["--episodes", "2", "--max-steps", "8", "--json"]
    reports = []
    for how in (["--dataset", ttdata.NO_EXPERT_DATASET], ["--checkpoint", default_checkpoint(challenge.TT_CHECKPOINT)]):
        assert main(["evaluate", *how, *short]) == 0
        reports.append(json.loads(capsys.readouterr().out))
    by_dataset, by_file = reports
    assert by_dataset["planner"]["value"] == "critic" and by_dataset["steps"] == 16
    assert by_dataset["returns"] == by_file["returns"] and by_dataset["weights"] == by_file["weights"]
    assert by_dataset["dataset_mean_return"] == by_file["dataset_mean_return"] != json.loads(
        in_process("evaluate", *short).stdout)["dataset_mean_return"]  # the course dataset's, without --dataset
    course_tt = ["--checkpoint", default_checkpoint(), "--dataset", ttdata.NO_EXPERT_DATASET, "--episodes", "1"]
    one_line_error(in_process("evaluate", *course_tt),
                   f"trained on {ttdata.DEFAULT_DATASET}, not {ttdata.NO_EXPERT_DATASET}")
    one_line_error(in_process("evaluate", "--model", "dt", "--dataset", ttdata.NO_EXPERT_DATASET, "--episodes", "1"),
                   f"no checkpoint is shipped for {ttdata.NO_EXPERT_DATASET}", "ttlib train --model dt --dataset")


def test_iql_on_the_data_without_the_expert_extracts_from_the_critic_shipped_for_it():
    from ttlib.agents.baselines import critic_for
    from ttlib.agents.critic import load_critic
    from ttlib.training.checkpoints import SHIPPED_TT, default_checkpoint

    shipped = load_critic(default_checkpoint(SHIPPED_TT[ttdata.NO_EXPERT_DATASET]), device="cpu")
    extracted = critic_for(None, ttdata.NO_EXPERT_DATASET)
    assert extracted is not None and all(torch.equal(a, b) for a, b in zip(
        extracted.state_dict().values(), shipped.state_dict().values(), strict=True))


def test_a_bug_keeps_its_traceback_and_a_mistake_is_one_line(monkeypatch, capsys):
    """`ttlib` prints a TTLibError (a mistake in what the user gave) as one line and exits with 2. Anything else is a
    bug: a ValueError from deep inside (here numpy's, of a shape that cannot broadcast) leaves `main` with its
    traceback, which names the function that raised it, and nothing is printed as if it were the user's mistake."""
    from ttlib.cli.main import main
    from ttlib.data.minari_io import DatasetError

    def broken():
        return np.zeros(3) + np.zeros(4)

    monkeypatch.setattr(ttdata, "list_local", broken)
    with pytest.raises(ValueError, match="could not be broadcast") as raised:
        main(["datasets"])
    assert not isinstance(raised.value, TTLibError)
    assert raised.traceback[-1].name == "broken", [entry.name for entry in raised.traceback]
    assert "error:" not in capsys.readouterr().err

    def mistaken():
        raise DatasetError("dataset x is damaged: build it again")

    monkeypatch.setattr(ttdata, "list_local", mistaken)
    assert main(["datasets"]) == 2
    assert capsys.readouterr().err == "ttlib datasets: error: dataset x is damaged: build it again\n"


# ---- one path from a config to options and back --------------------------------------------------------------------
def config_commands():
    """(command, its required options, the configs whose fields are its options, fields that are not, renames)."""
    from ttlib.agents.baselines import PolicyConfig
    from ttlib.agents.critic import CriticConfig
    from ttlib.cli.baselines import POLICY_NAMES
    from ttlib.cli.evaluate import PLANNER_NAMES
    from ttlib.cli.train import CRITIC_SKIP, TRAIN_SKIP, train_configs

    return [("train", ["--out", "x.pt"], train_configs(), TRAIN_SKIP, None),
            ("train-critic", ["--checkpoint", "x.pt"], {"critic": CriticConfig()}, CRITIC_SKIP, None),
            ("evaluate", [], {"planner": PlannerConfig()}, (), PLANNER_NAMES),
            ("evaluate", [], {"bc/iql": PolicyConfig()}, ("kind",), POLICY_NAMES)]


def another(value, hint):
    """A value of the field's type other than `value`, and how a command line writes it."""
    union = typing.get_origin(hint) in (typing.Union, types.UnionType)
    kind = [a for a in typing.get_args(hint) if a is not type(None)][0] if union else hint
    if typing.get_origin(kind) is typing.Literal:
        new = next(c for c in typing.get_args(kind) if c != value)
    elif isinstance(kind, type) and issubclass(kind, enum.Enum):
        new = next(m for m in kind if m != value)
        return new, str(new.value)
    elif kind is bool:
        new = not value
    elif kind is str:
        new = f"{value}x"
    else:
        new = (value or 0) + 3 if kind is int else value / 2 if value else 0.25  # (a float stays in (0, 1])
    return new, str(new)


class Shade(enum.Enum):
    LIGHT = "light"
    DARK = "dark"


@dataclasses.dataclass
class Inner:
    width: int = 8  # how wide


@dataclasses.dataclass
class Every:
    decoder: typing.Literal["auto", "fused", "static"] = "auto"  # which decoder: the choices are
    #                                                              the Literal's values
    shade: Shade = Shade.LIGHT  # an Enum's values are its choices too
    limit: float | None = None  # None: no limit
    fast: bool = True  # --fast / --no-fast
    inner: Inner = dataclasses.field(default_factory=Inner)  # its fields are options of their own


def test_a_literal_or_an_enum_field_becomes_choices_and_a_comment_its_help():
    """What a config change brings by itself: a field typed Literal["auto", ...] (as PlannerConfig.decoder) or
    Enum gets its values as choices, a wrong one is refused by argparse, and the help is the field's comment."""
    from ttlib.cli.options import add_config_options, config_from

    parser = argparse.ArgumentParser()
    add_config_options(parser, {"every": Every()})
    helped = parser.format_help()
    for words in ("{auto,fused,static}", "which decoder: the choices are the Literal's values (default auto)",
                  "{light,dark}", "--no-fast", "--width", "how wide (default 8)", "None: no limit"):
        assert words in " ".join(helped.split()), words
    args = parser.parse_args(["--decoder", "static", "--shade", "dark", "--limit", "0.5", "--no-fast",
                              "--width", "3"])
    assert config_from(args, Every()) == Every("static", Shade.DARK, 0.5, False, Inner(3))
    assert config_from(parser.parse_args([]), Every(decoder="fused")) == Every(decoder="fused")
    for wrong in (["--decoder", "slow"], ["--shade", "grey"]):
        with pytest.raises(SystemExit):
            parser.parse_args(wrong)
    from ttlib.agents.dt import DTConfig

    with pytest.raises(TypeError, match="DTConfig.action_low: no command-line option"):  # list[float] | None
        add_config_options(argparse.ArgumentParser(), {"dt": DTConfig()})


@pytest.mark.parametrize("command, required, configs, skip, names", config_commands(),
                         ids=["train", "train-critic", "evaluate-planner", "evaluate-baselines"])
def test_every_config_field_is_an_option_and_comes_back(command, required, configs, skip, names, capsys):
    """Each field (a nested config's too) set to another value on the command line comes back in the config; left
    out, the config is as it was; an old spelling is an alias of its option; --help names every option."""
    from ttlib.cli.main import build_parser
    from ttlib.cli.options import config_from, given, leaves, option

    parser = build_parser()
    with pytest.raises(SystemExit):
        parser.parse_args([command, "--help"])
    helped = capsys.readouterr().out
    for config in configs.values():
        before = {name: value for name, (value, _, _) in leaves(config).items()}
        for name, (value, hint, _) in leaves(config).items():  # one at a time: a config checks its fields together
            if name not in skip:
                new, written = another(value, hint)
                flag = option(name, names)
                argv = [flag if new else f"--no-{flag[2:]}"] if hint is bool else [flag, written]
                assert flag in helped, f"`ttlib {command} --help` does not show {flag}"
                back = config_from(parser.parse_args([command, *required, *argv]), config, names)
                assert {n: v for n, (v, _, _) in leaves(back).items()} == {**before, name: new}, flag
        assert config_from(parser.parse_args([command, *required]), config, names) == config
        for name, (_, *aliases) in (names or {}).items():
            for alias in aliases:
                new, written = another(leaves(config)[name][0], leaves(config)[name][1])
                assert given(parser.parse_args([command, *required, alias, written]), config, names) == {name: new}


@pytest.mark.parametrize("args, message", [
    (["train", "--out", "x.pt", "--context", "5"], "--model tt has no option --context"),
    (["train", "--out", "x.pt", "--model", "dt", "--n-bins", "5", "--hidden", "8"],
     "--model dt has no option --hidden, --n-bins"),
    (["train", "--out", "x.pt", "--model", "bc", "--max-weight", "5"], "--max-weight weighs IQL's advantages"),
    (["evaluate", "--model", "dt", "--episodes", "1", "--expand", "2"], "--model dt acts without planning: leave "
     "out --sample-expand"),
    (["evaluate", "--model", "tt", "--episodes", "1", "--train-seed", "2"], "--train-seed: for the baselines only"),
])
def test_an_option_of_another_model_is_refused_by_name(args, message, capsys):
    from ttlib.cli.main import main

    assert main(args) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], lines
