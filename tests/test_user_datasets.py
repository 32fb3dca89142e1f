"""Datasets a user brings (other sizes, action ranges, time limits, broken ones): honest results or one clear line.

Every dataset here is a real Minari dataset written into the test's own folder from a real gymnasium env
(Pendulum-v1: observations of 3, actions of 1 in [-2, 2]); the models are tiny and train for a few steps.
The commands run through `ttlib`'s main in this process (tests/commands.py: what the command prints, without its
imports' seconds); as a command of its own only where that is the point: one bad input, what a terminal shows; an
environment registered in this process only; Ctrl-C.
"""

import json
import os
import signal
import subprocess
import sys
import time
import warnings

import gymnasium as gym
import minari
import numpy as np
import pytest
import torch
from commands import in_process, one_line_error, ttlib  # tests/ is on sys.path
from minari.data_collector import EpisodeBuffer

from ttlib.agents import dt
from ttlib.data import trajectories as ttdata
from ttlib.evaluation import rollout
from ttlib.model.gpt import GPTConfig, TrajectoryGPT
from ttlib.model.tokenizer import TrajectoryTokenizer
from ttlib.training.checkpoints import read_checkpoint, save_checkpoint
from ttlib.training.train import TrainConfig, run_loop, train

TINY_TT = ["--steps", "3", "--n-layer", "1", "--n-embd", "16", "--n-head", "2", "--n-transitions", "2",
           "--batch-size", "4", "--eval-every", "3", "--eval-batches", "1", "--n-bins", "10"]
TINY_DT = ["--model", "dt", "--steps", "3", "--context", "2", "--n-layer", "1", "--n-embd", "16", "--n-head", "1",
           "--batch-size", "4", "--eval-every", "3", "--eval-batches", "1"]
FAST_PLAN = ["--beam-width", "2", "--horizon", "1", "--context", "1", "--expand", "1", "--top-k", "0"]


def pendulum_dataset(dataset_id, episodes=3, steps=20, *, env=None, nan_at=None, action_scale=1.0,
                     action_space=None, named=True):
    """Random-action Pendulum episodes of `steps` steps, written with Minari. env: the env they are collected
    in (default Pendulum-v1 with a `steps` time limit); nan_at: (episode, step) of an observation set to NaN;
    actions are stored times `action_scale` (in `action_space`, if given); named=False stores no env spec."""
    env = env or gym.make("Pendulum-v1", max_episode_steps=steps)
    buffers = []
    for seed in range(episodes):
        obs, _ = env.reset(seed=seed)
        env.action_space.seed(seed)
        observations, actions, rewards = [obs], [], []
        for _ in range(steps):
            action = env.action_space.sample()
            obs, reward, *_ = env.step(action)
            observations.append(obs)
            actions.append(action * action_scale)
            rewards.append(float(reward))
        observations = np.stack(observations)
        if nan_at is not None and nan_at[0] == seed:
            observations[nan_at[1], 0] = np.nan
        buffers.append(EpisodeBuffer(observations=observations, actions=np.stack(actions), rewards=rewards,
                                     terminations=[False] * steps, truncations=[False] * (steps - 1) + [True]))
    spaces = {"env": env.spec} if named else {"observation_space": env.observation_space}
    if action_space is not None or not named:
        spaces["action_space"] = action_space or env.action_space
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # Minari asks for an author and a code link
        minari.create_dataset_from_buffers(dataset_id, buffers, **spaces)
    env.close()
    return dataset_id


def tiny_tt(dataset_id, out):
    config = TrainConfig(dataset=dataset_id, steps=3, batch_size=4, eval_every=3, eval_batches=1,
                         model=GPTConfig(n_layer=1, n_embd=16, n_head=2, n_transitions=2, n_bins=10))
    return train(config, out=str(out), progress=False)


def tiny_dt(dataset_id, out=None):
    config = dt.DTTrainConfig(dataset=dataset_id, steps=3, batch_size=4, eval_every=3, eval_batches=1,
                              model=dt.DTConfig(context=2, n_layer=1, n_embd=16, n_head=1))
    return dt.train(config, out=out, progress=False)


# ---- non-finite data --------------------------------------------------------------------------------------


@pytest.mark.parametrize("model", [TINY_TT, TINY_DT], ids=["tt", "dt"])
def test_nan_in_the_data_is_refused_for_both_models(model, minari_root, tmp_path):
    pendulum_dataset("user/nan-v0", nan_at=(1, 5))
    out = tmp_path / "model.pt"
    result = in_process("train", "--dataset", "user/nan-v0", "--out", str(out), *model)
    one_line_error(result, "user/nan-v0", "non-finite", "observations", "episode 1, step 5", "repair or drop")
    assert not out.exists()  # nothing half-made is left behind


def test_nan_never_reaches_bins_weights_or_an_evaluation(tmp_path):
    from ttlib.training.train import TrainingError

    rows = np.random.default_rng(0).normal(size=(50, 6))
    rows[7, 2] = np.nan
    with pytest.raises(ValueError, match="dimension 2 .* NaN"):
        TrajectoryTokenizer.fit(rows, obs_dim=3, act_dim=1, n_bins=10)

    # a loss that turns NaN (diverged training) stops the loop before the step, with no checkpoint of it
    torch.manual_seed(0)
    model = TrajectoryGPT(GPTConfig(obs_dim=3, act_dim=1, n_bins=10, n_layer=1, n_head=2, n_embd=16,
                                    n_transitions=2))
    with torch.no_grad():
        model.pos_emb.fill_(float("nan"))
    x = torch.randint(0, 10, (4, model.config.block_size))
    saved = []
    config = TrainConfig(steps=5, eval_every=1, eval_batches=1, warmup_steps=1)
    with pytest.raises(TrainingError, match="loss became nan at step 0.*--lr"):
        run_loop(model, torch.optim.AdamW(model.parameters()), config, lambda: (x[:, :-1], x[:, 1:]), None, [],
                 checkpoint=saved.append, progress=False)
    assert saved == []

    # a checkpoint with NaN weights (made before these checks) is refused, not evaluated to NaN returns
    dt_model = dt.DecisionTransformer(dt.DTConfig(obs_dim=8, act_dim=2, context=2, n_layer=1, n_embd=16))
    with torch.no_grad():
        dt_model.action_head.weight.fill_(float("nan"))
    path = str(tmp_path / "nan.pt")
    save_checkpoint(path, dt_model, None, dataset={"env_id": "LunarLanderContinuous-v3", "env_kwargs": {},
                                                   "mean_return": 0.0}, kind=dt.KIND)
    result = in_process("evaluate", "--checkpoint", path, "--episodes", "1", "--max-steps", "2", "--target-return", "1")
    one_line_error(result, "non-finite weights", "action_head.weight", "train it again")


# ---- evaluations of nothing -------------------------------------------------------------------------------


@pytest.mark.parametrize("args, flag", [
    (["--episodes", "0", "--n-envs", "2"], "--episodes"),
    (["--episodes", "0"], "--episodes"),
    (["--episodes", "-3"], "--episodes"),
    (["--episodes", "2", "--n-envs", "-1"], "--n-envs"),
    (["--episodes", "1", "--max-steps", "0"], "--max-steps"),
    (["--model", "dt", "--episodes", "0", "--n-envs", "2"], "--episodes"),
    (["--model", "dt", "--episodes", "1", "--max-steps", "0"], "--max-steps"),
])
def test_an_evaluation_of_nothing_is_refused(args, flag):
    """Each flag's check, in this process (`ttlib`'s main, as the command calls it); the first case also as a
    command of its own, which shows what a terminal gets: exit 2 and one line, no warning or traceback."""
    if args == ["--episodes", "0", "--n-envs", "2"]:
        one_line_error(ttlib("evaluate", *args), flag)
    one_line_error(in_process("evaluate", *args), flag)


def test_library_evaluations_of_nothing_are_refused():
    model = dt.DecisionTransformer(dt.DTConfig(obs_dim=3, act_dim=1, context=2, n_layer=1, n_embd=16))
    for kwargs, message in [({"seeds": []}, "at least one episode"), ({"n_envs": 0}, "n_envs"),
                            ({"max_steps": 0}, "max_steps")]:
        with pytest.raises(ValueError, match=message):
            dt.evaluate(model, "Pendulum-v1", **{"seeds": [0], "target_return": 0.0, **kwargs}, progress=False)


# ---- the dataset's own environment ------------------------------------------------------------------------


def test_evaluation_uses_the_datasets_time_limit_and_kwargs(minari_root, tmp_path):
    pendulum_dataset("user/pendulum-g5-v0", steps=20, env=gym.make("Pendulum-v1", max_episode_steps=20, g=5.0))
    d = ttdata.load("user/pendulum-g5-v0", download=False)
    assert d.env_kwargs == {"g": 5.0, "max_episode_steps": 20}  # registered limit: 200
    env = rollout.make_env(d.env_id, d.env_kwargs)
    assert env.spec.max_episode_steps == 20 and env.unwrapped.g == 5.0
    env.close()

    ckpt = tmp_path / "tt.pt"
    tiny_tt("user/pendulum-g5-v0", ckpt)
    result = in_process("evaluate", "--checkpoint", str(ckpt), "--episodes", "2", "--json", *FAST_PLAN)
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)
    assert out["steps"] == 2 * 20  # episodes as long as the dataset's, so the comparison with its mean is fair
    assert out["dataset_mean_return"] == pytest.approx(d.returns().mean())


@pytest.mark.parametrize("case", ["unnamed", "unregistered"])
def test_an_environment_the_dataset_cannot_name_asks_for_env(case, minari_root, tmp_path):
    if case == "unnamed":
        pendulum_dataset("user/anon-v0", named=False)
        message = "names no environment"
    else:  # registered in this process only: the evaluating process has never heard of it
        gym.register("UserOnlyPendulum-v0", entry_point="gymnasium.envs.classic_control.pendulum:PendulumEnv",
                     max_episode_steps=20)
        pendulum_dataset("user/anon-v0", env=gym.make("UserOnlyPendulum-v0"))
        message = "'UserOnlyPendulum-v0' is not registered"
    ckpt = str(tmp_path / "tt.pt")
    tiny_tt("user/anon-v0", ckpt)
    args = ["evaluate", "--checkpoint", ckpt, "--episodes", "1", "--max-steps", "3", "--json", *FAST_PLAN]
    # "unregistered" needs a process of its own: this one has the environment registered
    command = ttlib if case == "unregistered" else in_process
    one_line_error(command(*args), message, "--env")
    result = command(*args, "--env", "Pendulum-v1")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["steps"] == 3


# ---- action ranges ----------------------------------------------------------------------------------------


def test_decision_transformer_acts_in_the_whole_action_space(minari_root):
    pendulum_dataset("user/pendulum-v0")  # actions in [-2, 2]
    model = tiny_dt("user/pendulum-v0").model.eval()
    assert (model.config.action_low, model.config.action_high) == ([-2.0], [2.0])
    with torch.no_grad():
        model.action_head.bias.fill_(20.0)
        high = model.predict(torch.zeros(1, 16))
        model.action_head.bias.fill_(-20.0)
        low = model.predict(torch.zeros(1, 16))
    torch.testing.assert_close(high, torch.tensor([[2.0]]))
    torch.testing.assert_close(low, torch.tensor([[-2.0]]))
    result = dt.evaluate(model, "Pendulum-v1", [0, 1], 0.0, max_steps=3, progress=False)
    assert result.steps == 6

    # a model that only reaches [-1, 1] is refused in Pendulum rather than clipped to half its torque
    narrow = dt.DecisionTransformer(dt.DTConfig(obs_dim=3, act_dim=1, context=2, n_layer=1, n_embd=16))
    with pytest.raises(ValueError, match=r"acts in \[-1, 1\].*span \[-2, 2\]"):
        dt.evaluate(narrow, "Pendulum-v1", [0], 0.0, max_steps=3, progress=False)


def test_action_space_of_minus_one_to_one_is_not_scaled():
    from ttlib.data import validate

    zeros = [np.zeros((2, 1), np.float32)] * 2
    d = ttdata.OfflineDataset(dataset_id="user/x-v0", env_id=None, env_kwargs={}, gamma=0.99, observations=zeros,
                              actions=zeros, rewards=[z[:, 0] for z in zeros], terminations=[], truncations=[],
                              values=[], behaviour=None, ref_min_score=None, ref_max_score=None,
                              action_low=[-1.0], action_high=[1.0])
    assert validate.action_bounds(d) is None  # the course dataset's case: the shipped DT acts exactly as before
    d.action_low = [-np.inf]
    with pytest.raises(ttdata.DatasetError, match="unbounded action space"):
        validate.action_bounds(d)


def test_trajectory_transformer_refuses_other_action_bounds(minari_root, tmp_path):
    # actions stored normalized to [-1, 1] (as many agents log them) for an env whose actions span [-2, 2]
    pendulum_dataset("user/normalized-v0", action_scale=0.5,
                     action_space=gym.spaces.Box(-1.0, 1.0, (1,), np.float32))
    ckpt = str(tmp_path / "tt.pt")
    tiny_tt("user/normalized-v0", ckpt)
    result = in_process("evaluate", "--checkpoint", ckpt, "--episodes", "1", "--max-steps", "3", *FAST_PLAN)
    one_line_error(result, "acts in [-1, 1]", "span [-2, 2]", "dataset's environment")


# ---- clear messages ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("dataset_id, parts", [
    ("nothing", ["malformed dataset id 'nothing'", "namespace/name-vN"]),
    ("own/nothing/here-v0", ["own/nothing/here-v0 is not on this machine", "ttlib datasets"]),
])
def test_dataset_ids_that_lead_nowhere(dataset_id, parts, minari_root, tmp_path):
    """In this process; test_an_evaluation_of_nothing_is_refused runs a bad input as a command of its own."""
    one_line_error(in_process("train", "--dataset", dataset_id, "--out", str(tmp_path / "x.pt"), *TINY_TT), *parts)


def test_datasets_lists_a_broken_dataset_with_its_fix(minari_root):
    pendulum_dataset("user/broken-v0")
    pendulum_dataset("user/fine-v0")
    data_file = minari_root / "user/broken-v0/data/main_data.hdf5"
    with open(data_file, "r+b") as file:
        file.truncate(data_file.stat().st_size // 2)
    result = in_process("datasets")
    assert result.returncode == 0, result.stderr
    broken = [line for line in result.stdout.splitlines() if line.startswith("user/broken-v0")]
    assert len(broken) == 1 and "BROKEN" in broken[0] and "delete the folder" in broken[0], result.stdout
    assert any(line.startswith("user/fine-v0") and "60 steps" in line for line in result.stdout.splitlines())


def test_a_dataset_from_a_newer_minari_says_so(minari_root, tmp_path):
    """Not broken, just newer than this Minari reads: say which version wrote it and how to get on."""
    pendulum_dataset("user/future-v0")
    metadata_file = minari_root / "user/future-v0/data/metadata.json"
    metadata = json.loads(metadata_file.read_text())
    metadata["minari_version"] = "99.0.0"
    metadata_file.write_text(json.dumps(metadata))
    result = in_process("train", "--dataset", "user/future-v0", "--out", str(tmp_path / "x.pt"), *TINY_TT)
    one_line_error(result, "was written by Minari 99.0.0", f"this Minari {minari.__version__} cannot read",
                   "pip install -U minari")


@pytest.mark.parametrize("model", [TINY_TT, TINY_DT], ids=["tt", "dt"])
def test_a_dataset_too_small_to_validate_on(model, minari_root, tmp_path):
    pendulum_dataset("user/one-v0", episodes=1, steps=4)
    result = in_process("train", "--dataset", "user/one-v0", "--out", str(tmp_path / "x.pt"), *model)
    one_line_error(result, "user/one-v0 has 1 episode(s) (4 steps)", "at least 2")


def test_resume_uses_the_checkpoints_own_settings(minari_root, tmp_path):
    pendulum_dataset("user/pendulum-v0")
    out = str(tmp_path / "tt.pt")
    first = in_process("train", "--dataset", "user/pendulum-v0", "--out", out, *TINY_TT)
    assert first.returncode == 0, first.stderr
    # no flag repeated: the checkpoint's settings, not the defaults (which would not fit its weights)
    resumed = in_process("train", "--out", out, "--resume", out, "--steps", "6")
    assert resumed.returncode == 0, resumed.stderr
    assert read_checkpoint(str(out))["step"] == 6
    changed = in_process("train", "--out", out, "--resume", out, "--steps", "9", "--n-embd", "32", "--seed", "1")
    one_line_error(changed, "--n-embd 32 (checkpoint: 16)", "--seed 1 (checkpoint: 0)", "leave them out")


def as_from_a_terminal():
    """In the child before it starts: SIGINT at its default and unblocked, as a shell leaves it. A test process may
    have inherited it ignored or blocked from whatever ran before in the same worker; a child would inherit that."""
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_ctrl_c_says_where_the_last_checkpoint_is(minari_root, tmp_path):
    pendulum_dataset("user/pendulum-v0")
    out = tmp_path / "tt.pt"
    args = list(TINY_TT)
    args[args.index("--steps") + 1] = "100000"  # far more than the test waits for
    args[args.index("--eval-every") + 1] = "1"  # a checkpoint at every step
    process = subprocess.Popen([sys.executable, "-m", "ttlib", "train", "--dataset", "user/pendulum-v0", "--out",
                                str(out), *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               env={**os.environ, "OMP_NUM_THREADS": "1"}, preexec_fn=as_from_a_terminal)
    deadline = time.monotonic() + 120
    while not out.exists() and time.monotonic() < deadline and process.poll() is None:
        time.sleep(0.2)
    time.sleep(0.5)
    process.send_signal(signal.SIGINT)
    _, stderr = process.communicate(timeout=60)
    assert process.returncode == 130, stderr[-2000:]
    assert "Traceback" not in stderr
    last = stderr.strip().splitlines()[-1]
    assert "interrupted" in last and f"--resume {out}" in last and "the last checkpoint" in last
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no half-written file
    assert read_checkpoint(str(out))["step"] >= 1
