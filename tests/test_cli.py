"""The command line, run as a learner would: python -m ttlib ..."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from ttlib.bench.decoding import PRESETS, plan_flops, random_model
from ttlib.data import trajectories as ttdata
from ttlib.planning.beam import PlannerConfig


def ttlib(*args, env=None, timeout=300):
    return subprocess.run([sys.executable, "-m", "ttlib", *args], capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, "OMP_NUM_THREADS": "1", **(env or {})})


def test_make_dataset_and_list(minari_root):
    result = ttlib("make-dataset", "--dataset", ttdata.HALFCHEETAH_DATASET)
    assert result.returncode == 0, result.stderr
    assert "20 episodes" in result.stdout and "HalfCheetah-v5" in result.stdout
    listed = ttlib("datasets")
    assert ttdata.HALFCHEETAH_DATASET in listed.stdout and "4000 steps" in listed.stdout
    assert f"{ttdata.DEFAULT_DATASET}" in listed.stdout and "not built yet" in listed.stdout


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
    result = ttlib(*args)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], result.stderr


def test_bench_planning_json_has_the_promised_keys():
    result = ttlib("bench", "planning", "--preset", "tiny", "--repeats", "2", "--json")
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
    result = ttlib("bench", "profile", "--preset", "tiny", "--json")
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)
    shares = out["time_shares"]
    assert abs(sum(shares.values()) - 1) < 0.01
    assert shares["matmul: linear layers and heads"] > 0 and shares["matmul: attention (scores, weighted values)"] > 0
    assert out["aten_ops_per_plan"] > 100 and out["op_time_ms"] > 0


def test_bench_rollouts_json_times_the_same_episodes_both_ways():
    result = ttlib("bench", "rollouts", "--episodes", "3", "--max-steps", "3", "--repeats", "2", "--json")
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)
    assert out["same_returns"] is True and out["episodes"] == 3 and out["steps"] == 9 and out["repeats"] == 2
    assert out["vectorized_s"] > 0 and out["sequential_s"] > 0
    assert out["speedup"] == pytest.approx(out["sequential_s"] / out["vectorized_s"])


def test_bench_decoding_json():
    result = ttlib("bench", "decoding", "--preset", "tiny", "--repeats", "1", "--json")
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
    result = ttlib("evaluate", "--checkpoint", ckpt, "--episodes", "2", "--max-steps", "5", "--beam-width", "2",
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

    refused = ttlib("evaluate", "--checkpoint", ckpt, "--episodes", "1", "--value", "critic")
    assert refused.returncode == 2 and "has no critic" in refused.stderr and "ttlib train-critic" in refused.stderr
    with_critic = str(tmp_path / "with_critic.pt")
    result = ttlib("train-critic", "--checkpoint", ckpt, "--steps", "20", "--out", with_critic)
    assert result.returncode == 0, result.stderr
    assert "critic trained 3 x 20 steps" in result.stdout and "no validation" in result.stdout
    result = ttlib("evaluate", "--checkpoint", with_critic, "--episodes", "2", "--max-steps", "5", "--json")
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)
    assert out["planner"]["value"] == "critic" and out["planner"]["horizon"] == 1 and out["steps"] == 10
