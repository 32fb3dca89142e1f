"""Notebook 06's exercises: the expectile loss, the TD target, and the two losses of an IQL update.

Each exercise runs the learner's answer and ttlib's (`ttlib.agents.critic`) on small random critics in float64; the
mistakes are the slips learners make most, each with the sentence that says what went wrong.
"""

from __future__ import annotations

import copy
import functools

import numpy as np
import torch

from ttlib.agents import critic as ttlib_critic
from ttlib.agents.critic import CriticConfig, CriticMember
from ttlib.exercises import Exercise, Mistake

__all__ = ["EXERCISES", "NETWORKS", "NO_DISCOUNT", "NO_DONE", "TARGET_WITH_GRAD", "TRAINED_Q", "TRAIN_STEPS",
           "critic_trial", "errors_trial", "expectile_regression", "gradient_reaches", "iql_losses", "losses_trial",
           "run_expectile", "run_losses", "run_td_target", "temporal_difference"]


# ---- exercise 1: the expectile loss -----------------------------------------------------------------------------
def errors_trial(rng):
    """Errors u of a random shape and scale, in float32 or float64, and a tau."""
    shape = tuple(int(n) for n in rng.integers(1, 40, size=int(rng.integers(1, 3))))
    dtype = torch.float64 if rng.random() < 0.5 else torch.float32
    diff = torch.as_tensor(rng.normal(size=shape) * float(rng.uniform(0.1, 100)), dtype=dtype)
    return diff, float(rng.uniform(0.01, 0.99))


def run_expectile(answer, trial):
    diff, tau = trial
    errors = diff.clone().requires_grad_(True)
    loss = answer.expectile_loss(errors, tau)
    flows = torch.is_tensor(loss) and loss.requires_grad
    gradient = torch.autograd.grad(loss, errors, allow_unused=True)[0] if flows else None
    return {f"expectile_loss(diff of shape {tuple(diff.shape)}, tau={tau:.3f})": loss,
            "its dtype": str(getattr(loss, "dtype", type(loss).__name__)).replace("torch.", ""),
            "it returns a tensor that gradients flow through": flows,
            "its gradient with respect to diff": torch.full_like(diff, torch.nan) if gradient is None else gradient}


def _expectile_with(weight=lambda diff, tau: torch.where(diff < 0, 1 - tau, tau), error=lambda d: d**2,
                    reduce=torch.mean, outside_torch=False, square_weight=False):
    def expectile_loss(diff, tau):
        if outside_torch:  # right numbers, computed in numpy: no gradient
            u = diff.detach().numpy()
            return torch.tensor(float(np.mean(np.where(u < 0, 1 - tau, tau) * u**2)), dtype=diff.dtype)
        w = weight(diff, tau)
        return reduce((w * diff) ** 2) if square_weight else reduce(w * error(diff))

    return {"expectile_loss": expectile_loss}


expectile_regression = Exercise(
    id="06-expectile-loss", number=1, what="your expectile_loss", names=("expectile_loss",), trial=errors_trial,
    run=run_expectile, reference={"expectile_loss": ttlib_critic.expectile_loss},
    forbid=(ttlib_critic.expectile_loss,), atol=1e-6, rtol=1e-5, trials=12, hidden_trials=20,
    passed="your loss is the one the shipped critic's V was trained with.",
    mistakes=[
        Mistake("the weights are swapped: an error u < 0 (V too high) costs 1 - tau and u >= 0 (V too low) costs "
                "tau, so that with tau = 0.8 V settles *above* the mean.",
                _expectile_with(weight=lambda diff, tau: torch.where(diff < 0, tau, 1 - tau))),
        Mistake("this is an absolute error, |u|: the expectile loss weighs the *squared* error u^2.",
                _expectile_with(error=torch.abs)),
        Mistake("the loss is summed, not averaged: return the mean over all entries, so the loss does not grow "
                "with the batch.", _expectile_with(reduce=torch.sum)),
        Mistake("every error is weighted tau: that is a scaled squared error, minimised at the mean whatever tau "
                "is. Weigh u < 0 by 1 - tau and u >= 0 by tau.",
                _expectile_with(weight=lambda diff, tau: tau)),
        Mistake("the loss is computed outside torch (numpy, .item() or a new torch.tensor): the numbers are right "
                "but no gradient reaches the critic. Use torch operations on diff only.",
                _expectile_with(outside_torch=True)),
        Mistake("the weight is squared with the error: |tau - 1[u < 0]| multiplies u^2, it is not inside the "
                "square.", _expectile_with(square_weight=True)),
        Mistake("the absolute value is missing: tau - 1[u < 0] is tau - 1 < 0 for u < 0, so those errors would "
                "*lower* the loss; the weight of u < 0 is 1 - tau.",
                _expectile_with(weight=lambda diff, tau: tau - (diff < 0).to(diff.dtype))),
    ],
)


# ---- exercises 2 and 3: a small random critic, its target networks and a batch ----------------------------------
def critic_trial(rng):
    """A float64 CriticMember on standardised observations, target networks that differ from it, a batch of
    transitions in which some episodes end (done = 1) and some go on, a discount and a tau."""
    obs_dim, act_dim = int(rng.integers(2, 9)), int(rng.integers(1, 4))
    hidden, B = int(rng.integers(16, 33)), int(rng.integers(2, 41))
    critic = CriticMember(obs_dim, act_dim, hidden).double()
    with torch.no_grad():
        critic.obs_mean.copy_(torch.as_tensor(rng.normal(size=obs_dim)))
        critic.obs_std.copy_(torch.as_tensor(rng.uniform(0.5, 2.0, size=obs_dim)))
        for net in (critic.q1, critic.q2, critic.v_net):  # values of a few units, as a critic's are
            net[-1].bias.add_(float(rng.normal() * 5))
    target = copy.deepcopy(critic)
    with torch.no_grad():
        for p in [*target.q1.parameters(), *target.q2.parameters()]:
            p.add_(0.2 * torch.randn_like(p))
    done = rng.random(B) < 0.3
    done[0], done[-1] = True, False  # at least one of each
    batch = {"obs": rng.normal(size=(B, obs_dim)), "act": rng.uniform(-1, 1, size=(B, act_dim)),
             "reward": rng.normal(size=B) * 10, "next_obs": rng.normal(size=(B, obs_dim)), "done": done}
    batch = {key: torch.as_tensor(value, dtype=torch.float64) for key, value in batch.items()}
    return critic, target, batch, float(rng.uniform(0.5, 0.99)), float(rng.uniform(0.55, 0.95))


def run_td_target(answer, trial):
    critic, _, batch, gamma, _ = copy.deepcopy(trial)  # nothing an answer does to its inputs reaches another's
    y = answer.td_target(critic, batch, gamma)
    return {f"td_target(critic, batch of {len(batch['obs'])} transitions, gamma={gamma:.3f})": y,
            "td_target's result carries a gradient back into V (requires_grad)":
                bool(torch.is_tensor(y) and y.requires_grad)}


def _td_target_with(discount=True, mask=True, grad=False, state="next_obs", mask_reward=False, done_as_is=False,
                    discount_reward=False):
    def td_target(critic, batch, gamma):
        with torch.enable_grad() if grad else torch.no_grad():
            g = gamma if discount else 1.0
            alive = batch["done"] if done_as_is else 1 - batch["done"]
            later = critic.v(batch[state]) * (alive if mask else 1.0)
            if mask_reward:
                return alive * (batch["reward"] + g * critic.v(batch[state]))
            if discount_reward:
                return g * (batch["reward"] + later)
            return batch["reward"] + g * later

    return td_target


NO_DONE = ("the end of an episode is ignored: after a terminal transition there is no next state to value, so its "
           "target is the reward alone -- multiply gamma V(s') by (1 - done).")
NO_DISCOUNT = "the discount is missing: the target is r + gamma (1 - done) V(s'), a reward now counts more than later."
TARGET_WITH_GRAD = ("the TD target is computed with gradient: it is a fixed target Q regresses on, so compute it under "
                    "torch.no_grad() -- otherwise q_loss's gradient also moves V, towards Q.")

temporal_difference = Exercise(
    id="06-td-target", number=2, what="your td_target", names=("td_target",), trial=critic_trial,
    run=run_td_target, reference={"td_target": ttlib_critic.td_target},
    forbid=(ttlib_critic.td_target, ttlib_critic.q_loss), atol=1e-9, rtol=1e-9, trials=6, hidden_trials=10,
    passed="your TD target is the one both Q networks of the shipped critic regressed on.",
    mistakes=[
        Mistake(NO_DONE, {"td_target": _td_target_with(mask=False)}),
        Mistake(NO_DISCOUNT, {"td_target": _td_target_with(discount=False)}),
        Mistake(TARGET_WITH_GRAD, {"td_target": _td_target_with(grad=True)}),
        Mistake("V is evaluated at the transition's own state s: the target values the state the action led to, "
                "s' (batch[\"next_obs\"]).", {"td_target": _td_target_with(state="obs")}),
        Mistake("(1 - done) multiplies the reward too: the last transition's reward is real and counts; only "
                "gamma V(s') is dropped where the episode ended.", {"td_target": _td_target_with(mask_reward=True)}),
        Mistake("done is used where 1 - done belongs: V(s') counts only while the episode goes on (done = 0).",
                {"td_target": _td_target_with(done_as_is=True)}),
    ],
)


# ---- exercise 3: the IQL update's two losses --------------------------------------------------------------------
NETWORKS = ("q1", "q2", "v_net")
TRAIN_STEPS = 5  # IQL steps of train_member with the answer's losses: they must make ttlib's member


def gradient_reaches(loss, critic, target) -> str:
    """Which networks `loss`'s gradient reaches: "critic.v_net", "critic.q1, critic.q2", ..."""
    if not (torch.is_tensor(loss) and loss.requires_grad):
        return "none (the loss carries no gradient)"
    nets = {f"{who}.{name}": getattr(member, name) for who, member in (("critic", critic), ("target", target))
            for name in NETWORKS}
    params = {name: list(net.parameters()) for name, net in nets.items()}
    grads = torch.autograd.grad(loss, [p for ps in params.values() for p in ps], allow_unused=True)
    reached, i = [], 0
    for name, ps in params.items():
        if any(g is not None and bool(g.abs().sum() > 0) for g in grads[i:i + len(ps)]):
            reached.append(name)
        i += len(ps)
    return ", ".join(reached) or "none"


@functools.cache
def _warm_up_optimizers() -> None:
    """PyTorch's first optimizer imports torch._dynamo (seconds): do it once, before the guard watches."""
    torch.optim.Adam([torch.nn.Parameter(torch.zeros(1))])


def losses_trial(rng):
    _warm_up_optimizers()
    return critic_trial(rng)


class _Quiet:  # a progress bar that shows nothing
    def update(self, n=1):
        pass


def run_losses(answer, trial):
    critic, target, batch, gamma, tau = copy.deepcopy(trial)
    B = len(batch["obs"])
    v_loss = answer.value_loss(critic, target, batch, tau)
    outputs = {f"value_loss(critic, target, batch of {B} transitions, tau={tau:.3f})": v_loss,
               "the networks value_loss sends a gradient to": gradient_reaches(v_loss, critic, target)}
    both = answer.q_loss(critic, batch, gamma)
    outputs[f"q_loss(critic, batch of {B} transitions, gamma={gamma:.3f})"] = both
    outputs["the networks q_loss sends a gradient to"] = gradient_reaches(both, critic, target)
    config = CriticConfig(expectile=tau, gamma=gamma, steps=TRAIN_STEPS, batch_size=B, learning_rate=1e-2,
                          hidden=critic.v_net[0].out_features)
    member = ttlib_critic.train_member(batch, config, 0, "cpu", [], _Quiet(),
                                       losses=(answer.value_loss, answer.q_loss))
    with torch.no_grad():
        outputs[f"after {TRAIN_STEPS} IQL steps with your losses (train_member): V of the batch's states"] = \
            member.v(batch["obs"])
        outputs[f"after {TRAIN_STEPS} IQL steps with your losses: Q of the batch's transitions"] = \
            member.q(batch["obs"], batch["act"])
    return outputs


def _value_loss_with(q_of="target", grad=False, flip=False, squared=False):
    def value_loss(critic, target, batch, tau):
        obs, act = batch["obs"], batch["act"]
        with torch.enable_grad() if grad else torch.no_grad():
            if q_of == "target":
                q = target.q(obs, act)
            elif q_of == "trained":
                q = critic.q(obs, act)
            elif q_of == "mean":
                q = torch.stack(target.q_pair(obs, act)).mean(0)
            else:  # "first": one network only
                q = target.q_pair(obs, act)[0]
        v = critic.v(obs)
        if squared:
            return ((q - v) ** 2).mean()
        return ttlib_critic.expectile_loss(v - q if flip else q - v, tau)

    return {"value_loss": value_loss}


def _q_loss_with(target=ttlib_critic.td_target, networks="both", reduce="add"):
    def q_loss(critic, batch, gamma):
        y = target(critic, batch, gamma)
        q1, q2 = critic.q_pair(batch["obs"], batch["act"])
        if networks == "min":
            return ((torch.minimum(q1, q2) - y) ** 2).mean()
        one, two = ((q1 - y) ** 2).mean(), ((q2 - y) ** 2).mean()
        if networks == "one":
            return one
        return (one + two) / 2 if reduce == "mean" else one + two

    return {"q_loss": q_loss}


TRAINED_Q = ("V is regressed on the Q networks being trained: use the *target* networks' Q (target.q), which follow "
             "them slowly -- a V that chases a Q that chases V is what makes TD learning unstable.")

iql_losses = Exercise(
    id="06-iql-losses", number=3, what="your IQL losses", names=("value_loss", "q_loss"), trial=losses_trial,
    run=run_losses, reference={"value_loss": ttlib_critic.value_loss, "q_loss": ttlib_critic.q_loss},
    lends={"expectile_loss": ttlib_critic.expectile_loss, "td_target": ttlib_critic.td_target},
    forbid=(ttlib_critic.value_loss, ttlib_critic.q_loss), atol=1e-9, rtol=1e-9, trials=4, hidden_trials=8,
    passed="your losses train ttlib's critic member, step for step.",
    mistakes=[
        Mistake(TRAINED_Q, _value_loss_with(q_of="trained")),
        Mistake(TRAINED_Q, _value_loss_with(q_of="trained", grad=True)),
        Mistake("V's error has its sign flipped: u = Q - V (target minus prediction). V - Q swaps the weights -- "
                "the (1 - tau)-expectile, a V *below* the mean of Q.", _value_loss_with(flip=True)),
        Mistake("the target networks' Q is computed with gradient: value_loss sends gradients into target.q1 and "
                "target.q2, which only follow the trained ones; compute Q under torch.no_grad().",
                _value_loss_with(grad=True)),
        Mistake("V is regressed on the mean of the two target Q networks: take the smaller of the two (target.q), "
                "so that one network's lucky overestimate does not count.", _value_loss_with(q_of="mean")),
        Mistake("V is regressed on one target Q network (q_pair's first): take the smaller of the two, "
                "target.q(obs, act).", _value_loss_with(q_of="first")),
        Mistake("V is fitted with a plain squared error: that puts V at the mean of Q over the data's actions. Use "
                "your expectile_loss(Q - V, tau), which puts it towards the best of them.",
                _value_loss_with(squared=True)),
        Mistake("only one Q network is trained: both regress on the TD target, and q_loss adds their two mean "
                "squared errors (the critic uses the smaller of the two Q).", _q_loss_with(networks="one")),
        Mistake("q_loss sends a gradient into V through the TD target: compute the target without gradient (your "
                "td_target does, under torch.no_grad()) -- V learns from its own loss only.",
                _q_loss_with(target=_td_target_with(grad=True))),
        Mistake(NO_DONE, _q_loss_with(target=_td_target_with(mask=False))),
        Mistake(NO_DISCOUNT, _q_loss_with(target=_td_target_with(discount=False))),
        Mistake("min(Q1, Q2) is regressed on the target: each network regresses on it on its own, "
                "((q1 - y)^2).mean() + ((q2 - y)^2).mean().", _q_loss_with(networks="min")),
        Mistake("the two networks' losses are averaged, not added: q_loss is the *sum* of their mean squared "
                "errors (Adam hardly notices the factor 2, but the loss reported is half).",
                _q_loss_with(reduce="mean")),
    ],
)

EXERCISES = [expectile_regression, temporal_difference, iql_losses]
