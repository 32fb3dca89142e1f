"""Training really learns, checkpoints hold everything, and bad checkpoints fail with one clear line."""

import os
from dataclasses import replace

import pytest
import torch

from ttlib.data import trajectories as ttdata
from ttlib.errors import ConfigError
from ttlib.model.gpt import KINDS, GPTConfig, TrajectoryGPT, smoothed_targets
from ttlib.planning import beam as planning
from ttlib.training.best_model import BestModel
from ttlib.training.checkpoint_files import CheckpointError
from ttlib.training.checkpoints import load_checkpoint, read_checkpoint, save_checkpoint
from ttlib.training.train import TrainConfig, kind_sums, learning_rate, train


@pytest.fixture(scope="module")
def course_data():
    return ttdata.load(progress=False)  # the offline course dataset (built on first use)


def small_config(**overrides):
    base = dict(n_layer=2, n_head=2, n_embd=64, n_transitions=4, batch_size=32, steps=300, warmup_steps=20,
                eval_every=100, eval_batches=4, lr=3e-3, min_lr=3e-4)
    return TrainConfig.from_settings({**base, **overrides})


def test_training_drives_the_loss_well_below_its_start(course_data, tmp_path):
    out = tmp_path / "tt.pt"
    result = train(small_config(), out=str(out), data=course_data, progress=False)
    first, last = result.history[0], result.history[-1]
    print(f"\nloss {first['train_loss']:.3f} -> {last['train_loss']:.3f}, val {first['val_loss']:.3f} -> "
          f"{last['val_loss']:.3f}, {result.tokens_per_second:,.0f} tokens/s")
    # 7.7 is the loss of a uniform guess over 100 bins (weighted); a few seconds of training take off a quarter
    assert last["val_loss"] < 0.75 * first["val_loss"]
    assert last["train_loss"] < 0.75 * first["train_loss"]
    assert result.tokens_per_second > 0
    # the checkpoint holds model, tokenizer, config and dataset facts, and loads back to the same model
    model, tokenizer, payload = load_checkpoint(str(out), device="cpu")
    assert payload["dataset"]["id"] == ttdata.DEFAULT_DATASET
    assert payload["dataset"]["env_id"] == "LunarLanderContinuous-v3"
    assert tokenizer.obs_dim == 8 and tokenizer.act_dim == 2
    x = torch.randint(0, 100, (2, model.config.block_size))
    with torch.no_grad():
        torch.testing.assert_close(model(x)[0], result.model.cpu()(x)[0])
    assert [p.name for p in tmp_path.iterdir()] == ["tt.pt"]  # no temporary file left
    # every evaluation logs each kind of token's loss, and what the run cost so far; the file keeps the history
    for row in payload["history"]:
        assert all(row[f"val_{kind}_loss"] > 0 for kind in KINDS), row
        assert row["windows"] == (row["step"] + 1) * 32 and row["device"] == "cpu"
    assert [row["seconds"] for row in payload["history"]] == sorted(row["seconds"] for row in payload["history"])
    assert last["val_action_loss"] < first["val_action_loss"]  # what the planner samples from was learned too
    # the model kept is the best on the action tokens' validation loss (the total stays in the history)
    assert payload["best"]["on"] == "val_action_loss"
    replay = BestModel()
    for row in payload["history"]:
        replay.observe(row["step"], row["val_action_loss"], "val_action_loss")
    assert payload["best"] == replay.summary()


def test_the_kinds_losses_add_up_to_the_training_loss():
    """The weighted sum of the kinds' summed cross-entropies, over the real targets, is the model's own loss."""
    torch.manual_seed(0)
    model = TrajectoryGPT(GPTConfig(obs_dim=3, act_dim=2, n_bins=20, n_layer=1, n_head=2, n_embd=16,
                                    n_transitions=3, dropout=0.0)).eval()
    bins = torch.randint(0, 20, (4, model.config.block_size))
    mask = (torch.rand(4, model.config.block_size - 1) > 0.3).float()
    sums = kind_sums(model, bins[:, :-1], bins[:, 1:], mask)  # (2, 4)
    assert sums[1].sum() == mask.sum()  # every real target is of one kind
    assert sums[1].tolist() == [(mask * (model.target_kinds(mask.shape[1]) == k)).sum().item() for k in range(4)]
    weights = torch.tensor([1.0, model.config.action_weight, model.config.reward_weight, model.config.value_weight])
    _, loss = model(bins[:, :-1], bins[:, 1:], mask)
    torch.testing.assert_close((sums[0] * weights).sum() / mask.sum(), loss)
    assert model.target_kinds(7).tolist() == [0, 0, 1, 1, 2, 3, 0]  # obs 1, 2, act 0, 1, reward, value, next obs 0


def test_action_smoothing_spreads_only_the_action_targets_and_only_in_training():
    """action_smoothing s: in training, an action target's cross-entropy is against a Gaussian of std s bins around
    its bin (cut at the ends, summing to 1); other targets, and every target in evaluation, keep their bin alone."""
    torch.manual_seed(0)
    config = dict(obs_dim=3, act_dim=2, n_bins=20, n_layer=1, n_head=2, n_embd=16, n_transitions=3, dropout=0.0)
    smooth = TrajectoryGPT(GPTConfig(**config, action_smoothing=1.5))
    plain = TrajectoryGPT(GPTConfig(**config))
    plain.load_state_dict(smooth.state_dict())
    targets = smoothed_targets(20, 1.5)  # (20, 20)
    torch.testing.assert_close(targets.sum(1), torch.ones(20))
    assert torch.equal(targets.argmax(1), torch.arange(20)) and targets[10, 9] == targets[10, 11] > targets[10, 8]
    assert torch.equal(smoothed_targets(20, 0.0), torch.eye(20))
    bins = torch.randint(0, 20, (4, smooth.config.block_size))
    inputs, labels = bins[:, :-1], bins[:, 1:]
    logits, loss = smooth.train()(inputs, labels)
    log_p = torch.log_softmax(logits, -1)  # (B, T, N)
    hard = -log_p.gather(2, labels[..., None])[..., 0]  # (B, T)
    spread = -(targets[labels] * log_p).sum(-1)  # (B, T)
    is_action = (smooth.target_kinds(labels.shape[1]) == KINDS.index("action"))[None, :]
    expected = torch.where(is_action, spread, hard) * smooth.dim_weight[(torch.arange(labels.shape[1]) + 1) % 7]
    torch.testing.assert_close(loss, expected.mean())
    assert not torch.allclose(loss, plain.train()(inputs, labels)[1])  # the smoothing changed the training loss...
    torch.testing.assert_close(smooth.eval()(inputs, labels)[1], plain.eval()(inputs, labels)[1])  # ...not validation
    with pytest.raises(ConfigError, match="action_smoothing must be >= 0"):
        TrajectoryGPT(GPTConfig(**config, action_smoothing=-1.0))


def test_value_embedding_carries_each_bins_value_and_every_decoder_reads_it(course_data, tmp_path):
    """value_embedding: the row of bin b of dimension d is its learned vector plus v[d, b] * direction[d], v the
    tokenizer's bin means standardised per dimension (a binary dimension -- the lander's legs -- carries two values),
    direction learned from zero; the checkpoint loads back to the same model, and the fused decoder reads the same
    table as the full forward pass."""
    out = tmp_path / "tt.safetensors"
    result = train(small_config(steps=30, eval_every=15, value_embedding=True), out=str(out), data=course_data,
                   progress=False)
    model, tokenizer = result.model.eval(), result.tokenizer
    carried = model.tok_emb.parametrizations.weight[0]
    values, direction, own = carried.values, carried.direction, model.tok_emb.parametrizations.weight.original
    means = torch.as_tensor(tokenizer.means, dtype=torch.float64)  # (td, N)
    spread = means.std(dim=1) > 0
    expected = (means - means.mean(1, keepdim=True)) / means.std(1, keepdim=True)
    torch.testing.assert_close(values[spread], expected[spread].float())
    assert len(torch.unique(values[6])) == 2, "the left leg (0 or 1) carries exactly two values"
    assert direction.abs().max() > 0, "the direction is learned"
    td, N = values.shape
    rows = model.tok_emb.weight.detach().view(td, N, -1)  # (td, N, C): what the model reads
    torch.testing.assert_close(rows, own.detach().view(td, N, -1) + values[:, :, None] * direction.detach()[:, None])
    loaded, _, _ = load_checkpoint(str(out), device="cpu")  # the best model, which train returned
    bins = torch.randint(0, N, (2, 20))
    torch.testing.assert_close(loaded(bins)[0], model(bins)[0])
    prefix, plan_bins = bins[:, :td], bins[:, td:td + 6]
    torch.testing.assert_close(planning.logits_along(model, prefix, plan_bins, "fused"),
                               planning.logits_along(model, prefix, plan_bins, "recompute"), atol=1e-4, rtol=1e-4)
    # at the start (direction 0) the model is the plain model with the same weights
    fresh = TrajectoryGPT(replace(model.config, value_embedding=True))
    plain = TrajectoryGPT(replace(model.config, value_embedding=False))
    plain.load_state_dict({"tok_emb.weight" if "tok_emb" in k else k: v for k, v in fresh.state_dict().items()
                           if "original" in k or "tok_emb" not in k})
    fresh.set_bin_values(tokenizer.means)
    torch.testing.assert_close(fresh.eval()(bins)[0], plain.eval()(bins)[0])
    with pytest.raises(ConfigError, match="value_embedding=True"):
        plain.set_bin_values(tokenizer.means)


def test_the_model_kept_follows_keep_best_on(course_data):
    result = train(small_config(steps=41, eval_every=10, keep_best_on="total"), data=course_data, progress=False)
    assert result.best["on"] == "val_loss"
    replay = BestModel()
    for row in result.history:
        replay.observe(row["step"], row["val_loss"])
    assert result.best == replay.summary()
    with pytest.raises(ValueError, match="keep_best_on must be one of action, total"):
        train(small_config(steps=2, keep_best_on="reward"), data=course_data, progress=False)


def test_resume_continues_where_it_stopped(course_data, tmp_path):
    out = str(tmp_path / "tt.pt")
    config = small_config(steps=40, eval_every=20)
    straight = train(config, out=None, data=course_data, progress=False)
    train(small_config(steps=40, eval_every=20), out=out, data=course_data, progress=False)
    # stop "half-way": a checkpoint written at step 21, then resume to 40
    half = str(tmp_path / "half.pt")
    train(small_config(steps=21, eval_every=20), out=half, data=course_data, progress=False)
    payload = read_checkpoint(half)
    assert payload["step"] == 21 and "optimizer" in payload
    resumed = train(config, out=half, resume=half, data=course_data, progress=False)
    assert resumed.history[-1]["step"] == 39
    # what the resumed checkpoint records of its training counts the first part too
    assert resumed.history[-1]["windows"] == 40 * 32
    assert resumed.history[-1]["seconds"] > payload["history"][-1]["seconds"]
    # the learning-rate schedule depends on the total, so compare with an uninterrupted run of the same total
    assert abs(resumed.history[-1]["train_loss"] - straight.history[-1]["train_loss"]) < 0.5


def test_learning_rate_schedule():
    c = TrainConfig(lr=1e-3, min_lr=1e-4, warmup_steps=10, steps=110)
    assert learning_rate(0, c) == pytest.approx(1e-4)
    assert learning_rate(9, c) == pytest.approx(1e-3)
    assert learning_rate(60, c) == pytest.approx(0.55e-3)
    assert learning_rate(110, c) == pytest.approx(1e-4)


def test_checkpoint_of_another_shape_fails_naming_the_mismatch(tmp_path):
    from ttlib.bench.decoding import PRESETS, random_model

    model, tok = random_model(PRESETS["tiny"])
    path = str(tmp_path / "tiny.pt")
    save_checkpoint(path, model, tok, dataset={"id": "x"})
    other = TrajectoryGPT(GPTConfig(obs_dim=3, act_dim=2, n_bins=20, n_layer=2, n_embd=48, n_head=2))
    with pytest.raises(CheckpointError, match=r"shape mismatch .*48"):
        load_checkpoint(path, model=other)
    wrong_env = TrajectoryGPT(GPTConfig(obs_dim=17, act_dim=6))
    with pytest.raises(CheckpointError, match="trained for obs 3 / act 2 but the model has obs 17 / act 6"):
        load_checkpoint(path, model=wrong_env)


def test_unreadable_checkpoints_fail_clearly(tmp_path):
    with pytest.raises(CheckpointError, match="no checkpoint at"):
        read_checkpoint(str(tmp_path / "missing.pt"))
    junk = tmp_path / "junk.pt"
    junk.write_bytes(b"not a checkpoint")
    with pytest.raises(CheckpointError, match="not a ttlib checkpoint"):
        read_checkpoint(str(junk))
    foreign = tmp_path / "foreign.pt"
    torch.save({"state_dict": {}}, foreign)  # a pickle: refused unread (tests/test_checkpoint_files.py)
    with pytest.raises(CheckpointError, match="loading a pickle runs whatever code it holds"):
        read_checkpoint(str(foreign))
    # a checkpoint cut off half-way (a crash while copying it) is refused, not half-loaded
    from ttlib.bench.decoding import PRESETS, random_model

    model, tok = random_model(PRESETS["tiny"])
    good = str(tmp_path / "good.pt")
    save_checkpoint(good, model, tok, dataset={})
    cut = tmp_path / "cut.pt"
    cut.write_bytes(open(good, "rb").read()[: os.path.getsize(good) // 2])
    with pytest.raises(CheckpointError, match="corrupt or truncated"):
        read_checkpoint(str(cut))


def test_the_shipped_checkpoint_loads_and_fits_the_course_dataset():
    from ttlib.training.checkpoints import default_checkpoint

    path = default_checkpoint()
    assert os.path.getsize(path) < 10 * 2**20
    model, tokenizer, payload = load_checkpoint(path, device="cpu")
    assert "optimizer" not in payload  # slim: weights, config, tokenizer, dataset facts
    c = model.config
    shape = (c.obs_dim, c.act_dim, c.n_bins, c.n_layer, c.n_head, c.n_embd, c.n_transitions)
    assert shape == (8, 2, 100, 4, 4, 128, 10)
    assert payload["dataset"]["id"] == ttdata.DEFAULT_DATASET
    assert payload["history"][-1]["val_loss"] < 0.6 * payload["history"][0]["val_loss"]
    assert tokenizer.n_bins == 100 and tokenizer.strategy == "quantile"


def test_the_defaults_fitted_to_the_course_data_are_the_shipped_runs_settings(course_data):
    """`ttlib train` with no options trains as the shipped checkpoint was trained: the steps and evaluations fitted
    to the course dataset are the 5400 and 250 it had, and every other setting is unchanged."""
    from ttlib.data.trajectories import split_episodes
    from ttlib.training.checkpoints import default_checkpoint
    from ttlib.training.train import fit_recipe

    train_episodes, _ = split_episodes(course_data, 0.05, 0)
    fitted, note = fit_recipe(TrainConfig(), sum(len(course_data.rewards[i]) for i in train_episodes))
    assert "5400 steps (the course recipe's" in note
    shipped = TrainConfig.from_settings(read_checkpoint(default_checkpoint())["train_config"]).settings()
    assert {**fitted.settings(), "device": shipped["device"]} == shipped
