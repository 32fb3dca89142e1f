"""The Q critic: expectile regression, temporal-difference learning on real data, and the planner that ranks the
model's actions with it."""

import dataclasses

import numpy as np
import pytest
import torch
from commands import in_process  # tests/ is on sys.path

from ttlib.agents.critic import (
    Critic,
    CriticConfig,
    CriticError,
    add_critic,
    critic_from_payload,
    critic_payload,
    expectile_loss,
    load_critic,
    q_loss,
    td_target,
    train_critic,
    train_member,
    transitions,
)
from ttlib.bench.decoding import PRESETS, random_model
from ttlib.data import trajectories as ttdata
from ttlib.data.trajectories import subset
from ttlib.evaluation.ray_evaluation import pack, unpack_critic
from ttlib.planning import beam as planning
from ttlib.planning.beam import PlannerConfig, PlannerConfigError, beam_plan, critic_planner, decoded, imitation_planner
from ttlib.training.checkpoint_files import write_payload
from ttlib.training.checkpoints import default_checkpoint, load_checkpoint, read_checkpoint


@pytest.fixture(scope="module")
def course_data():
    return ttdata.load(progress=False)


def expectile(x: np.ndarray, tau: float) -> float:
    """The tau-expectile by bisection: tau E[(x - e)+] = (1 - tau) E[(e - x)+]."""
    lo, hi = x.min(), x.max()
    for _ in range(100):
        e = (lo + hi) / 2
        if tau * np.clip(x - e, 0, None).mean() > (1 - tau) * np.clip(e - x, 0, None).mean():
            lo = e
        else:
            hi = e
    return (lo + hi) / 2


@pytest.mark.parametrize("tau", [0.5, 0.8, 0.95])
def test_expectile_loss_is_smallest_at_the_expectile(tau):
    x = torch.as_tensor(np.random.default_rng(0).exponential(size=4000))  # skewed: mean and expectiles differ
    c = torch.zeros((), dtype=torch.float64, requires_grad=True)
    optimizer = torch.optim.Adam([c], lr=0.05)
    for _ in range(2000):
        optimizer.zero_grad()
        expectile_loss(x - c, tau).backward()
        optimizer.step()
    assert c.item() == pytest.approx(expectile(x.numpy(), tau), abs=1e-2)
    if tau == 0.5:
        assert c.item() == pytest.approx(x.mean().item(), abs=1e-2)


def test_transitions_keep_every_step_that_has_a_next_observation(course_data):
    batch = transitions(course_data)
    terminated = sum(bool(t[-1]) for t in course_data.terminations)
    assert len(batch["obs"]) == course_data.n_steps - (course_data.n_episodes - terminated)
    assert batch["done"].sum().item() == terminated
    first = course_data.observations[0]  # the next observation is the one after
    assert torch.equal(batch["next_obs"][0], torch.as_tensor(first[1]))


def test_the_critic_learns_values_that_follow_the_returns_and_rank_the_pilots(course_data):
    """Short IQL on 60 episodes: V(s) follows the discounted return that came after s, and the states the expert
    visits are worth more than those of the random pilot (facts of the data, not of a setting)."""
    data = subset(course_data, range(0, course_data.n_episodes, 7))
    critic, history = train_critic(data, CriticConfig(steps=3000, members=1), progress=False)
    assert history[-1]["step"] == 2999 and np.isfinite(history[-1]["q_loss"])
    returns_after = np.concatenate([ttdata.discounted_values(np.concatenate([[0.0], r]), 0.99)[:-1]
                                    for r in data.rewards])  # sum_k gamma^k r_{t+k}, r_t included
    with torch.no_grad():
        value = critic.v(torch.as_tensor(np.concatenate(data.observations))).numpy()
    assert np.corrcoef(value, returns_after)[0, 1] > 0.4  # measured 0.62 (expectile 0.5, the default)
    pilot = np.repeat(np.array(data.behaviour), [len(r) for r in data.rewards])
    assert value[pilot == "expert"].mean() > value[pilot == "random"].mean() + 15  # measured 8 vs -23


def test_a_critic_is_the_mean_of_its_members_each_trained_from_its_own_seed(course_data):
    data = subset(course_data, range(0, course_data.n_episodes, 20))
    critic, history = train_critic(data, CriticConfig(steps=20, members=3, hidden=16), progress=False)
    one, _ = train_critic(data, CriticConfig(steps=20, members=1, hidden=16, seed=2), progress=False)
    obs, act = torch.randn(6, 8), torch.rand(6, 2) * 2 - 1
    with torch.no_grad():
        members = torch.stack([member.q(obs, act) for member in critic.members])  # (3, 6)
        assert torch.allclose(critic.q(obs, act), members.mean(dim=0))
        assert not torch.allclose(members[0], members[1])  # different seeds, different members
        assert torch.equal(one.q(obs, act), members[2])  # member 2 of seed 0 is member 0 of seed 2
    assert [h["member"] for h in history if h["step"] == 19] == [0, 1, 2] and history[-1]["seconds"] > 0


def test_a_member_trains_with_the_losses_it_is_given_in_the_dtype_of_its_batch(course_data):
    """train_member's two steps are value_loss and q_loss (the shipped critic's) or the caller's (notebook 06 trains
    with the learner's): the same losses written another way train the same member in float64, to rounding, and
    other losses another member."""
    from tqdm.auto import tqdm

    batch = {key: value[::40].double() for key, value in transitions(course_data).items()}
    config = CriticConfig(steps=40, hidden=16, batch_size=64)

    def member(losses=None):
        return train_member(batch, config, 0, "cpu", [], tqdm(disable=True), losses=losses)

    def value_loss_too(critic, target, sample, tau):  # value_loss in other words
        u = target.q(sample["obs"], sample["act"]).detach() - critic.v(sample["obs"])
        return (torch.abs(tau - (u < 0).double()) * u * u).mean()

    def q_loss_too(critic, sample, gamma):
        y = td_target(critic, sample, gamma)
        return sum(((q - y) ** 2).mean() for q in critic.q_pair(sample["obs"], sample["act"]))

    shipped, same = member(), member((value_loss_too, q_loss_too))
    assert all(p.dtype == torch.float64 for p in shipped.parameters())
    for key, value in shipped.state_dict().items():
        torch.testing.assert_close(same.state_dict()[key], value, atol=1e-9, rtol=0)
    other = member((value_loss_too, lambda critic, sample, gamma: q_loss(critic, sample, 0.5)))
    with torch.no_grad():
        assert not torch.allclose(other.q(batch["obs"], batch["act"]), shipped.q(batch["obs"], batch["act"]))


def test_bad_critic_settings_are_refused():
    with pytest.raises(CriticError, match="expectile must be in"):
        CriticConfig(expectile=1.0).validate()
    with pytest.raises(CriticError, match="steps must be >= 1"):
        CriticConfig(steps=0).validate()
    with pytest.raises(CriticError, match=r"val_fraction must be in \[0, 1\)"):
        CriticConfig(val_fraction=1.0).validate()


def test_a_held_out_td_loss_on_the_episodes_the_model_validated_on(course_data):
    from ttlib.agents.critic import held_out, td_loss
    from ttlib.data.trajectories import split_episodes

    config = CriticConfig(steps=1001, members=1, hidden=16, val_fraction=0.05)
    learn, validation = held_out(course_data, config)
    train_episodes, val_episodes = split_episodes(course_data, 0.05, 0)  # the Trajectory GPT's, by default
    assert learn.n_episodes == len(train_episodes) and learn.observations[0] is course_data.observations[
        train_episodes[0]]
    assert len(validation["obs"]) == len(transitions(subset(course_data, val_episodes))["obs"])
    assert held_out(course_data, CriticConfig())[1] is None  # by default the critic learns from every episode
    critic, history = train_critic(course_data, config, progress=False)
    assert [row["step"] for row in history] == [0, 1000]
    for row in history:  # both measured on whole sets, with the training loss's formula
        assert row["val_td_loss"] > 0 and row["train_td_loss"] > 0
    assert history[-1]["val_td_loss"] == pytest.approx(td_loss(critic.members[0], validation, config.gamma))


def critic_for(tokenizer, seed=0):
    torch.manual_seed(seed)
    return Critic(tokenizer.obs_dim, tokenizer.act_dim, hidden=16).eval()


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("real", [True, False], ids=["real observation", "decoded prefix"])
def test_the_critic_planner_takes_the_action_its_critic_ranks_first(seed, real):
    """Horizon 1: every sampled action is scored Q(s, a) and the plan is the best of them, with that score; s is
    the real observation when the caller gives it, else the prefix's last observation decoded."""
    model, tok = random_model(PRESETS["tiny"], dtype=torch.float64, seed=seed)
    critic = critic_for(tok, seed).double()
    c = model.config
    prefix = torch.randint(0, c.n_bins, (3, c.obs_dim), generator=torch.Generator().manual_seed(seed))
    observation = torch.randn(3, c.obs_dim, generator=torch.Generator().manual_seed(seed)) if real else None
    trace = []
    config = critic_planner(beam_width=4, sample_expand=3, likelihood_weight=0.0)  # the critic's score alone
    plan = beam_plan(model, tok, prefix, torch.tensor([5, 6, 7]), config, trace=trace, critic=critic,
                     observation=observation)
    scores = trace[0][0].view(3, -1)  # (E, children)
    assert torch.allclose(plan.score.double(), scores.max(dim=1).values)
    state = observation if real else decoded(tok, prefix, slice(0, c.obs_dim))
    q = critic.q(state.double(), plan.actions[:, 0].double()).detach()
    assert torch.allclose(plan.score.double(), q, atol=1e-5)
    other = critic.q(decoded(tok, prefix, slice(0, c.obs_dim)).double() if real else torch.zeros(3, c.obs_dim,
                     dtype=torch.float64), plan.actions[:, 0].double()).detach()
    assert not torch.allclose(plan.score.double(), other, atol=1e-5)  # the other state would score otherwise


def test_a_likelihood_weight_adds_the_log_probability_of_the_actions_to_the_critics_score():
    """likelihood_weight w: every proposal scores Q(s, a) + w log p(a), log p under the model's full distribution;
    the plan kept is the best of them by that sum, and a large enough w keeps the imitation planner's choice. The
    course's critic planner adds a little of it (docs/RESULTS.md measured 0, 0.3, 1 and 3)."""
    assert critic_planner().likelihood_weight == 0.3 and planning.course_planner().likelihood_weight == 0
    model, tok = random_model(PRESETS["tiny"], dtype=torch.float64, seed=3)
    critic = critic_for(tok, 3).double()
    c = model.config
    prefix = torch.randint(0, c.n_bins, (3, c.obs_dim), generator=torch.Generator().manual_seed(3))
    observation = torch.randn(3, c.obs_dim, generator=torch.Generator().manual_seed(4))
    keys, settings = torch.tensor([5, 6, 7]), dict(beam_width=4, sample_expand=3)
    plan = beam_plan(model, tok, prefix, keys, critic_planner(likelihood_weight=0.7, **settings), critic=critic,
                     observation=observation)
    logits = planning.logits_along(model, prefix, plan.bins)  # (3, n, N)
    log_p = torch.log_softmax(logits, -1).gather(2, plan.bins[:, :, None])[:, :c.act_dim, 0].sum(1)  # (3,)
    q = critic.q(observation, plan.actions[:, 0].double()).detach()
    torch.testing.assert_close(plan.score.double(), q + 0.7 * log_p, atol=1e-5, rtol=0)
    alone = beam_plan(model, tok, prefix, keys, critic_planner(likelihood_weight=0.0, **settings), critic=critic,
                      observation=observation)
    imitation = beam_plan(model, tok, prefix, keys, imitation_planner(**settings))
    dominated = beam_plan(model, tok, prefix, keys, critic_planner(likelihood_weight=1e6, **settings), critic=critic,
                          observation=observation)
    assert torch.equal(dominated.bins, imitation.bins)  # the same proposals (the same keys), the likeliest kept
    assert not torch.equal(alone.bins, imitation.bins)  # ...which the critic alone would not all have kept
    with pytest.raises(PlannerConfigError, match="likelihood_weight must be >= 0"):
        critic_planner(likelihood_weight=-1.0)
    with pytest.raises(PlannerConfigError, match="static search.*likelihood_weight"):
        PlannerConfig(decoder="static", likelihood_weight=0.5)


def test_the_weighted_mean_of_proposals_follows_its_softmax():
    """weighted_mean: sum_i softmax(beta * score)_i a_i per environment; a large beta gives the best proposal's
    action, a small one the proposals' plain mean."""
    actions = torch.tensor([[[1.0, 0.0], [0.0, 1.0], [-1.0, -1.0]]])  # (1, 3, 2)
    score = torch.tensor([[2.0, 1.0, 0.0]])
    weights = torch.softmax(0.5 * score.double(), dim=1)[0]
    expected = (weights[:, None] * actions[0].double()).sum(0).float()
    torch.testing.assert_close(planning.weighted_mean(actions, score, 0.5)[0], expected)
    torch.testing.assert_close(planning.weighted_mean(actions, score, 1e6)[0], actions[0, 0])
    torch.testing.assert_close(planning.weighted_mean(actions, score, 1e-9)[0], actions[0].mean(0))


def test_action_mean_beta_acts_the_weighted_mean_of_every_proposal_and_shows_the_best():
    """action_mean_beta b: the plan is the best proposal, its score and bins as without b; the action taken is the
    softmax(b * score)-weighted mean of all 12 proposals (one step ahead; with two, of the first actions of the
    last step's plans). A large b takes the best one's action; a tiny b the model's own average action, whatever the
    critic thinks (two critics, the same mean)."""
    model, tok = random_model(PRESETS["tiny"], dtype=torch.float64, seed=5)
    c = model.config
    prefix = torch.randint(0, c.n_bins, (3, c.obs_dim), generator=torch.Generator().manual_seed(5))
    observation = torch.randn(3, c.obs_dim, generator=torch.Generator().manual_seed(6))
    keys, settings = torch.tensor([5, 6, 7]), dict(beam_width=4, sample_expand=3, likelihood_weight=0.0)

    def plan(beta, seed=5):
        config = critic_planner(action_mean_beta=beta, **settings)
        return beam_plan(model, tok, prefix, keys, config, critic=critic_for(tok, seed).double(),
                         observation=observation)

    best, sharp, mean = plan(None), plan(1e9), plan(0.3)
    assert torch.equal(mean.bins, best.bins) and torch.equal(mean.score, best.score)  # the plan shown: the best
    torch.testing.assert_close(sharp.actions, best.actions)
    assert not torch.allclose(mean.actions[:, 0], best.actions[:, 0], atol=1e-3)
    means = torch.as_tensor(tok.means[c.obs_dim:c.obs_dim + c.act_dim])  # (A, n_bins): what every bin decodes to
    inside = (mean.actions[:, 0] >= means.min(1).values - 1e-6) & (mean.actions[:, 0] <= means.max(1).values + 1e-6)
    assert inside.all()  # a mean of decoded actions stays within them
    flat, flat_other = plan(1e-12), plan(1e-12, seed=9)
    torch.testing.assert_close(flat.actions[:, 0], flat_other.actions[:, 0])  # the proposals' mean, unranked
    assert not torch.allclose(plan(1e9, seed=9).actions[:, 0], sharp.actions[:, 0], atol=1e-3)  # ranked: they differ
    deeper = dict(settings, horizon=2)  # two steps: the first actions of the last step's plans are weighed
    best2 = beam_plan(model, tok, prefix, keys, critic_planner(**deeper), critic=critic_for(tok, 5).double(),
                      observation=observation)
    sharp2, mean2 = (beam_plan(model, tok, prefix, keys, critic_planner(action_mean_beta=beta, **deeper),
                               critic=critic_for(tok, 5).double(), observation=observation) for beta in (1e9, 0.3))
    torch.testing.assert_close(sharp2.actions, best2.actions)
    assert torch.equal(mean2.bins, best2.bins) and not torch.allclose(mean2.actions[:, 0], best2.actions[:, 0])
    with pytest.raises(PlannerConfigError, match="action_mean_beta must be > 0 or None"):
        critic_planner(action_mean_beta=0.0)
    with pytest.raises(PlannerConfigError, match="static search.*action_mean_beta"):
        PlannerConfig(decoder="static", horizon=1, action_mean_beta=0.3)


def test_the_critic_planner_refuses_an_observation_of_the_wrong_shape():
    model, tok = random_model(PRESETS["tiny"])
    prefix = torch.zeros(2, model.config.obs_dim, dtype=torch.long)
    with pytest.raises(ValueError, match="observation must be"):
        beam_plan(model, tok, prefix, torch.tensor([0, 1]), critic_planner(), critic=critic_for(tok),
                  observation=torch.zeros(2, model.config.obs_dim + 1))


def test_a_critic_planner_without_a_critic_says_how_to_get_one():
    model, tok = random_model(PRESETS["tiny"])
    prefix = torch.zeros(1, model.config.obs_dim, dtype=torch.long)
    with pytest.raises(ValueError, match="ttlib train-critic"):
        beam_plan(model, tok, prefix, torch.tensor([0]), critic_planner())


def test_a_critic_for_other_sizes_is_refused():
    payload = critic_payload(Critic(8, 2, hidden=16))
    with pytest.raises(CriticError, match="obs 8 / act 2"):
        critic_from_payload(payload, obs_dim=17, act_dim=6)


def test_a_checkpoint_carries_its_critic_and_ray_actors_get_the_same_one(tmp_path):
    source = tmp_path / "tt.pt"
    payload = read_checkpoint(default_checkpoint())
    payload.pop("critic", None)
    write_payload(str(source), payload)
    assert load_critic(str(source)) is None
    out = tmp_path / "with_critic.pt"
    critic, history = add_critic(str(source), CriticConfig(steps=30, hidden=32), out=str(out), progress=False)
    assert read_checkpoint(str(source)).get("critic") is None  # the source is left as it was
    loaded = load_critic(str(out), device="cpu")
    obs, act = torch.randn(5, 8), torch.rand(5, 2) * 2 - 1
    with torch.no_grad():
        assert torch.equal(loaded.q(obs, act), critic.q(obs, act))
        model, tok, _ = load_checkpoint(str(out), device="cpu")
        assert torch.equal(unpack_critic(pack(model, tok, loaded)).q(obs, act), critic.q(obs, act))
        # a float64 critic (beside a float64 model, for bit-for-bit comparisons) reaches the actors in float64
        double = unpack_critic(pack(model.double(), tok, loaded.double()))
        assert next(double.parameters()).dtype == torch.float64
        assert torch.equal(double.q(obs.double(), act.double()), loaded.double().q(obs.double(), act.double()))
    assert unpack_critic(pack(model, tok)) is None


def test_a_critic_can_value_the_undiscounted_return_where_episodes_end(tmp_path, course_data):
    source = tmp_path / "tt.pt"
    payload = read_checkpoint(default_checkpoint())
    payload.pop("critic", None)
    write_payload(str(source), payload)
    out = tmp_path / "undiscounted.pt"
    result = in_process("train-critic", "--checkpoint", str(source), "--out", str(out), "--steps", "30",
                        "--hidden", "32", "--members", "1", "--gamma", "1")
    assert result.returncode == 0, result.stderr[-2000:]
    assert read_checkpoint(str(out))["critic"]["config"]["gamma"] == 1.0
    add_critic(str(source), CriticConfig(steps=30, hidden=32, members=1), out=str(out), progress=False)
    assert read_checkpoint(str(out))["critic"]["config"]["gamma"] == payload["dataset"]["gamma"]  # the default

    few = subset(course_data, range(4))
    cut = dataclasses.replace(few, terminations=[np.zeros_like(t) for t in few.terminations],
                              truncations=[np.ones_like(t) for t in few.truncations])
    with pytest.raises(CriticError, match="gamma 1 needs episodes that end"):
        train_critic(cut, CriticConfig(steps=5, hidden=16, members=1, gamma=1.0), progress=False)
    train_critic(cut, CriticConfig(steps=5, hidden=16, members=1, gamma=0.99), progress=False)  # a discount learns


def test_the_shipped_checkpoint_carries_a_critic_trained_on_its_dataset():
    """The course checkpoint's critic values the return the environment scores (`ttlib train-critic --gamma 1`:
    LunarLander's episodes end in a landing or a crash), whatever the value tokens discount by."""
    payload = read_checkpoint(default_checkpoint())
    critic = load_critic(default_checkpoint(), device="cpu")
    assert critic is not None and payload["critic"]["config"]["gamma"] == 1.0 != payload["dataset"]["gamma"]
    config = payload["critic"]["config"]
    assert payload["critic"]["history"][-1]["step"] == config["steps"] - 1
    assert len(critic.members) == config["members"] == payload["critic"]["members"]
