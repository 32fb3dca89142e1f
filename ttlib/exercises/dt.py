"""Notebook 09's exercises: returns-to-go, the interleaved (R, s, a) sequence, and the return-to-go bookkeeping of
an agent that acts.

Each exercise compares the learner's answer with ttlib.agents.dt's (for the bookkeeping: with what `DTAgent` feeds its
model) on random trials, after a small case whose answer can be checked by hand.
"""

from __future__ import annotations

import copy
import functools
import inspect

import numpy as np
import torch

from ttlib.agents import dt as ttlib_dt
from ttlib.exercises import Exercise, Mistake

__all__ = ["EXERCISES", "bookkeeping", "embed_with", "episode_trial", "interleaving", "rewards_trial", "rtg",
           "run_interleave", "run_return_tokens", "run_returns_to_go", "small_model", "streams_trial",
           "what_the_agent_feeds"]


def _dtype(x) -> str:
    return str(getattr(x, "dtype", type(x).__name__)).replace("torch.", "")


# ---- exercise 1: returns-to-go -------------------------------------------------------------------------------------
def rewards_trial(rng):
    return rng.normal(size=int(rng.integers(1, 300))) * rng.choice([0.1, 1.0, 100.0])


def run_returns_to_go(answer, trial):
    rewards = copy.deepcopy(trial)
    returns = answer.returns_to_go(rewards)
    return {"returns_to_go of the rewards 1, 2, -4": answer.returns_to_go(np.array([1.0, 2.0, -4.0])),
            f"returns_to_go of {len(rewards)} rewards": returns,
            "the dtype of your returns-to-go": _dtype(returns)}


def _returns_to_go_with(backwards=True, reverse_back=True, include_now=True, gamma=1.0):
    def returns_to_go(rewards):
        rewards = np.asarray(rewards, dtype=np.float64)
        if gamma != 1.0:
            returns, left = np.zeros_like(rewards), 0.0
            for t in reversed(range(len(rewards))):
                returns[t] = left = rewards[t] + gamma * left
            return returns.astype(np.float32)
        returns = np.cumsum(rewards[::-1]) if backwards else np.cumsum(rewards)
        returns = returns[::-1] if backwards and reverse_back else returns
        return (returns if include_now else returns - rewards).astype(np.float32)

    return {"returns_to_go": returns_to_go}


rtg = Exercise(
    id="09-returns-to-go", number=1, what="your returns_to_go", names=("returns_to_go",), trial=rewards_trial,
    run=run_returns_to_go, reference={"returns_to_go": ttlib_dt.returns_to_go},
    forbid=(ttlib_dt.returns_to_go, _returns_to_go_with()["returns_to_go"]), atol=1e-3, rtol=1e-6, trials=8,
    hidden_trials=16, passed="your returns-to-go are ttlib's.",
    mistakes=[
        Mistake("the rewards are summed from the start (a running total): R_t is what is still to come, so sum from "
                "the end -- reverse, cumulative sum, reverse back.", _returns_to_go_with(backwards=False)),
        Mistake("R_t leaves out r_t: the return-to-go counts the reward of step t too, so R_{T-1} = r_{T-1}.",
                _returns_to_go_with(include_now=False)),
        Mistake("the cumulative sum of the reversed rewards is not reversed back: np.cumsum(rewards[::-1])[::-1] "
                "puts R_0 first again.", _returns_to_go_with(reverse_back=False)),
        Mistake("these returns are discounted: the Decision Transformer's returns-to-go are plain, undiscounted "
                "sums of the rewards still to come.", _returns_to_go_with(gamma=0.99)),
    ],
)


# ---- exercise 2: interleaving ----------------------------------------------------------------------------------------
def streams_trial(rng):
    """Three token streams, and a small Decision Transformer with raw returns, states, actions and timesteps."""
    B, T, C = int(rng.integers(1, 4)), int(rng.integers(1, 12)), int(rng.integers(1, 9))
    model = ttlib_dt.DecisionTransformer(ttlib_dt.DTConfig(obs_dim=8, act_dim=2, context=4, n_layer=1,
                                                           n_embd=16)).eval()
    steps = (torch.randn(2, 4, 1) * 100, torch.randn(2, 4, 8), torch.rand(2, 4, 2), torch.arange(4).expand(2, 4))
    return (torch.randn(B, T, C), torch.randn(B, T, C), torch.randn(B, T, C)), model, steps


def embed_with(interleave, model, returns, states, actions, timesteps):
    """DecisionTransformer.embed, with `interleave` in the place of ttlib's."""
    time_emb = model.embed_timestep(timesteps.clamp(0, model.config.max_timestep - 1))  # (B, T, C)
    r = model.embed_return(returns / model.config.rtg_scale) + time_emb
    s = model.embed_state((states - model.obs_mean) / model.obs_std) + time_emb
    a = model.embed_action(actions) + time_emb
    return model.embed_ln(interleave(r, s, a))  # (B, 3T, C)


def run_interleave(answer, trial):
    streams, model, steps = copy.deepcopy(trial)
    small = (torch.tensor([[[0.0], [10.0]]]), torch.tensor([[[1.0], [11.0]]]), torch.tensor([[[2.0], [12.0]]]))
    with torch.no_grad():
        return {"interleave of R = (0, 10), s = (1, 11), a = (2, 12) (B = 1, T = 2, C = 1)": answer.interleave(*small),
                f"interleave of three streams of shape {tuple(streams[0].shape)}": answer.interleave(*streams),
                "a DecisionTransformer's input tokens, embedded with your interleave":
                    embed_with(answer.interleave, model, *steps)}


def _interleave_with(order=(0, 1, 2), dim=2, reshaped=True):
    def interleave(returns, states, actions):
        B, T, C = states.shape
        streams = (returns, states, actions)
        stacked = torch.stack([streams[i] for i in order], dim=dim)
        return stacked.reshape(B, 3 * T, C) if reshaped else stacked

    return {"interleave": interleave}


interleaving = Exercise(
    id="09-interleave", number=2, what="your interleave", names=("interleave",), trial=streams_trial,
    run=run_interleave, reference={"interleave": ttlib_dt.interleave},
    forbid=(ttlib_dt.interleave, ttlib_dt.DecisionTransformer.embed, _interleave_with()["interleave"]), atol=1e-6,
    trials=8, hidden_trials=16, passed="your sequence is the one the Decision Transformer reads.",
    mistakes=[
        Mistake("all the returns come first, then all the states, then all the actions: stack the three on a new "
                "axis *after* time (dim=2, giving (B, T, 3, C)) so that a step's three tokens stay together when you "
                "reshape to (B, 3T, C).", _interleave_with(dim=1)),
        Mistake("the three are stacked on the last axis, (B, T, C, 3): reshaping that mixes the channels of "
                "different tokens. Stack on dim=2, giving (B, T, 3, C), then reshape.", _interleave_with(dim=3)),
        Mistake("a step's tokens come in the order s, R, a: the Decision Transformer reads R_t, then s_t, then "
                "a_t.", _interleave_with(order=(1, 0, 2))),
        Mistake("a step's tokens come in the order R, a, s: the action comes last, R_t, s_t, a_t -- it is what the "
                "model predicts from the state.", _interleave_with(order=(0, 2, 1))),
    ],
)


# ---- exercise 3: the bookkeeping while acting ------------------------------------------------------------------------
def episode_trial(rng):
    return float(rng.normal() * 200), rng.normal(size=int(rng.integers(1, 30))) * 20


@functools.cache
def small_model() -> ttlib_dt.DecisionTransformer:
    """A small Decision Transformer for the agent to act with: its actions do not matter here, its books do."""
    return ttlib_dt.DecisionTransformer(ttlib_dt.DTConfig(obs_dim=8, act_dim=2, context=3, n_layer=1,
                                                          n_embd=8)).eval()


def what_the_agent_feeds(target, rewards):
    """The return-to-go token DTAgent feeds its model before each action, given the rewards that follow them."""
    agent, fed = ttlib_dt.DTAgent(small_model(), target, n_envs=1), []
    for r in rewards:
        agent.act(np.zeros((1, 8)))
        fed.append(agent.returns[0, -1, 0].item())  # the R_t token of the step just acted on
        agent.observe([r])
    return np.array(fed)


def run_return_tokens(answer, trial):
    target, rewards = copy.deepcopy(trial)
    return {"return_tokens(100, rewards 10, -5, 3)": answer.return_tokens(100.0, [10.0, -5.0, 3.0]),
            f"return_tokens(target {target:.2f}, {len(rewards)} rewards)": answer.return_tokens(target, rewards)}


def _return_tokens_with(sign=-1.0, before_own=False, scale=1.0):
    def return_tokens(target, rewards):
        spent = np.cumsum(np.asarray(rewards, dtype=np.float64))
        spent = spent if before_own else np.concatenate([[0.0], spent[:-1]])
        return (target + sign * spent) * scale

    return {"return_tokens": return_tokens}


bookkeeping = Exercise(
    id="09-return-tokens", number=3, what="your return_tokens", names=("return_tokens",), trial=episode_trial,
    run=run_return_tokens, reference={"return_tokens": what_the_agent_feeds},
    forbid=(ttlib_dt.DTAgent.__init__, inspect.unwrap(ttlib_dt.DTAgent.act), ttlib_dt.DTAgent.observe,
            what_the_agent_feeds, _return_tokens_with()["return_tokens"]),
    atol=1e-2, rtol=1e-5, trials=8, hidden_trials=16, passed="you keep the books as the agent does.",
    mistakes=[
        Mistake("each reward is subtracted before its own action: R_0 is the target itself, and r_t arrives only "
                "after action t, so R_{t+1} = R_t - r_t.", _return_tokens_with(before_own=True)),
        Mistake("the rewards are added to the target: what is left to get shrinks as rewards arrive, "
                "R_{t+1} = R_t - r_t.", _return_tokens_with(sign=1.0)),
        Mistake("these are the data's returns-to-go (exercise 1): while acting there are no future rewards to sum. "
                "Start from the target and subtract each reward as it arrives.",
                {"return_tokens": lambda target, rewards: _returns_to_go_with()["returns_to_go"](rewards)}),
        Mistake("the returns are divided by 100: that scaling happens inside the model (embed_return(R / 100)); the "
                "agent keeps its returns-to-go in reward units.", _return_tokens_with(scale=0.01)),
    ],
)

EXERCISES = [rtg, interleaving, bookkeeping]
