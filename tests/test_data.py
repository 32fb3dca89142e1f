"""Tests for ttlib.data.trajectories on real, freshly built datasets (each test gets its own Minari folder)."""

import os
import time
from pathlib import Path

import gymnasium as gym
import minari
import numpy as np
import pytest
from minari.data_collector import EpisodeBuffer

from ttlib.data import trajectories as data
from ttlib.data.trajectories import DatasetError

LANDER = data.DEFAULT_DATASET
CHEETAH = data.HALFCHEETAH_DATASET


# ---- values ----------------------------------------------------------------------------------------------


def test_discounted_values_by_hand():
    rewards = np.array([1.0, 2.0, 3.0, 4.0])
    # V_t = r_{t+1} + g r_{t+2} + g^2 r_{t+3} + ...  with g = 0.5
    # V_0 = 2 + 0.5*3 + 0.25*4 = 4.5,  V_1 = 3 + 0.5*4 = 5,  V_2 = 4,  V_3 = 0
    np.testing.assert_allclose(data.discounted_values(rewards, 0.5), [4.5, 5.0, 4.0, 0.0])
    # gamma = 1: plain sums of the rewards still to come
    np.testing.assert_allclose(data.discounted_values(rewards, 1.0), [9.0, 7.0, 4.0, 0.0])
    assert data.discounted_values(np.array([5.0]), 0.99).tolist() == [0.0]
    assert data.discounted_values(rewards, 0.99).dtype == np.float32


@pytest.mark.parametrize("gamma", [0.0, -0.5, 1.01])
def test_gamma_out_of_range(gamma, minari_root):
    with pytest.raises(DatasetError, match=r"gamma must be in \(0, 1\]"):
        data.discounted_values(np.ones(3), gamma)
    with pytest.raises(DatasetError, match="gamma"):
        data.load(LANDER, gamma=gamma)
    assert not (minari_root / LANDER).exists()  # checked before building anything


# ---- building and loading our datasets --------------------------------------------------------------------


def arrays(d):
    return [*d.observations, *d.actions, *d.rewards, *d.terminations, *d.truncations]


def test_small_lander_build_is_deterministic(minari_root):
    path = data.build(LANDER, seed=0, n_episodes=6, progress=False)
    assert Path(path) == minari_root / LANDER
    first = data.load(LANDER, progress=False)

    # same settings again: nothing to do; other settings without force: refused
    assert data.build(LANDER, seed=0, n_episodes=6, progress=False) == path
    with pytest.raises(DatasetError, match="already exists.*force=True"):
        data.build(LANDER, seed=1, n_episodes=6, progress=False)

    data.build(LANDER, seed=0, n_episodes=6, force=True, progress=False)
    again = data.load(LANDER, progress=False)
    assert all(np.array_equal(a, b) for a, b in zip(arrays(first), arrays(again), strict=True))

    data.build(LANDER, seed=1, n_episodes=6, force=True, progress=False)
    other = data.load(LANDER, progress=False)
    assert not np.array_equal(first.observations[0], other.observations[0])

    d = first
    assert (d.n_episodes, d.obs_dim, d.act_dim) == (6, 8, 2)
    assert d.env_id == "LunarLanderContinuous-v3" and d.env_kwargs == {"continuous": True}
    gym.make(d.env_id, **d.env_kwargs).close()  # the stored spec is enough to evaluate in
    assert d.behaviour == ["expert", "noisy", "random"] * 2
    for i in range(d.n_episodes):
        T = len(d.rewards[i])
        assert d.observations[i].shape == (T, 8) and d.actions[i].shape == (T, 2)
        assert d.observations[i].dtype == d.actions[i].dtype == d.rewards[i].dtype == np.float32
        assert np.all(np.abs(d.actions[i]) <= 1.0)
        assert d.terminations[i][-1] or d.truncations[i][-1]
        assert not (d.terminations[i][:-1].any() or d.truncations[i][:-1].any())
        np.testing.assert_array_equal(d.values[i], data.discounted_values(d.rewards[i], 0.99))
    assert d.n_steps == sum(len(r) for r in d.rewards) == len(d.transitions()["rewards"])

    # reference scores: random is far below the expert; minari's own normalization agrees with ours
    assert d.ref_min_score < 0 < 200 < d.ref_max_score
    minari_dataset = minari.load_dataset(LANDER)
    np.testing.assert_allclose(
        d.normalized_score(d.returns()), minari.get_normalized_score(minari_dataset, d.returns()), rtol=1e-6
    )
    np.testing.assert_allclose(d.normalized_score([d.ref_min_score, d.ref_max_score]), [0.0, 1.0])
    assert data.load(LANDER, gamma=0.5, progress=False).values[0][-2] == d.rewards[0][-1]

    assert [entry["id"] for entry in data.list_local()] == [LANDER]


@pytest.fixture(scope="module")
def full_lander(tmp_path_factory):
    """The real course dataset, built once for this module: (seconds to build, dataset, list_local())."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("MINARI_DATASETS_PATH", str(tmp_path_factory.mktemp("full")))
        start = time.perf_counter()
        data.build(progress=False)
        seconds = time.perf_counter() - start
        return seconds, data.load(progress=False), data.list_local()


def test_full_default_build(full_lander):
    seconds, d, listed = full_lander
    print(f"\nfull build of {LANDER}: {seconds:.1f} s\n{d.summary()}")
    assert seconds < 90  # about 12 s on an idle 2-core CPU; CI cores may be busy
    assert 50_000 <= d.n_steps <= 120_000
    returns = d.returns()
    labels = np.array(d.behaviour)
    mean = {label: returns[labels == label].mean() for label in ("expert", "noisy", "random")}
    assert mean["expert"] > mean["noisy"] > mean["random"]
    assert returns.mean() < mean["expert"] - 100  # room for a planner to beat the data
    noisy = returns[labels == "noisy"]
    assert noisy.min() < 0 < 200 < noisy.max()  # noisy episodes spread between random and expert
    assert listed == [
        {
            "id": LANDER,
            "episodes": 420,
            "steps": d.n_steps,
            "env_id": "LunarLanderContinuous-v3",
            "path": listed[0]["path"],
        }
    ]
    assert "expert" in d.summary() and "reference scores" in d.summary()


def test_no_expert_build_holds_a_late_pilot_and_random_flying(minari_root):
    d = data.load(data.NO_EXPERT_DATASET, progress=False)  # built offline on first use, like the course's
    print(f"\n{d.summary()}")
    returns, labels = d.returns(), np.array(d.behaviour)
    assert d.n_episodes == 420 and list(dict.fromkeys(d.behaviour)) == ["pilot", "random"]
    assert (labels == "pilot").sum() == 210
    pilot = np.sort(returns[labels == "pilot"])[::-1]
    # the dataset's claim: its best episodes stay well short of the expert's reference score (the course's)
    assert pilot[:21].mean() < d.ref_max_score - 100 and pilot.max() < d.ref_max_score
    assert returns[labels == "random"].mean() < pilot.mean()


def test_the_pilot_acts_on_what_it_saw_steps_before():
    from gymnasium.envs.box2d.lunar_lander import heuristic

    from ttlib.data.build import lander_policy

    env = gym.make("LunarLanderContinuous-v3")
    env.reset(seed=0)
    rng = np.random.default_rng(7)
    twin = np.random.default_rng(7)  # replays the pilot's draws: its reaction time and noise scale, then per step
    delay, noise = int(twin.integers(4, 9)), twin.uniform(0.4, 0.8)
    act = lander_policy("pilot", env.unwrapped, rng)
    seen = [np.random.default_rng(i).normal(size=8).astype(np.float32) * 0.3 for i in range(30)]
    for t, obs in enumerate(seen):
        action = act(obs)
        if twin.random() < 0.1:  # one action in ten is random
            np.testing.assert_array_equal(action, twin.uniform(-1, 1, size=2))
            continue
        late = seen[max(0, t - delay)]
        np.testing.assert_allclose(action, heuristic(env.unwrapped, late) + noise * twin.standard_normal(2))
    env.close()


def test_halfcheetah_shapes(minari_root):
    d = data.load(CHEETAH, progress=False)  # built on first use
    assert (d.obs_dim, d.act_dim, d.n_episodes, d.n_steps) == (17, 6, 20, 4000)
    assert d.env_id == "HalfCheetah-v5" and set(d.behaviour) == {"gait", "random"}
    assert all(t[-1] for t in d.truncations)
    windows = data.make_windows(d, length=10, stride=5)
    assert windows["observations"].shape == (20 * 40, 10, 17) and windows["actions"].shape == (800, 10, 6)


# ---- windows ---------------------------------------------------------------------------------------------


def tiny_dataset(lengths=(3, 5), obs_dim=2, act_dim=1):
    """A hand-made dataset whose entries say where they came from: observations[i][t] = 100 i + t."""
    steps = [np.arange(T, dtype=np.float32)[:, None] for T in lengths]  # (T, 1)
    obs = [100 * i + t.repeat(obs_dim, 1) for i, t in enumerate(steps)]
    rewards = [np.arange(1, T + 1, dtype=np.float32) for T in lengths]
    return data.OfflineDataset(
        dataset_id="test/tiny-v0",
        env_id=None,
        env_kwargs={},
        gamma=0.9,
        observations=obs,
        actions=[-o[:, :act_dim] for o in obs],
        rewards=rewards,
        terminations=[np.arange(T) == T - 1 for T in lengths],
        truncations=[np.zeros(T, bool) for T in lengths],
        values=[data.discounted_values(r, 0.9) for r in rewards],
        behaviour=None,
        ref_min_score=None,
        ref_max_score=None,
    )


def test_make_windows():
    d = tiny_dataset()
    w = data.make_windows(d, length=4, stride=2)
    # episode 0 (T=3) starts at 0, 2; episode 1 (T=5) at 0, 2, 4
    starts = [(0, 0), (0, 2), (1, 0), (1, 2), (1, 4)]
    assert w["observations"].shape == (5, 4, 2) and w["actions"].shape == (5, 4, 1)
    assert w["rewards"].shape == w["values"].shape == w["mask"].shape == (5, 4)
    assert all(array.dtype == np.float32 for array in w.values())
    expected_mask = [[1, 1, 1, 0], [1, 0, 0, 0], [1, 1, 1, 1], [1, 1, 1, 0], [1, 0, 0, 0]]
    np.testing.assert_array_equal(w["mask"], expected_mask)
    for n, (i, t) in enumerate(starts):
        real = int(w["mask"][n].sum())
        for name in ("observations", "actions", "rewards", "values"):
            np.testing.assert_array_equal(w[name][n, :real], getattr(d, name)[i][t : t + real])
            assert not w[name][n, real:].any()  # zero padding

    assert data.make_windows(d, length=1)["observations"].shape == (8, 1, 2)  # every step, once
    with pytest.raises(DatasetError, match="length and stride"):
        data.make_windows(d, length=0)


# ---- errors ----------------------------------------------------------------------------------------------


def one_line(error_info):
    message = str(error_info.value)
    assert "\n" not in message
    return message


def test_unknown_ttlib_id(minari_root):
    for call in (lambda: data.load("ttlib/nope-v0"), lambda: data.build("ttlib/nope-v0")):
        with pytest.raises(DatasetError, match="unknown ttlib dataset.*buildable ids") as error:
            call()
        assert LANDER in one_line(error) and CHEETAH in one_line(error)
    assert data.buildable() == [LANDER, data.NO_EXPERT_DATASET, CHEETAH]
    with pytest.raises(DatasetError, match="malformed dataset id"):
        data.load("no version here")


def test_not_local_without_download(minari_root):
    with pytest.raises(DatasetError, match="not local.*download=False"):
        data.load("mujoco/halfcheetah/medium-v0", download=False)


def test_remote_id_offline_fails_fast(minari_root):
    # This machine has no internet: the real Minari/Hub path must fail quickly with a clear message.
    start = time.perf_counter()
    with pytest.raises(DatasetError, match="needs internet") as error:
        data.load("mujoco/halfcheetah/medium-v0")
    assert time.perf_counter() - start < 30
    assert LANDER in one_line(error)
    assert data.list_local() == []


def test_corrupt_dataset_is_reported_not_replaced(minari_root):
    data.build(LANDER, n_episodes=3, progress=False)
    data_file = minari_root / LANDER / "data" / "main_data.hdf5"
    size = data_file.stat().st_size
    with open(data_file, "r+b") as file:
        file.truncate(size // 2)
    with pytest.raises(DatasetError, match="is corrupt.*ttlib make-dataset --force") as error:
        data.load(LANDER)
    one_line(error)
    assert data_file.stat().st_size == size // 2  # load never overwrites a broken dataset
    assert data.list_local() == []

    data_file.unlink()
    with pytest.raises(DatasetError, match="is corrupt.*ttlib make-dataset --force"):
        data.load(LANDER)
    with pytest.raises(DatasetError, match="already exists"):
        data.build(LANDER, n_episodes=4, progress=False)

    data.build(LANDER, n_episodes=3, force=True, progress=False)
    assert data.load(LANDER).n_episodes == 3


def test_foreign_local_dataset(minari_root):
    # any local Minari dataset loads, wherever it came from; broken ones say to delete the folder
    env = gym.make("Pendulum-v1", max_episode_steps=20)
    buffers = []
    for seed in range(2):
        obs, _ = env.reset(seed=seed)
        observations, actions, rewards = [obs], [], []
        for _ in range(20):
            action = env.action_space.sample()
            obs, reward, *_ = env.step(action)
            observations.append(obs)
            actions.append(action)
            rewards.append(reward)
        episode = {"observations": np.stack(observations), "actions": np.stack(actions), "rewards": rewards}
        buffers.append(EpisodeBuffer(**episode, terminations=[False] * 20, truncations=[False] * 19 + [True]))
    with pytest.warns(UserWarning):  # minari asks for an author and so on
        minari.create_dataset_from_buffers("test/pendulum-v0", buffers, env=env.spec)

    d = data.load("test/pendulum-v0", download=False)
    assert (d.n_episodes, d.n_steps, d.obs_dim, d.act_dim) == (2, 40, 3, 1)
    assert d.env_id == "Pendulum-v1" and d.behaviour is None
    with pytest.raises(DatasetError, match="no reference scores"):
        d.normalized_score(d.returns())
    assert [entry["id"] for entry in data.list_local()] == ["test/pendulum-v0"]

    (minari_root / "test/pendulum-v0/data/main_data.hdf5").unlink()
    with pytest.raises(DatasetError, match="is corrupt.*delete the folder"):
        data.load("test/pendulum-v0")


def test_half_written_build_is_ignored(minari_root):
    # what a build killed half-way leaves behind: a hidden temp folder holding an unfinished dataset
    data.build(CHEETAH, n_episodes=2, progress=False)
    final = minari_root / CHEETAH
    leftover = final.with_name(f".{final.name}.building-99999999-deadbeef")  # no such process
    (leftover / CHEETAH).parent.mkdir(parents=True)
    os.replace(final, leftover / CHEETAH)
    with open(leftover / CHEETAH / "data" / "main_data.hdf5", "r+b") as file:
        file.truncate(1000)

    assert data.list_local() == []
    d = data.load(CHEETAH, progress=False)  # the real folder is missing: built afresh, the temp one ignored
    assert d.n_episodes == 20
    assert not leftover.exists()  # stale temp folders of dead builds are cleaned up
    assert [entry["id"] for entry in data.list_local()] == [CHEETAH]
