"""Rollouts in the real course environment: vectorized == sequential, and clear errors for misfits."""

import numpy as np
import pytest
import torch

from ttlib.agents.critic import Critic
from ttlib.data import trajectories as ttdata
from ttlib.evaluation import rollout
from ttlib.evaluation.rollout import EvalResult, evaluate, save_video
from ttlib.model.gpt import GPTConfig, TrajectoryGPT
from ttlib.model.tokenizer import TrajectoryTokenizer
from ttlib.planning.beam import PlannerConfig

ENV = "LunarLanderContinuous-v3"


@pytest.fixture(scope="module")
def lander_model(device):
    """A small random model with a tokenizer fitted on the course data (float64: bit-for-bit comparisons), on the
    `device` fixture's device."""
    data = ttdata.load(progress=False)
    tokenizer = TrajectoryTokenizer.fit_dataset(data, n_bins=20)
    torch.manual_seed(0)
    config = GPTConfig(obs_dim=8, act_dim=2, n_bins=20, n_layer=1, n_head=2, n_embd=32, n_transitions=4,
                       dropout=0.0)
    return TrajectoryGPT(config).double().to(device).eval(), tokenizer


PLANNER = PlannerConfig(beam_width=3, horizon=2, sample_expand=2, context=2)


@pytest.mark.exactness
def test_vectorized_and_sequential_rollouts_give_the_same_returns(lander_model):
    model, tok = lander_model
    seeds = [3, 4, 5, 6]
    vec = evaluate(model, tok, ENV, seeds, PLANNER, vectorized=True, max_steps=60, progress=False)
    seq = evaluate(model, tok, ENV, seeds, PLANNER, vectorized=False, max_steps=60, progress=False)
    np.testing.assert_array_equal(vec.returns, seq.returns)
    np.testing.assert_array_equal(vec.lengths, seq.lengths)
    assert vec.seeds == seeds and vec.steps == seq.steps
    # and in waves of two environments, asynchronous vector envs too
    waves = evaluate(model, tok, ENV, seeds, PLANNER, n_envs=2, asynchronous=True, max_steps=60, progress=False)
    np.testing.assert_array_equal(waves.returns, vec.returns)


def test_episodes_end_on_termination_not_on_autoreset(lander_model):
    """Random lander policies crash within a few hundred steps: every episode is counted exactly once."""
    model, tok = lander_model
    result = evaluate(model, tok, ENV, [0, 1], PLANNER, progress=False)
    assert len(result.returns) == 2
    assert (result.lengths < 1000).all() and (result.lengths > 10).all()


def test_recording_frames_and_plans(lander_model, tmp_path):
    model, tok = lander_model
    result = evaluate(model, tok, ENV, [7], PLANNER, max_steps=15, record=True, progress=False)
    assert len(result.frames) == 15 and result.frames[0].ndim == 3
    assert len(result.plans) == 15 and result.plans[0][1].actions.shape == (1, 2, 2)
    path = save_video(result.frames, str(tmp_path / "episode.gif"))
    assert open(path, "rb").read(3) == b"GIF"


def test_discrete_action_space_is_refused(lander_model):
    model, tok = lander_model
    with pytest.raises(ValueError, match="continuous actions.*Discrete"):
        evaluate(model, tok, "LunarLander-v3", [0], PLANNER, progress=False)


def test_checkpoint_for_another_environment_is_refused(lander_model):
    model, tok = lander_model
    with pytest.raises(ValueError, match="observations of 8 and actions of 2 dimensions, the environment has 17 and 6"):
        evaluate(model, tok, "HalfCheetah-v5", [0], PLANNER, progress=False)


def test_context_plus_horizon_must_fit(lander_model):
    model, tok = lander_model
    with pytest.raises(ValueError, match="do not fit the model's window of 4"):
        evaluate(model, tok, ENV, [0], PlannerConfig(beam_width=2, horizon=3, context=3), progress=False)


def test_a_scheduled_vector_env_plays_evaluates_episodes_through_its_autoresets(lander_model):
    """Environment e of scheduled_vector_env plays the seeds schedule[e] in order, each episode the one evaluate
    plays for that seed: the autoreset after an episode starts the next scheduled one."""
    model, tok = lander_model
    schedule, max_steps = [[3, 5, 6], [4]], 20
    envs = rollout.scheduled_vector_env(ENV, schedule, max_steps=max_steps)
    starts = {seed: rollout.make_env(ENV).reset(seed=seed)[0] for seed in [3, 4, 5, 6]}
    obs, _ = envs.reset()
    np.testing.assert_array_equal(obs[0], starts[3])
    np.testing.assert_array_equal(obs[1], starts[4])
    seen, autoreset = [[3], [4]], np.zeros(2, dtype=bool)
    for _ in range(4 * max_steps):
        obs, reward, terminated, truncated, _ = envs.step(np.zeros((2, 2), dtype=np.float32))
        for e in np.flatnonzero(autoreset):  # the step after an episode ended: the next scheduled episode begins
            if len(seen[e]) < len(schedule[e]):
                seen[e].append(schedule[e][len(seen[e])])
                np.testing.assert_array_equal(obs[e], starts[seen[e][-1]])
                assert reward[e] == 0 and not terminated[e] and not truncated[e]
        autoreset = terminated | truncated
    envs.close()
    assert seen == schedule


def test_return_stats_give_the_standard_error_and_the_share_below_zero():
    result = EvalResult(seeds=[0, 1, 2, 3], returns=np.array([-10.0, 20.0, 30.0, 40.0]), lengths=np.ones(4, int),
                        seconds=1.0)
    stats = result.return_stats()
    assert stats["mean_return"] == 20.0 and stats["below_zero_fraction"] == 0.25
    assert stats["stderr_return"] == pytest.approx(np.std([-10, 20, 30, 40], ddof=1) / 2)
    assert "+- 10.8 (SE)" in result.summary() and "25% below zero" in result.summary()
    one = EvalResult(seeds=[7], returns=np.array([5.0]), lengths=np.ones(1, int), seconds=1.0)
    assert one.return_stats()["stderr_return"] is None and "SE" not in one.summary()
    assert "(seeds 0-3)" in result.summary()  # a run of seeds is named; scattered seeds are not called a run
    scattered = EvalResult(seeds=[3, 9], returns=np.array([1.0, 2.0]), lengths=np.ones(2, int), seconds=1.0)
    assert "seeds" not in scattered.summary()


class RecordingCritic(Critic):
    """A real (randomly initialised) critic that also keeps every state it is asked to score."""

    def __init__(self):
        super().__init__(8, 2, hidden=16, members=1)
        self.states = []

    def q(self, obs, act):
        self.states.append(obs.detach().cpu().clone())
        return super().q(obs, act)


def test_the_critic_planner_scores_the_observation_the_environment_gave(lander_model):
    """Not its bins decoded: the lander at rest on its legs is (.., 1, 1), and "leg up" is exactly 0."""
    model, tok = lander_model
    critic = RecordingCritic().double().eval()
    planner = PlannerConfig(beam_width=2, horizon=1, sample_expand=2, context=2, value="critic")
    evaluate(model, tok, ENV, [3, 4], planner, max_steps=1, progress=False, critic=critic)
    first = critic.states[0]  # (E*W*X, 8): every child of both environments, at the first decision
    for e, seed in enumerate([3, 4]):
        env = rollout.make_env(ENV)
        observation, _ = env.reset(seed=seed)
        env.close()
        rows = first.view(2, -1, 8)[e]
        assert torch.equal(rows, torch.as_tensor(observation, dtype=rows.dtype).expand_as(rows))
        assert not torch.equal(rows[0], torch.as_tensor(tok.decode(tok.encode(observation[None], slice(0, 8)),
                                                                   slice(0, 8))[0], dtype=rows.dtype))


def test_every_agent_of_the_registry_follows_the_protocol_and_plays_in_the_one_loop():
    """The shipped checkpoints load by name (and are named by their kind); each agent has the protocol's members
    and plays its episodes in rollout.play, the steps counted as the loop counts them."""
    from ttlib.agents import baselines, registry
    from ttlib.agents.protocol import Agent
    from ttlib.training.checkpoints import default_checkpoint

    policy = default_checkpoint(baselines.COURSE_BASELINE)
    assert [registry.name_of(default_checkpoint(name)) for name in ("tt_lunarlander.safetensors",
            "dt_lunarlander.safetensors", baselines.COURSE_BASELINE)] == ["tt", "dt", "bc"]
    for loaded in (registry.load("tt", device="cpu", beam_width=2), registry.load("dt", device="cpu"),
                   registry.load("bc", checkpoint=policy)):
        assert isinstance(loaded.agent, Agent), loaded.title
        info = loaded.dataset
        result = rollout.play(loaded.agent, info["env_id"], [0, 1], info["env_kwargs"], max_steps=3, progress=False)
        assert result.steps == 6 and result.seeds == [0, 1] and loaded.training_seconds > 0
    assert not isinstance(object(), Agent)
    with pytest.raises(ValueError, match="no agent named 'ppo'; the agents are tt, dt, bc, iql"):
        registry.load("ppo")
    with pytest.raises(ValueError, match="holds a bc policy, not iql"):
        registry.load("iql", checkpoint=policy)
