"""What an agent is to the episode loop: the few things `ttlib.evaluation.rollout.play` asks of every agent.

The loop steps E environments together and keeps one *row* per environment still playing, in the order of its
seeds. Per step it hands the agent the running rows' observations and takes one action each (`act`), steps the
environments, and tells the agent what came of it (`observe`); when episodes end it drops their rows
(`keep_rows`), so that every call sees exactly the rows still playing. An agent that needs no memory (a policy
from observation to action) makes `start`, `observe` and `keep_rows` do nothing.

Before a step is taken the loop checks the environment against the agent (`rollout.check_spaces`): continuous
(Box) actions, the agent's observation and action sizes, and -- for an agent that knows them -- its action bounds.

A class implements the protocol by having these members; it does not inherit from anything (`isinstance(x, Agent)`
checks that the members are there). The Trajectory Transformer's planner (`rollout.PlannerAgent`), the Decision
Transformer (`dt.DTAgent`) and the baselines' policy (`baselines.MLPPolicy`) do. `Loaded` is what the registry
(`ttlib.agents.registry`) gives back: an agent ready to play, with what a report says about it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

import numpy as np

__all__ = ["Agent", "Loaded"]


@runtime_checkable
class Agent(Protocol):
    name: str  # how messages name it: "the Trajectory Transformer", "this Decision Transformer", "this policy"
    obs_dim: int  # observation entries it reads
    act_dim: int  # action entries it gives
    clipped: int  # observation entries it had to clip to a range it knows, so far (0 for an agent that never clips)

    def action_range(self) -> tuple[list[float], list[float]] | None:
        """(low, high) of the actions it gives, checked against the environment's; None: any Box of act_dim."""

    def start(self, seeds: list[int]) -> None:
        """New episodes begin, one row per seed, in this order; whatever the agent remembered is forgotten."""

    def act(self, observations: np.ndarray) -> np.ndarray:
        """(n, obs_dim) observations of the running rows -> (n, act_dim) actions."""

    def observe(self, rewards: np.ndarray, actions: np.ndarray) -> None:
        """The step just taken: the rewards (n,) the running rows got for the actions (n, act_dim) the environments
        took (the agent's own, clipped to the action space)."""

    def keep_rows(self, rows: np.ndarray) -> None:
        """Continue with rows `rows` (indices into the running rows, increasing) only: the others' episodes ended."""

    def decision(self, row: int):
        """What the agent can show of its last decision for `row` (the planner: its Plan), or None."""


@dataclass
class Loaded:
    """An agent the registry loaded, and what `ttlib evaluate` says about it."""
    agent: Agent  # ready to play (rollout.play)
    dataset: dict  # the summary of the dataset it learned from (checkpoints.dataset_summary): env_id, returns, scores
    title: str  # how the first line of a report names it: "the best model, step 500", "BC (trained now in 3 s ...)"
    report: dict = field(default_factory=dict)  # what a JSON report says of it beside the returns
    notes: list[str] = field(default_factory=list)  # lines a report prints after its result
    training_seconds: float | None = None  # how long its training took (None: not recorded)
