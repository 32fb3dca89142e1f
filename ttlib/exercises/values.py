"""Notebook 00's exercises: the value target V_t, episode returns and normalized scores, and %BC -- the best
episodes and a behaviour-cloning fit.

Each trial starts with a case small enough to check by hand, then an episode like the course's (float32 rewards,
small shaping rewards and a +100 or -100 at the end): where an answer first differs is then the easy case if it
can be. The course dataset itself is not loaded here (that takes seconds); its episodes' shape and scale are.
"""

from __future__ import annotations

import functools
import math

import numpy as np
import torch

from ttlib.agents import baselines as ttlib_baselines
from ttlib.data import trajectories as ttlib_data
from ttlib.exercises import Exercise, Mistake

__all__ = ["EXERCISES", "best_trial", "choosing", "cloning", "cloning_trial", "dataset_of", "distinct_returns",
           "lander_rewards", "plain_returns", "returns_and_scores", "returns_trial", "run_best", "run_cloning",
           "run_returns", "run_values", "small_rewards", "ttlib_best_episodes", "ttlib_fit_policy",
           "ttlib_normalized_score", "ttlib_returns", "value_target", "values_trial"]


def lander_rewards(rng, n_steps: int) -> np.ndarray:
    """(n_steps,) float32 rewards like a LunarLander episode's: small shaping rewards, then a landing or a crash."""
    rewards = rng.normal(size=n_steps) * rng.choice([0.3, 1.0, 3.0])
    rewards[-1] += rng.choice([-100.0, 100.0])
    return rewards.astype(np.float32)


def small_rewards(rng) -> np.ndarray:
    """1 to 4 rewards of small whole numbers: values a learner can work out on paper."""
    return rng.integers(-3, 5, size=int(rng.integers(1, 5))).astype(np.float64)


# ---- exercise 1: discounted values ---------------------------------------------------------------------------------
def values_trial(rng):
    """(a small episode and its gamma, a bigger episode and its gamma)."""
    small = small_rewards(rng), float(rng.choice([0.5, 1.0]))
    if rng.random() < 0.4:  # an episode as long as the course's: hundreds of float32 steps, gamma 0.99
        return small, (lander_rewards(rng, int(rng.integers(100, 1000))), 0.99)
    rewards = rng.normal(size=int(rng.integers(1, 80))) * rng.choice([0.1, 1.0, 100.0])
    return small, (rewards, float(rng.choice([0.3, 0.5, 0.9, 0.99, 1.0])))


def run_values(answer, trial):
    (small, small_gamma), (rewards, gamma) = trial
    return {f"discounted_values({small.tolist()}, gamma={small_gamma:g})":
                answer.discounted_values(small.copy(), small_gamma),
            f"discounted_values(the {len(rewards)} rewards of an episode, gamma={gamma:g})":
                answer.discounted_values(rewards.copy(), gamma)}


def _backward(rewards, gamma, step, last=0.0, stop=0):
    """values[T-1] = last; values[t] = step(rewards, values, t, gamma) for t = T-2 down to `stop`."""
    rewards = np.asarray(rewards, dtype=np.float64)
    values = np.zeros_like(rewards)
    values[-1] = last
    for t in range(len(rewards) - 2, stop - 1, -1):
        values[t] = step(rewards, values, t, gamma)
    return values


def _own_reward(rewards, gamma):
    return _backward(rewards, gamma, lambda r, v, t, g: r[t] + g * v[t + 1])


def _return_to_go(rewards, gamma):
    rewards = np.asarray(rewards, dtype=np.float64)
    return _backward(rewards, gamma, lambda r, v, t, g: r[t] + g * v[t + 1], last=rewards[-1])


def _next_reward_discounted(rewards, gamma):
    return _backward(rewards, gamma, lambda r, v, t, g: g * (r[t + 1] + v[t + 1]))


def _stops_before_zero(rewards, gamma):
    return _backward(rewards, gamma, lambda r, v, t, g: r[t + 1] + g * v[t + 1], stop=1)


def _forward_loop(rewards, gamma):
    rewards = np.asarray(rewards, dtype=np.float64)
    values = np.zeros_like(rewards)
    for t in range(len(rewards) - 1):  # values[t + 1] is still 0 when values[t] reads it
        values[t] = rewards[t + 1] + gamma * values[t + 1]
    return values


value_target = Exercise(
    id="00-discounted-values", number=1, what="your discounted_values", names=("discounted_values",),
    trial=values_trial, run=run_values, reference={"discounted_values": ttlib_data.discounted_values},
    forbid=(ttlib_data.discounted_values, ttlib_data.load), atol=1e-3, rtol=1e-5, trials=10, hidden_trials=20,
    passed="your values match ttlib's.",
    mistakes=[
        Mistake("each value includes its own step's reward: V_t counts only the rewards *after* step t (r_t has its "
                "own token), so V_t = r_{t+1} + gamma * V_{t+1}.", {"discounted_values": _own_reward}),
        Mistake("this is the return-to-go G_t = r_t + gamma * G_{t+1} (the Decision Transformer's target), which "
                "counts r_t itself: V_t starts at the next reward, V_t = r_{t+1} + gamma * V_{t+1}, and V_{T-1} = 0.",
                {"discounted_values": _return_to_go}),
        Mistake("the next reward is discounted too: r_{t+1} counts fully (gamma^0), only the rewards after it are "
                "discounted, so V_t = r_{t+1} + gamma * V_{t+1}, not gamma * (r_{t+1} + V_{t+1}).",
                {"discounted_values": _next_reward_discounted}),
        Mistake("V_0 is never computed: the backward loop must run down to t = 0 (`range(T - 2, -1, -1)`: the "
                "stop of a range is excluded).", {"discounted_values": _stops_before_zero}),
        Mistake("the loop runs forwards, so V_{t+1} is still 0 when V_t reads it: run it backwards, from "
                "t = T - 2 down to 0, so that each value is ready when the step before it needs it.",
                {"discounted_values": _forward_loop}),
    ],
)


# ---- exercise 2: returns and normalized scores ---------------------------------------------------------------------
def returns_trial(rng):
    """(small episodes, course-like episodes, small references and returns, returns with random references)."""
    small_episodes = [small_rewards(rng) for _ in range(int(rng.integers(1, 4)))]
    episodes = [lander_rewards(rng, int(rng.integers(1, 400))) for _ in range(int(rng.integers(1, 9)))]
    lo, hi = -int(rng.integers(1, 5)) * 50, int(rng.integers(1, 5)) * 50
    small_scores = np.array([lo, (lo + hi) / 2, hi], dtype=np.float64), float(lo), float(hi)
    ref_min = float(rng.normal() * 100)
    scores = rng.normal(size=int(rng.integers(1, 20))) * 100, ref_min, ref_min + float(rng.uniform(1, 300))
    return small_episodes, episodes, small_scores, scores


def run_returns(answer, trial):
    small_episodes, episodes, (small, small_lo, small_hi), (returns, lo, hi) = trial
    lengths = sorted(len(r) for r in episodes)
    return {
        f"episode_returns({[r.tolist() for r in small_episodes]})":
            answer.episode_returns([r.copy() for r in small_episodes]),
        f"episode_returns of {len(episodes)} episodes of {lengths[0]} to {lengths[-1]} steps":
            answer.episode_returns([r.copy() for r in episodes]),
        f"normalized_score({small.tolist()}, ref_min={small_lo:g}, ref_max={small_hi:g})":
            answer.normalized_score(small.copy(), small_lo, small_hi),
        f"normalized_score({len(returns)} returns, ref_min={lo:.1f}, ref_max={hi:.1f})":
            answer.normalized_score(returns.copy(), lo, hi),
    }


def dataset_of(rewards, ref_min: float = 0.0, ref_max: float = 1.0) -> ttlib_data.OfflineDataset:
    """An OfflineDataset that holds only these rewards (and references): the methods the exercise rebuilds."""
    rewards = [np.asarray(r) for r in rewards]
    empty, flags = [np.zeros((len(r), 1)) for r in rewards], [np.zeros(len(r), bool) for r in rewards]
    return ttlib_data.OfflineDataset("exercise/episodes-v0", None, {}, 0.99, empty, empty, rewards, flags, flags,
                                     rewards, None, ref_min, ref_max)


def ttlib_returns(rewards):
    return dataset_of(rewards).returns()


def ttlib_normalized_score(returns, ref_min, ref_max):
    return dataset_of([], ref_min, ref_max).normalized_score(returns)


def _returns_with(total):
    return {"episode_returns": lambda rewards: np.array([total(np.asarray(r, dtype=np.float64)) for r in rewards])}


def _scores_with(score):
    return {"normalized_score": lambda g, lo, hi: score(np.asarray(g, dtype=np.float64), lo, hi)}


def _discounted_sum(r):
    return float(np.sum(r * 0.99 ** np.arange(len(r))))


returns_and_scores = Exercise(
    id="00-returns", number=2, what="your episode_returns or normalized_score",
    names=("episode_returns", "normalized_score"), trial=returns_trial, run=run_returns,
    reference={"episode_returns": ttlib_returns, "normalized_score": ttlib_normalized_score},
    forbid=(ttlib_data.OfflineDataset.returns, ttlib_data.OfflineDataset.normalized_score, ttlib_data.load),
    atol=1e-3, rtol=1e-6, trials=5, hidden_trials=10, passed="your returns and scores are the dataset's.",
    mistakes=[
        Mistake("these are mean rewards: an episode's return is the *sum* of its rewards, G = sum_t r_t.",
                _returns_with(np.mean)),
        Mistake("these returns are discounted: the return that judges a whole episode is the plain sum of its "
                "rewards, every step counting fully (the discount belongs to the value V_t).",
                _returns_with(_discounted_sum)),
        Mistake("the scores are divided by ref_max alone: divide by the references' difference, "
                "(G - ref_min) / (ref_max - ref_min), so that the expert's return scores exactly 1.",
                _scores_with(lambda g, lo, hi: (g - lo) / hi)),
        Mistake("the scores are measured from the expert's return: measure from the random policy's, "
                "(G - ref_min) / (ref_max - ref_min), so that random scores 0 and the expert 1 (yours gives the "
                "expert 0).", _scores_with(lambda g, lo, hi: (g - hi) / (hi - lo))),
        Mistake("these are percentages, as papers print D4RL scores: here the random policy scores 0 and the "
                "expert 1, not 100 -- leave out the factor 100.",
                _scores_with(lambda g, lo, hi: 100 * (g - lo) / (hi - lo))),
    ],
)

# ---- exercise 3: the best episodes -----------------------------------------------------------------------------
def distinct_returns(make, rng, n: int) -> list[np.ndarray]:
    """n episodes from make(rng) whose returns all differ (a tie at the cut would make two answers right)."""
    while True:
        episodes = [make(rng) for _ in range(n)]
        returns = [float(np.sum(r, dtype=np.float64)) for r in episodes]
        if len(set(np.round(returns, 6))) == n:
            return episodes


def best_trial(rng):
    """(a few small episodes and a percentage, course-like episodes of many lengths and a percentage). The
    percentages are chosen so that a share of the episodes is a fraction: rounding it down keeps one too few."""
    n_small = int(rng.integers(3, 9))
    small = distinct_returns(small_rewards, rng, n_small)
    n = int(rng.integers(7, 60))
    episodes = distinct_returns(lambda g: lander_rewards(g, int(g.integers(1, 400))), rng, n)
    percents = [p for p in (10, 20, 25, 30, 40, 50, 60, 75) if (p * n) % 100]
    return (small, float(rng.choice([25, 50, 75]))), (episodes, float(rng.choice(percents or [25])))


def run_best(answer, trial):
    (small, small_percent), (episodes, percent) = trial
    return {f"best_episodes({[r.tolist() for r in small]}, percent={small_percent:g})":
                answer.best_episodes([r.copy() for r in small], small_percent),
            f"best_episodes of {len(episodes)} episodes of {min(map(len, episodes))} to "
            f"{max(map(len, episodes))} steps, percent={percent:g}":
                answer.best_episodes([r.copy() for r in episodes], percent)}


def plain_returns(rewards):
    """Exercise 2's episode_returns, lent to exercise 3 (the dataset's own method is what exercise 2 refuses)."""
    return np.array([np.sum(r, dtype=np.float64) for r in rewards])


def ttlib_best_episodes(rewards, percent):
    return ttlib_baselines.best_episodes([np.sum(r, dtype=np.float64) for r in rewards], percent)


def _best_with(score=lambda r: np.sum(r, dtype=np.float64), keep=lambda p, n: max(1, math.ceil(p / 100 * n)),
               worst=False, ranked=False):
    def best_episodes(rewards, percent):
        scores = np.array([score(np.asarray(r, dtype=np.float64)) for r in rewards])
        order = np.argsort(scores if worst else -scores, kind="stable")[:keep(percent, len(rewards))]
        return order if ranked else np.sort(order)

    return {"best_episodes": best_episodes}


choosing = Exercise(
    id="00-best-episodes", number=3, what="your best_episodes", names=("best_episodes",), trial=best_trial,
    run=run_best, reference={"best_episodes": ttlib_best_episodes}, lends={"episode_returns": plain_returns},
    forbid=(ttlib_baselines.best_episodes, ttlib_data.OfflineDataset.returns, ttlib_data.load), trials=8,
    hidden_trials=16, passed="you keep the episodes %BC learns from.",
    mistakes=[
        Mistake("the episodes are ranked by their mean reward per step: rank them by their return, the *sum* of "
                "their rewards (a short crash can have a higher mean than a long landing).",
                _best_with(score=np.mean)),
        Mistake("the episodes are ranked by their discounted return: %BC keeps the episodes whose plain return, "
                "sum_t r_t, is highest (the discount belongs to the value V_t).", _best_with(score=_discounted_sum)),
        Mistake("these are the *worst* episodes: sort the returns from the highest down (np.argsort(-returns)).",
                _best_with(worst=True)),
        Mistake("one episode too few: the share is rounded down (int()); keep ceil(percent / 100 * n) episodes "
                "(math.ceil), so that 25% of 10 episodes keeps 3 and any percentage keeps at least one.",
                _best_with(keep=lambda p, n: int(p / 100 * n))),
        Mistake("one episode too many: keep exactly ceil(percent / 100 * n) episodes -- a slice [:k] takes k, "
                "[:k + 1] one more.", _best_with(keep=lambda p, n: math.ceil(p / 100 * n) + 1)),
        Mistake("percent is used as a fraction: 25 means a quarter of the episodes, so divide it by 100.",
                _best_with(keep=lambda p, n: min(n, math.ceil(p * n)))),
        Mistake("the right episodes, in the order of their returns: return their indices in increasing order "
                "(np.sort), as a set of episodes.", _best_with(ranked=True)),
    ],
)


# ---- exercise 4: behaviour cloning ------------------------------------------------------------------------------
@functools.cache
def _warm_up_optimizers() -> None:
    """PyTorch's first optimizer imports torch._dynamo (seconds): do it once, before the guard watches."""
    torch.optim.Adam([torch.nn.Parameter(torch.zeros(1))])


def cloning_trial(rng):
    """A small float64 policy (standardised inputs, tanh head), observations and actions to clone, a few steps."""
    _warm_up_optimizers()
    obs_dim, act_dim, N = int(rng.integers(2, 9)), int(rng.integers(1, 4)), int(rng.integers(20, 200))
    policy = ttlib_baselines.MLPPolicy(obs_dim, act_dim, hidden=int(rng.integers(8, 33)), layers=2).double()
    observations = torch.as_tensor(rng.normal(size=(N, obs_dim)) * rng.uniform(0.5, 3), dtype=torch.float64)
    with torch.no_grad():
        policy.obs_mean.copy_(observations.mean(0))
        policy.obs_std.copy_(observations.std(0))
    actions = torch.as_tensor(rng.uniform(-1, 1, size=(N, act_dim)), dtype=torch.float64)
    settings = dict(steps=int(rng.integers(2, 9)), batch_size=int(rng.integers(4, 33)),
                    learning_rate=float(rng.choice([1e-3, 3e-3, 1e-2])), seed=int(rng.integers(1000)))
    return policy, observations, actions, settings


def run_cloning(answer, trial):
    policy, observations, actions, settings = trial
    generator = torch.Generator().manual_seed(settings["seed"])
    torch.manual_seed(12345)  # whatever the answer draws from torch's global generator is the same every run
    losses = answer.fit_policy(policy, observations, actions, settings["steps"], settings["batch_size"],
                               settings["learning_rate"], generator)
    with torch.no_grad():
        after = policy(observations)
    what = (f"fit_policy({len(observations)} transitions, steps={settings['steps']}, "
            f"batch_size={settings['batch_size']}, learning_rate={settings['learning_rate']:g})")
    return {f"the losses {what} returned": torch.as_tensor(np.asarray(losses, dtype=np.float64)),
            "the policy's actions on the observations after it": after}


def ttlib_fit_policy(policy, observations, actions, steps, batch_size, learning_rate, generator):
    return ttlib_baselines.fit_policy(policy, observations, actions, steps, batch_size, learning_rate, generator)


def _fit_with(optimizer=torch.optim.Adam, zero_grad=True, new_optimizer=False, error=lambda d: d**2,
              step=True, sum_dims=False, own_generator=True):
    def fit_policy(policy, observations, actions, steps, batch_size, learning_rate, generator):
        opt = optimizer(policy.parameters(), lr=learning_rate)
        losses = []
        for _ in range(steps):
            if new_optimizer:
                opt = optimizer(policy.parameters(), lr=learning_rate)
            i = torch.randint(0, len(observations), (batch_size,), generator=generator if own_generator else None)
            e = error(policy(observations[i]) - actions[i])
            loss = e.sum(dim=1).mean() if sum_dims else e.mean()
            if zero_grad:
                opt.zero_grad()
            loss.backward()
            if step:
                opt.step()
            losses.append(loss.item())
        return losses

    return {"fit_policy": fit_policy}


cloning = Exercise(
    id="00-fit-policy", number=4, what="your fit_policy", names=("fit_policy",), trial=cloning_trial,
    run=run_cloning, reference={"fit_policy": ttlib_fit_policy},
    forbid=(ttlib_baselines.fit_policy, ttlib_baselines.train_policy), atol=1e-9, rtol=1e-9, trials=5,
    hidden_trials=10, passed="your loop trains ttlib's policy step for step.",
    mistakes=[
        Mistake("the gradients are never zeroed: each backward() adds to the last step's gradients, so step t "
                "follows the sum of all t gradients so far. Call optimizer.zero_grad() before loss.backward().",
                _fit_with(zero_grad=False)),
        Mistake("the weights never change: optimizer.step() is missing after loss.backward().", _fit_with(step=False)),
        Mistake("a new Adam is made every step: it forgets its running averages of the gradient, so every step is "
                "its first. Make the optimiser once, before the loop.", _fit_with(new_optimizer=True)),
        Mistake("this is plain SGD: the fit uses Adam, torch.optim.Adam(policy.parameters(), lr=learning_rate).",
                _fit_with(optimizer=torch.optim.SGD)),
        Mistake("this is an absolute error: behaviour cloning minimises the *squared* error, "
                "((policy(obs) - act) ** 2).mean().", _fit_with(error=torch.abs)),
        Mistake("the squared errors are summed over the action's dimensions: take the mean over every entry, batch "
                "and action dimensions alike, ((policy(obs) - act) ** 2).mean().", _fit_with(sum_dims=True)),
        Mistake("the batches are drawn from torch's global random generator: pass generator=generator to "
                "torch.randint, so that the same seed draws the same batches.", _fit_with(own_generator=False)),
    ],
)

EXERCISES = [value_target, returns_and_scores, choosing, cloning]
