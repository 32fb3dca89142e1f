"""The baselines (ttlib.agents.baselines): which episodes %BC keeps, what BC and AWR learn, how they are played and
saved, and the command line that names them beside the Trajectory and Decision Transformers."""

import json

import gymnasium as gym
import numpy as np
import pytest
import torch
from commands import in_process, one_line_error, ttlib  # tests/ is on sys.path

from ttlib.agents import baselines
from ttlib.agents.baselines import BaselineError, MLPPolicy, PolicyConfig, best_episodes
from ttlib.data import trajectories as ttdata
from ttlib.errors import ConfigError
from ttlib.evaluation import rollout
from ttlib.training import checkpoints, train
from ttlib.training.checkpoint_files import CheckpointError


# ---- which episodes %BC keeps ---------------------------------------------------------------------------
@pytest.mark.parametrize("percent, kept", [(100, [0, 1, 2, 3, 4, 5, 6, 7, 8, 9]), (50, [1, 3, 5, 7, 9]),
                                           (25, [5, 7, 9]), (10, [9]), (1, [9]), (30, [5, 7, 9])])
def test_best_episodes_keeps_the_ceiling_of_the_share_highest_first(percent, kept):
    returns = [0.0, 5.0, 1.0, 6.0, 2.0, 7.0, 3.0, 8.0, 4.0, 9.0]  # odd episodes are the best five
    assert best_episodes(returns, percent).tolist() == kept


def test_best_episodes_ranks_by_return_and_breaks_ties_towards_the_earlier_episode():
    assert best_episodes([3.0, 7.0, 7.0, -1.0], 25).tolist() == [1]
    assert best_episodes([3.0, 7.0, 7.0, -1.0], 50).tolist() == [1, 2]
    assert best_episodes(np.array([2.0]), 10).tolist() == [0]  # at least one


@pytest.mark.parametrize("percent", [0, -5, 100.5])
def test_best_episodes_refuses_a_share_outside_0_100(percent):
    with pytest.raises(BaselineError, match="percent must be in"):
        best_episodes([1.0, 2.0], percent)


# ---- what they learn ------------------------------------------------------------------------------------
def linear_dataset(n_episodes=12, steps=60, seed=0, noise=0.3):
    """Episodes whose actions are tanh(W obs) plus zero-mean noise; episode i's rewards are all i (so later
    episodes are better), in an environment with actions in [-2, 2]."""
    rng = np.random.default_rng(seed)
    w = rng.normal(size=(2, 3))
    obs = [rng.normal(size=(steps, 3)).astype(np.float32) for _ in range(n_episodes)]
    act = [np.clip(np.tanh(o @ w.T) + noise * rng.normal(size=(steps, 2)), -2, 2).astype(np.float32) for o in obs]
    rewards = [np.full(steps, float(i), np.float32) for i in range(n_episodes)]
    flags = [np.zeros(steps, bool) for _ in range(n_episodes)]
    data = ttdata.OfflineDataset("test/linear-v0", None, {}, 0.99, obs, act, rewards, flags, flags, rewards, None,
                                 None, None, [-2.0, -2.0], [2.0, 2.0])
    return data, w


def test_bc_averages_out_zero_mean_noise_and_stays_in_the_action_bounds():
    data, w = linear_dataset()
    policy, history = baselines.train_policy(data, PolicyConfig(steps=600, hidden=64, layers=2), progress=False)
    probe = np.random.default_rng(1).normal(size=(500, 3)).astype(np.float32)
    error = np.abs(policy.act(probe) - np.tanh(probe @ w.T)).mean()
    assert error < 0.12, error  # the noise's own mean absolute size is 0.24: it has been averaged away
    assert history["episodes"] == 12 and history["transitions"] == 720
    assert np.abs(policy.act(100 * probe)).max() <= 2.0


def test_percent_bc_learns_from_the_best_episodes_only():
    data, _ = linear_dataset()
    _, history = baselines.train_policy(data, PolicyConfig(top_percent=25, steps=5), progress=False)
    assert history["episodes"] == 3 and history["lowest_return_kept"] == pytest.approx(9 * 60)


def test_training_is_deterministic_for_a_seed():
    data, _ = linear_dataset()
    first, second, other = (baselines.train_policy(data, PolicyConfig(steps=30, seed=s), progress=False)[0]
                            for s in (0, 0, 1))
    probe = np.ones((1, 3), np.float32)
    assert np.array_equal(first.act(probe), second.act(probe))
    assert not np.array_equal(first.act(probe), other.act(probe))


class StepCritic(torch.nn.Module):
    """A critic whose advantage is +1 for actions with a positive first entry, -1 otherwise."""

    obs_dim, act_dim = 3, 2

    def q(self, obs, act):
        return torch.where(act[:, 0] > 0, 1.0, -1.0)

    def v(self, obs):
        return torch.zeros(len(obs))


def test_awr_weights_follow_the_advantage_and_are_capped():
    obs, act = torch.zeros(4, 3), torch.tensor([[1.0, 0], [-1.0, 0], [0.5, 0], [-0.5, 0]])
    weights = baselines.awr_weights(StepCritic(), obs, act, beta=2.0, max_weight=100.0)
    assert torch.allclose(weights, torch.tensor([np.e**2, np.e**-2, np.e**2, np.e**-2], dtype=torch.float32))
    capped = baselines.awr_weights(StepCritic(), obs, act, beta=10.0, max_weight=7.0)
    assert capped.max() == 7.0


def test_iql_policy_prefers_the_actions_the_critic_values():
    data, _ = linear_dataset(noise=1.0)
    config = PolicyConfig(kind="iql", steps=600, hidden=64, layers=2, beta=3.0)
    awr, _ = baselines.train_policy(data, config, critic=StepCritic(), progress=False)
    bc, _ = baselines.train_policy(data, PolicyConfig(steps=600, hidden=64, layers=2), progress=False)
    probe = np.random.default_rng(2).normal(size=(500, 3)).astype(np.float32)
    assert awr.act(probe)[:, 0].mean() > bc.act(probe)[:, 0].mean() + 0.3


@pytest.mark.parametrize("config, critic, message", [
    (PolicyConfig(kind="iql"), None, "extracted from a critic"),
    (PolicyConfig(kind="iql"), type("Wrong", (), {"obs_dim": 8, "act_dim": 2}), "the critic is for obs 8"),
    (PolicyConfig(kind="ppo"), None, "kind must be one of bc, iql"),
    (PolicyConfig(top_percent=0), None, "top_percent must be a percentage"),
    (PolicyConfig(steps=0), None, "steps must be >= 1"),
])
def test_bad_settings_are_refused_with_one_clear_line(config, critic, message):
    data, _ = linear_dataset()
    with pytest.raises(BaselineError, match=message):
        baselines.train_policy(data, config, critic=critic, progress=False)


def test_non_finite_data_is_refused():
    data, _ = linear_dataset()
    data.actions[3][5, 1] = np.nan
    with pytest.raises(ttdata.DatasetError, match="non-finite"):
        baselines.train_policy(data, PolicyConfig(steps=5), progress=False)


# ---- playing and saving ---------------------------------------------------------------------------------
def lander_policy(seed=0):
    torch.manual_seed(seed)
    return MLPPolicy(8, 2, hidden=32, layers=2).eval()


def test_evaluate_plays_each_seed_alike_in_a_batch_or_alone():
    policy = lander_policy().double()  # float64: a batch's products round far below any action's float32 step
    batched = baselines.evaluate(policy, "LunarLanderContinuous-v3", range(4), max_steps=60, progress=False)
    alone = baselines.evaluate(policy, "LunarLanderContinuous-v3", range(4), vectorized=False, max_steps=60,
                               progress=False)
    assert np.array_equal(batched.returns, alone.returns) and np.array_equal(batched.lengths, alone.lengths)
    assert batched.seeds == [0, 1, 2, 3] and (batched.lengths <= 60).all()


def test_evaluate_matches_a_plain_gymnasium_loop():
    # float64, as above: in float32 a batch of 2 and a batch of 1 may take different matmul kernels (seen on an
    # AVX-512 CPU), and 40 steps of a lander carry that last bit to 2e-5 of the return
    policy, returns = lander_policy().double(), []
    env = gym.make("LunarLanderContinuous-v3", max_episode_steps=40)
    for seed in range(2):
        obs, _ = env.reset(seed=seed)
        total, done = 0.0, False
        while not done:
            obs, reward, terminated, truncated, _ = env.step(policy.act(obs[None])[0])
            total, done = total + reward, terminated or truncated
        returns.append(total)
    env.close()
    result = baselines.evaluate(policy, "LunarLanderContinuous-v3", range(2), max_steps=40, progress=False)
    assert result.returns == pytest.approx(returns, abs=1e-6)


def test_evaluate_refuses_an_environment_of_another_shape():
    with pytest.raises(ValueError, match="this policy is for observations of 8 and actions of 2 dimensions, the "
                                         "environment has 3 and 1"):
        baselines.evaluate(lander_policy(), "Pendulum-v1", [0], progress=False)
    with pytest.raises(ValueError, match="this policy acts in"):
        baselines.evaluate(MLPPolicy(3, 1, 8, 1, [-1.0], [1.0]), "Pendulum-v1", [0], progress=False)


def test_a_saved_policy_acts_the_same_and_other_checkpoints_are_refused(tmp_path):
    data, _ = linear_dataset()
    config = PolicyConfig(top_percent=50, steps=20)
    policy, history = baselines.train_policy(data, config, progress=False)
    path = tmp_path / "pbc.pt"
    baselines.save_policy(str(path), policy, config, checkpoints.dataset_summary(data), history)
    loaded, loaded_config, payload = baselines.load_policy(str(path))
    probe = np.random.default_rng(0).normal(size=(5, 3)).astype(np.float32)
    assert np.array_equal(loaded.act(probe), policy.act(probe)) and loaded_config == config
    assert payload["dataset"]["id"] == "test/linear-v0" and [p.name for p in tmp_path.iterdir()] == ["pbc.pt"]
    with pytest.raises(CheckpointError, match="holds a 'trajectory-gpt' model, not a 'policy' one"):
        baselines.load_policy(checkpoints.default_checkpoint())


def test_the_episode_loop_steps_an_agent_without_a_planner():
    batch = rollout.EpisodeBatch(lander_policy(), "LunarLanderContinuous-v3", [0]).reset()
    assert batch.act(np.zeros((1, 2))) == [] and batch.step == 1 and batch.lengths.tolist() == [1]
    batch.close()


# ---- the command line -----------------------------------------------------------------------------------
def test_train_and_evaluate_a_baseline_from_the_command_line(minari_root, tmp_path):
    """In this process, all three on the same threads, so that the two trainings are the same to the bit
    (test_baseline_options_explain_bad_input runs a command of its own: what a terminal shows)."""
    out = tmp_path / "pbc.pt"
    made = in_process("train", "--model", "bc", "--dataset", ttdata.HALFCHEETAH_DATASET, "--top-percent", "50",
                      "--steps", "30", "--out", str(out))
    assert made.returncode == 0, made.stderr
    assert "%BC (best 50%): 10 episodes (2000 transitions" in made.stdout
    played = in_process("evaluate", "--checkpoint", str(out), "--episodes", "2", "--max-steps", "15", "--json")
    assert played.returncode == 0, played.stderr
    report = json.loads(played.stdout)
    assert report["agent"] == "%BC (best 50%)" and report["seeds"] == [0, 1] and report["steps"] == 30
    # without --checkpoint, evaluate trains the baseline first, with the training options it is given
    again = in_process("evaluate", "--model", "bc", "--dataset", ttdata.HALFCHEETAH_DATASET, "--top-percent", "50",
                       "--steps", "30", "--episodes", "2", "--max-steps", "15", "--json")
    assert again.returncode == 0, again.stderr
    again = json.loads(again.stdout)
    assert again["agent"] == "%BC (best 50%)" and again["returns"] == report["returns"], (again, report)


@pytest.mark.parametrize("args, message", [
    (["evaluate", "--model", "bc", "--beam-width", "4"], "--model bc acts without planning"),
    (["evaluate", "--model", "iql", "--workers", "2"], "leave out --workers"),
    (["evaluate", "--model", "bc", "--top-percent", "0"], "top_percent must be a percentage in (0, 100]"),
    (["evaluate", "--top-percent", "25"], "--top-percent: for the baselines only (--model bc or iql)"),
    (["evaluate", "--model", "bc", "--beta", "3"], "--beta weighs IQL's advantages"),
    (["evaluate", "--model", "iql", "--dataset", ttdata.HALFCHEETAH_DATASET], "give --critic CKPT"),
    (["evaluate", "--model", "bc", "--checkpoint", "pbc.safetensors", "--dataset", ttdata.NO_EXPERT_DATASET],
     "--dataset says how to train a baseline; a --checkpoint holds one trained already"),
    (["evaluate", "--model", "iql", "--checkpoint", "iql.safetensors", "--critic", "c.safetensors", "--beta", "3"],
     "--beta, --critic say how to train a baseline"),
    (["train", "--model", "bc", "--n-layer", "2", "--out", "x.pt"], "--model bc has no option --n-layer"),
    (["train", "--critic", "x.pt", "--out", "x.pt"], "--critic and --beta are for --model iql"),
])
def test_baseline_options_explain_bad_input(args, message, minari_root):
    """Each check in this process; the first also as a command of its own (what a terminal shows)."""
    if args == ["evaluate", "--model", "bc", "--beam-width", "4"]:
        one_line_error(ttlib(*args), message)
    one_line_error(in_process(*args), message)


def test_a_model_trained_on_the_top_percent_sees_only_the_best_episodes():
    """`ttlib train --top-percent 25` (the imitation planner's model): the Trajectory GPT and the Decision
    Transformer learn and validate on the best quarter only; the checkpoint still describes the whole dataset."""
    data, _ = linear_dataset()
    config = train.TrainConfig(top_percent=25)
    whole, training, validation = train.load_and_split(config, data, 0.99, progress=False)
    kept = sorted(float(r.sum()) for r in training.rewards + validation.rewards)
    assert whole is data and kept == [9 * 60.0, 10 * 60.0, 11 * 60.0] and validation.n_episodes == 1
    with pytest.raises(ttdata.DatasetError, match="at least 2"):
        train.load_and_split(train.TrainConfig(top_percent=5), data, 0.99, progress=False)


def test_the_shipped_course_baseline_lands_on_the_plots_seeds():
    """What the notebooks' result plots draw beside their agents: the shipped %BC played on the plot's seeds."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from ttlib.course import viz

    result = baselines.course_baseline([3, 4, 5])
    again = baselines.course_baseline([5])
    assert result.seeds == [3, 4, 5] and result.returns[2] == pytest.approx(again.returns[0], abs=1e-3)
    assert (result.returns > 200).all(), result.returns  # it lands: 286.3 +- 2.3 on seeds 0-59 (docs/RESULTS.md)
    fig, ax = plt.subplots()
    line = viz.baseline_line(ax, result.returns)
    assert line.get_ydata()[0] == pytest.approx(result.returns.mean())
    assert line.get_label().startswith("%BC, best 25% (notebook 00): ")
    plt.close(fig)


def test_evaluate_plans_a_model_of_the_best_episodes_by_likelihood():
    """`ttlib evaluate` on a checkpoint trained with --top-percent plays the imitation planner unless told
    otherwise; a checkpoint with a critic plans with the critic; --value chooses."""
    from ttlib.agents.registry import planner_for

    def planner(top_percent=100.0, critic=None, **options):
        return planner_for(critic, {"train_config": {"top_percent": top_percent}}, **options)

    assert planner(top_percent=25.0).value == "likelihood" and planner().value == "token"
    assert planner(top_percent=25.0, critic=object()).value == "critic"
    assert planner(value="token", top_percent=25.0).value == "token"
    assert planner(value="likelihood", beam_width=8).beam_width == 8
    assert planner(top_k_action=0).top_k_action is None and planner(top_k_action=5).top_k_action == 5  # --top-k 0
    assert planner(action_mean_beta=0).action_mean_beta is None  # --action-mean-beta 0: the best proposal
    with pytest.raises(ConfigError, match="no setting top_k: the settings are PlannerConfig's fields"):
        planner(top_k=5)


def test_the_course_baseline_recorded_beside_an_agent_with_its_caption():
    """The notebooks' videos put %BC's episode beside an agent's on the same seed: record=True keeps one frame per
    step of it, and viz.caption writes the agent's name into the frames' top-left corner and nowhere else."""
    from ttlib.course import viz

    played = baselines.course_baseline([5], max_steps=30, record=True)
    assert len(played.frames) == played.lengths[0] == 30
    assert played.returns[0] == pytest.approx(baselines.course_baseline([5], max_steps=30).returns[0], abs=1e-6)
    frame = played.frames[0]
    written = viz.caption([frame], "%BC: 286.3")[0]
    assert written.shape == frame.shape and written.dtype == np.uint8
    changed = np.argwhere((written != frame).any(axis=2))  # (n, 2) rows and columns of changed pixels
    assert len(changed) > 50, "no caption written"
    assert changed[:, 0].max() < 60 and changed[:, 1].max() < frame.shape[1] // 2, "the caption left its corner"
    assert np.array_equal(played.frames[0], frame), "the recorded frame itself is left as it was"
    video = viz.side_by_side(viz.caption(played.frames, "left"), played.frames[:10])
    assert len(video) == 30 and video[0].shape == (frame.shape[0], 2 * frame.shape[1] + 4, 3)
