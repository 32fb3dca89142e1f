"""The Decision Transformer: its cache gives the recompute's actions, it trains, it acts, bad input fails clearly."""

import json
import os

import numpy as np
import pytest
import torch

from ttlib.agents import dt
from ttlib.cli.main import main
from ttlib.data import trajectories as ttdata
from ttlib.data.trajectories import split_episodes
from ttlib.training.checkpoint_files import CheckpointError
from ttlib.training.checkpoints import default_checkpoint, load_checkpoint, read_checkpoint

ENV = "LunarLanderContinuous-v3"
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def course_data():
    return ttdata.load(progress=False)


def tiny_model(context=4, obs_dim=8, act_dim=2, seed=0, n_head=2):
    torch.manual_seed(seed)
    model = dt.DecisionTransformer(dt.DTConfig(obs_dim=obs_dim, act_dim=act_dim, context=context, n_layer=2,
                                               n_head=n_head, n_embd=16, dropout=0.0, max_timestep=50))
    model.set_obs_stats(torch.randn(obs_dim), torch.rand(obs_dim) + 0.5)
    return model.eval()


def play(model, use_cache, keep, steps=13, E=3, seed=1):
    """Feed the agent the same random states and rewards; return its actions (steps, E, act) and pass counts."""
    rng = np.random.default_rng(seed)
    agent = dt.DTAgent(model, rng.normal(size=E) * 100, E, use_cache=use_cache, keep=keep)
    actions = []
    for _ in range(steps):
        actions.append(agent.act(rng.normal(size=(E, model.config.obs_dim))))
        agent.observe(rng.normal(size=E) * 10)
    return np.stack(actions), agent.passes


@pytest.mark.parametrize("keep", [1, 2, 4])
def test_cached_actions_equal_a_full_recompute(keep):
    model = tiny_model(context=4)
    cached, passes = play(model, use_cache=True, keep=keep)
    recomputed, full = play(model, use_cache=False, keep=keep)
    np.testing.assert_allclose(cached, recomputed, atol=1e-5, rtol=0)
    assert full == {"fresh": 13, "cached": 0}
    # the cache did the work: one fresh pass at the start and one per refill, every other step 3 new tokens
    refills = len(range(4, 13, 4 - keep + 1))  # the window is full at step 4, then every (K - keep + 1) steps
    assert passes == {"fresh": 1 + refills, "cached": 13 - 1 - refills}


def test_keep_k_is_the_classic_sliding_window():
    """With keep = K the agent acts on exactly the last K triples, as the original DT does."""
    K, E, steps = 4, 2, 9
    model = tiny_model(context=K)
    rng = np.random.default_rng(5)
    targets = rng.normal(size=E) * 50
    agent = dt.DTAgent(model, targets, E, use_cache=True, keep=K)
    R, S, A = [], [], []
    remaining = torch.tensor(targets, dtype=torch.float32)
    for t in range(steps):
        s = rng.normal(size=(E, 8))
        a = agent.act(s)
        R.append(remaining.clone())
        S.append(torch.tensor(s, dtype=torch.float32))
        first = max(0, t - K + 1)
        with torch.no_grad():  # the plain forward pass on the last (up to) K triples
            window = slice(first, t + 1)
            acts = torch.stack(A[window] + [torch.zeros(E, 2)], 1)
            predicted, _ = model(torch.stack(R[window], 1)[..., None], torch.stack(S[window], 1), acts,
                                 torch.arange(first, t + 1).expand(E, -1))
        np.testing.assert_allclose(a, predicted[:, -1].numpy(), atol=1e-5, rtol=0)
        A.append(torch.tensor(a))
        r = rng.normal(size=E)
        agent.observe(r)
        remaining -= torch.tensor(r, dtype=torch.float32)


def test_returns_to_go_and_windows(course_data):
    np.testing.assert_allclose(dt.returns_to_go(np.array([1.0, 2.0, -4.0])), [-1.0, -2.0, -4.0])
    episodes = ttdata.OfflineDataset(**{**course_data.__dict__, **{k: getattr(course_data, k)[:3] for k in (
        "observations", "actions", "rewards", "terminations", "truncations", "values", "behaviour")}})
    windows = dt.Windows(episodes, context=20)
    assert len(windows) == episodes.n_steps
    R, S, A, T, M = windows.sample(64, torch.Generator().manual_seed(0))
    assert R.shape == (64, 20, 1) and S.shape == (64, 20, 8) and A.shape == (64, 20, 2) and T.shape == (64, 20)
    for i in range(64):
        n = int(M[i].sum())
        assert n >= 1 and torch.all(M[i, :n] == 1) and torch.all(M[i, n:] == 0)  # real steps, then padding
        t0 = int(T[i, 0])
        e = next(e for e in range(3) if t0 < len(episodes.rewards[e])
                 and np.allclose(episodes.observations[e][t0], S[i, 0].numpy()))
        torch.testing.assert_close(T[i, :n], torch.arange(t0, t0 + n))
        np.testing.assert_allclose(R[i, :n, 0], dt.returns_to_go(episodes.rewards[e])[t0:t0 + n], rtol=1e-5)
        np.testing.assert_allclose(A[i, :n], episodes.actions[e][t0:t0 + n])


def test_training_learns_and_the_checkpoint_reloads(course_data, tmp_path):
    config = dt.DTTrainConfig(batch_size=16, steps=60, warmup_steps=5, eval_every=20, eval_batches=2, lr=3e-3,
                              model=dt.DTConfig(context=5, n_layer=1, n_embd=32, dropout=0.0))
    out = str(tmp_path / "dt.pt")
    result = dt.train(config, out=out, data=course_data, progress=False)
    first, last = result.history[0], result.history[-1]
    assert last["val_loss"] < 0.8 * first["val_loss"], result.history  # the actions' MSE falls
    model, payload = dt.load_checkpoint(out, device="cpu")
    assert payload["kind"] == dt.KIND and payload["dataset"]["env_id"] == ENV and payload["step"] == 60
    # the model normalizes with the statistics of its training episodes (the validation ones held out)
    train_episodes, _ = split_episodes(course_data, config.val_fraction, config.seed)
    states = np.concatenate([course_data.observations[e] for e in train_episodes])
    np.testing.assert_allclose(model.obs_mean.numpy(), states.mean(0), rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(model.obs_std.numpy(), states.std(0), rtol=1e-6, atol=1e-6)
    batch = dt.Windows(course_data, 5).sample(4, torch.Generator().manual_seed(1))
    with torch.no_grad():
        torch.testing.assert_close(model(*batch)[0], result.model.cpu()(*batch)[0])
    assert [p.name for p in tmp_path.iterdir()] == ["dt.pt"]  # no temporary file left


def test_resume_continues_exactly(course_data, tmp_path):
    # lr == min_lr makes the schedule independent of the total, so a 6-step run resumed to 12 must equal 12 steps
    config = dict(context=3, n_layer=1, n_embd=16, batch_size=8, warmup_steps=1, lr=1e-3, min_lr=1e-3,
                  eval_every=3, eval_batches=1, dropout=0.0)
    straight = dt.train(dt.DTTrainConfig.from_settings({**config, "steps": 12}), data=course_data, progress=False)
    half = str(tmp_path / "half.pt")
    dt.train(dt.DTTrainConfig.from_settings({**config, "steps": 6}), out=half, data=course_data, progress=False)
    assert read_checkpoint(half, kind=dt.KIND)["step"] == 6
    resumed = dt.train(dt.DTTrainConfig.from_settings({**config, "steps": 12}), resume=half, data=course_data,
                       progress=False)
    assert resumed.history[-1]["step"] == 11
    for a, b in zip(straight.last_weights.values(), resumed.last_weights.values(), strict=True):  # the last step's
        torch.testing.assert_close(a, b)


def test_wrong_model_kind_and_sizes_fail_clearly(tmp_path):
    with pytest.raises(CheckpointError, match="not a Decision Transformer"):
        dt.load_checkpoint(os.path.join(ROOT, "assets", "tt_lunarlander.safetensors"))
    model = tiny_model()
    path = str(tmp_path / "dt.pt")
    from ttlib.training.checkpoints import save_checkpoint

    save_checkpoint(path, model, None, dataset={}, kind=dt.KIND)
    with pytest.raises(CheckpointError, match="'decision-transformer' model, not a 'trajectory-gpt'"):
        load_checkpoint(path)
    with pytest.raises(ValueError, match="observations of 5 and actions of 2"):
        dt.evaluate(tiny_model(obs_dim=5), ENV, [0], 100.0, env_kwargs={}, progress=False)
    with pytest.raises(ValueError, match="keep must be"):
        dt.DTAgent(model, 1.0, 1, keep=5)


def test_vectorized_evaluation_equals_one_by_one():
    model = tiny_model(context=5)
    together = dt.evaluate(model, ENV, [3, 4, 5], 200.0, env_kwargs={}, max_steps=25, progress=False)
    alone = dt.evaluate(model, ENV, [3, 4, 5], 200.0, env_kwargs={}, max_steps=25, vectorized=False,
                        progress=False)
    assert together.steps == alone.steps and together.lengths.max() <= 25
    np.testing.assert_allclose(together.returns, alone.returns, atol=1e-3)


def test_command_line_trains_and_evaluates_a_dt(tmp_path, capsys):
    # in-process (ttlib.cli.main.main is what `python -m ttlib` runs; tests/test_cli.py covers the subprocess path)
    ckpt = str(tmp_path / "dt.pt")
    assert main(["train", "--model", "dt", "--out", ckpt, "--steps", "4", "--n-layer", "1", "--n-embd", "16",
                 "--context", "4", "--batch-size", "4", "--eval-every", "2", "--eval-batches", "1",
                 "--export", str(tmp_path / "slim.pt")]) == 0
    assert "Decision Transformer" in capsys.readouterr().out
    assert os.path.getsize(tmp_path / "slim.pt") < os.path.getsize(ckpt)
    assert main(["evaluate", "--checkpoint", str(tmp_path / "slim.pt"), "--episodes", "2", "--max-steps", "6",
                 "--target-return", "123", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["model"] == "dt" and out["target_return"] == 123 and out["steps"] == 12 and len(out["returns"]) == 2
    for args, message in [
        (("evaluate", "--model", "dt", "--checkpoint", os.path.join(ROOT, "assets", "tt_lunarlander.safetensors")),
         "not a Decision Transformer"),
        (("evaluate", "--model", "tt", "--checkpoint", ckpt), "not a 'trajectory-gpt'"),
        (("evaluate", "--target-return", "100", "--episodes", "1"), "--target-return is for Decision"),
        (("train", "--model", "dt", "--out", ckpt, "--n-bins", "10"), "--model dt has no option --n-bins"),
        (("train", "--out", ckpt, "--context", "10"), "--model tt has no option --context (--context is for --model "
                                                      "dt)"),
    ]:
        assert main(list(args)) == 2, args
        stderr = capsys.readouterr().err
        assert message in stderr and stderr.count("\n") == 1, (args, stderr)


def test_the_shipped_dt_checkpoint_loads():
    model, payload = dt.load_checkpoint(device="cpu")
    assert payload["dataset"]["env_id"] == ENV and model.config.context == 20
    assert "optimizer" not in payload and os.path.getsize(default_checkpoint(dt.COURSE_CHECKPOINT)) < 4e6
