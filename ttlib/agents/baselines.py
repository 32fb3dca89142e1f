"""The baselines every offline-RL agent is shown beside: behaviour cloning, %BC, and IQL's own policy.

An offline-RL researcher's first question about a new agent is whether it beats copying the data. Three answers,
each a small MLP from observation to action, trained in seconds and played by the same rollout code, on the same
seeds, as the Trajectory Transformer and the Decision Transformer:

    BC       regress the data's actions on its observations:  min E_(s,a)~D |pi(s) - a|^2
    %BC      the same on the best k% of episodes by return (Chen et al., 2021; Emmons et al., 2021, "RvS")
    IQL-AWR  the same, every transition weighted by exp(beta * (Q(s, a) - V(s))), capped: advantage-weighted
             regression on the course's critic (ttlib.agents.critic), the policy IQL extracts (Kostrikov et al., 2021)

BC copies the average pilot; %BC copies the best ones, and so can never beat the best episodes it keeps by much;
AWR prefers, state by state, the data's actions the critic values above the state's value -- it can stitch the
good parts of different episodes together, as a planner ranking with the same critic can.
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass

import numpy as np
import torch
import torch.nn as nn
from tqdm.auto import tqdm

from ttlib.data import trajectories as ttdata
from ttlib.data import validate
from ttlib.errors import TTLibError

__all__ = ["BaselineError", "COURSE_BASELINE", "KINDS", "MLPPolicy", "POLICY_KIND", "PolicyConfig", "awr_weights",
           "best_episodes", "course_baseline", "critic_for", "evaluate", "fit_policy", "load_policy", "save_policy",
           "train_policy", "trained_policy"]

KINDS = ("bc", "iql")  # --model names: behaviour cloning (all or the best k% of episodes), IQL's AWR policy
POLICY_KIND = "policy"  # a checkpoint's kind
COURSE_BASELINE = "pbc_lunarlander.safetensors"  # shipped: %BC on the best 25% of the course dataset (docs/DATASETS.md)


class BaselineError(TTLibError, ValueError):
    """A baseline that cannot be trained or played as asked."""


@dataclass
class PolicyConfig:
    kind: str = "bc"  # "bc": regress the actions (of the best top_percent of episodes); "iql": weighted by AWR
    top_percent: float = 100.0  # percent of episodes, the highest returns first, to learn from (100: all of them)
    steps: int = 3000  # Adam steps
    batch_size: int = 256  # transitions per step
    learning_rate: float = 1e-3  # Adam's
    hidden: int = 256  # width of the hidden layers
    layers: int = 3  # hidden layers
    seed: int = 0  # initial weights and batch order
    beta: float = 1.0  # iql: inverse temperature of the advantage weights: the best of 1, 3 (IQL's locomotion
    #                    setting) and 10 on the course dataset (docs/RESULTS.md), where 3 gives random flights' actions
    #                    a third of the weight
    max_weight: float = 100.0  # iql: weights capped here, so a few transitions cannot take over

    def validate(self) -> None:
        if self.kind not in KINDS:
            raise BaselineError(f"kind must be one of {', '.join(KINDS)}, got {self.kind!r}")
        if not 0 < self.top_percent <= 100:
            raise BaselineError(f"top_percent must be a percentage in (0, 100], got {self.top_percent}")
        for name in ("steps", "batch_size", "hidden", "layers"):
            if getattr(self, name) < 1:
                raise BaselineError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.learning_rate <= 0 or self.beta < 0 or self.max_weight <= 0:
            raise BaselineError("learning_rate and max_weight must be > 0 and beta >= 0, got "
                                f"{self.learning_rate}, {self.max_weight}, {self.beta}")

    @property
    def name(self) -> str:
        """"BC", "%BC (best 25%)", "IQL-AWR" -- how results tables name it."""
        if self.kind == "iql":
            return "IQL-AWR" + (f" (best {self.top_percent:g}%)" if self.top_percent < 100 else "")
        return "BC" if self.top_percent >= 100 else f"%BC (best {self.top_percent:g}%)"


class MLPPolicy(nn.Module):
    """obs -> action: observations standardised with the data's statistics, `layers` ReLU layers, and a tanh
    scaled to the action space's bounds, so every action it gives is one the environment takes as it is.

    An agent (ttlib.agents.protocol.Agent) without memory: rollout.play plays it, and what it is told of each step
    it does not need."""

    name = "this policy"
    clipped = 0  # it reads observations as they are: nothing to clip

    def __init__(self, obs_dim: int, act_dim: int, hidden: int = 256, layers: int = 3, action_low=None,
                 action_high=None):
        super().__init__()
        self.obs_dim, self.act_dim, self.hidden, self.layers = obs_dim, act_dim, hidden, layers
        sizes = [obs_dim] + [hidden] * layers
        body = [part for n_in, n_out in zip(sizes, sizes[1:], strict=False)
                for part in (nn.Linear(n_in, n_out), nn.ReLU())]
        self.net = nn.Sequential(*body, nn.Linear(sizes[-1], act_dim))
        low = torch.as_tensor(action_low if action_low is not None else [-1.0] * act_dim, dtype=torch.float32)
        high = torch.as_tensor(action_high if action_high is not None else [1.0] * act_dim, dtype=torch.float32)
        self.register_buffer("obs_mean", torch.zeros(obs_dim))
        self.register_buffer("obs_std", torch.ones(obs_dim))
        self.register_buffer("action_mid", (high + low) / 2)
        self.register_buffer("action_half", (high - low) / 2)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        """(B, obs_dim) -> (B, act_dim) actions within the bounds."""
        x = (obs - self.obs_mean) / self.obs_std  # (B, obs_dim)
        return self.action_mid + self.action_half * torch.tanh(self.net(x))  # (B, act_dim)

    @torch.no_grad()
    def act(self, observations) -> np.ndarray:
        """Numpy in, numpy out: (E, obs_dim) -> (E, act_dim) float32."""
        obs = torch.as_tensor(np.asarray(observations), dtype=self.obs_mean.dtype, device=self.obs_mean.device)
        return self(obs).float().cpu().numpy()

    def action_range(self) -> tuple[list[float], list[float]]:
        return (self.action_mid - self.action_half).tolist(), (self.action_mid + self.action_half).tolist()

    def start(self, seeds) -> None:  # the rest of the agent protocol: a policy remembers nothing
        pass

    def observe(self, rewards, actions) -> None:
        pass

    def keep_rows(self, rows) -> None:
        pass

    def decision(self, row: int) -> None:
        return None


# ---- the pieces notebook 00's learner rebuilds ------------------------------------------------------------
def best_episodes(returns, percent: float) -> np.ndarray:
    """The indices, in increasing order, of the ceil(percent / 100 * n) episodes with the highest undiscounted
    returns (at least one): %BC's data. Ties are broken towards the earlier episode."""
    returns = np.asarray(returns, dtype=np.float64)  # (n,)
    if not 0 < percent <= 100:
        raise BaselineError(f"percent must be in (0, 100], got {percent}")
    keep = max(1, math.ceil(percent / 100 * len(returns) - 1e-9))  # 1e-9: 25% of 100 is 25, not 26 by rounding
    order = np.argsort(-returns, kind="stable")  # highest first; equal returns keep their order
    return np.sort(order[:keep])


def fit_policy(policy: nn.Module, observations: torch.Tensor, actions: torch.Tensor, steps: int, batch_size: int,
               learning_rate: float, generator: torch.Generator, weights: torch.Tensor | None = None,
               bar=None) -> list[float]:
    """Behaviour cloning: `steps` Adam steps on the mean squared error between policy(observations[i]) and
    actions[i], every step on `batch_size` indices i drawn uniformly (torch.randint with `generator`). With
    `weights` (N,), each transition's squared error is multiplied by its weight (AWR). -> the loss of every step."""
    optimizer = torch.optim.Adam(policy.parameters(), lr=learning_rate)
    losses = []
    for _ in range(steps):
        i = torch.randint(0, len(observations), (batch_size,), generator=generator)  # (B,)
        error = ((policy(observations[i]) - actions[i]) ** 2).mean(dim=1)  # (B,) per transition
        loss = (error * weights[i]).mean() if weights is not None else error.mean()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
        if bar is not None:
            bar.update(1)
    return losses


# ---- training -------------------------------------------------------------------------------------------
def awr_weights(critic, observations: torch.Tensor, actions: torch.Tensor, beta: float, max_weight: float,
                chunk: int = 65536) -> torch.Tensor:
    """(N,) exp(beta * (Q(s, a) - V(s))) capped at max_weight: how much AWR copies each of the data's actions."""
    parts = []
    with torch.no_grad():
        for start in range(0, len(observations), chunk):
            s, a = observations[start:start + chunk], actions[start:start + chunk]
            advantage = critic.q(s, a) - critic.v(s)  # (n,)
            parts.append(torch.exp(beta * advantage).clamp(max=max_weight))
    return torch.cat(parts)


def _chosen_transitions(data: ttdata.OfflineDataset, percent: float) -> ttdata.OfflineDataset:
    from ttlib.data.trajectories import subset

    return subset(data, best_episodes(data.returns(), percent))


def train_policy(data: ttdata.OfflineDataset, config: PolicyConfig | None = None, critic=None,
                 progress: bool = True) -> tuple[MLPPolicy, dict]:
    """Fit a baseline policy to a dataset -> (policy in eval mode, on the CPU; its history: losses, seconds,
    episodes and transitions it learnt from). kind "iql" needs `critic` (a ttlib.agents.critic.Critic of the data)."""
    config = config or PolicyConfig()
    config.validate()
    validate.check_finite(data)
    if config.kind == "iql" and critic is None:
        raise BaselineError("IQL's policy is extracted from a critic: train one with `ttlib train-critic`, or pass "
                            "the checkpoint that holds one")
    if critic is not None and (critic.obs_dim, critic.act_dim) != (data.obs_dim, data.act_dim):
        raise BaselineError(f"the critic is for obs {critic.obs_dim} / act {critic.act_dim}, the dataset "
                            f"{data.dataset_id} has obs {data.obs_dim} / act {data.act_dim}")
    bounds = validate.action_bounds(data) or (None, None)
    chosen = _chosen_transitions(data, config.top_percent)
    obs = torch.as_tensor(np.concatenate(chosen.observations), dtype=torch.float32)  # (N, obs_dim)
    act = torch.as_tensor(np.concatenate(chosen.actions), dtype=torch.float32)  # (N, act_dim)
    torch.manual_seed(config.seed)
    policy = MLPPolicy(data.obs_dim, data.act_dim, config.hidden, config.layers, *bounds)
    policy.obs_mean.copy_(obs.mean(0))
    policy.obs_std.copy_(obs.std(0) + 1e-6)
    weights = None
    if config.kind == "iql":
        weights = awr_weights(critic.cpu().float(), obs, act, config.beta, config.max_weight)
    generator = torch.Generator().manual_seed(config.seed)
    start = time.perf_counter()
    with tqdm(total=config.steps, desc=config.name, disable=not progress, mininterval=1.0) as bar:
        losses = fit_policy(policy, obs, act, config.steps, config.batch_size, config.learning_rate, generator,
                            weights, bar)
    if not np.isfinite(losses[-1]):
        raise BaselineError(f"{config.name}'s training diverged (non-finite loss); lower its learning rate")
    history = {"losses": losses[::100] + [losses[-1]], "seconds": time.perf_counter() - start,
               "episodes": chosen.n_episodes, "transitions": len(obs),
               "lowest_return_kept": float(chosen.returns().min())}
    return policy.eval(), history


def trained_policy(config: PolicyConfig, dataset_id: str | None = None, critic: str | None = None,
                   progress: bool = True):
    """-> (policy, config, the dataset's summary, history): a baseline trained now with `config`, as `ttlib train
    --model bc|iql` and `ttlib evaluate --model bc|iql` (without a checkpoint) ask, on `dataset_id` (default: the
    course dataset). `critic`: a checkpoint holding the critic IQL's policy is extracted from (default: the critic
    shipped for that dataset, critic_for)."""
    from ttlib.training.checkpoints import dataset_summary

    dataset_id = dataset_id or ttdata.DEFAULT_DATASET
    config.validate()
    extractor = critic_for(critic, dataset_id) if config.kind == "iql" else None  # before the data: fails fast
    data = ttdata.load(dataset_id, progress=progress)
    policy, history = train_policy(data, config, critic=extractor, progress=progress)
    return policy, config, dataset_summary(data), history


def critic_for(path: str | None, dataset_id: str):
    """The critic IQL's policy is extracted from: the one in `path`, or the one shipped for this data."""
    from ttlib.agents.critic import load_critic
    from ttlib.training.checkpoints import SHIPPED_TT, default_checkpoint, read_checkpoint

    if path is None:
        if dataset_id not in SHIPPED_TT:
            raise BaselineError(f"--model iql on {dataset_id}: give --critic CKPT, a checkpoint with a critic "
                                "of that dataset (`ttlib train --dataset ... --out CKPT` then `ttlib train-critic "
                                f"--checkpoint CKPT`); critics are shipped for {', '.join(SHIPPED_TT)} only")
        path = default_checkpoint(SHIPPED_TT[dataset_id])
    payload = read_checkpoint(path, kind=None)
    if payload["dataset"]["id"] != dataset_id:
        raise BaselineError(f"the critic in {path} was trained on {payload['dataset']['id']}, not {dataset_id}")
    critic = load_critic(path, device="cpu", payload=payload)
    if critic is None:
        raise BaselineError(f"{path} holds no critic: add one with `ttlib train-critic --checkpoint {path}`")
    return critic


# ---- playing ---------------------------------------------------------------------------------------------
def evaluate(policy: MLPPolicy, env_id: str, seeds, env_kwargs: dict | None = None, vectorized: bool = True,
             n_envs: int | None = None, max_steps: int | None = None, record: bool = False, progress: bool = True):
    """Play one episode per seed with the policy (rollout.play); the same EvalResult, episodes and seeds as
    rollout.evaluate."""
    from ttlib.evaluation.rollout import play

    return play(policy, env_id, seeds, env_kwargs, vectorized, n_envs, max_steps=max_steps, record=record,
                progress=progress)


# ---- checkpoints -----------------------------------------------------------------------------------------
def save_policy(path: str, policy: MLPPolicy, config: PolicyConfig, dataset: dict, history: dict) -> None:
    """One file, written atomically, in ttlib's checkpoint format (kind "policy")."""
    from ttlib.training.checkpoint_files import CHECKPOINT_FORMAT, write_payload

    payload = {"format": CHECKPOINT_FORMAT, "kind": POLICY_KIND, "policy_config": asdict(config),
               "shape": {"obs_dim": policy.obs_dim, "act_dim": policy.act_dim, "hidden": policy.hidden,
                         "layers": policy.layers},
               "model": {k: v.detach().cpu() for k, v in policy.state_dict().items()}, "dataset": dataset,
               "history": history}
    write_payload(path, payload)


def load_policy(path: str) -> tuple[MLPPolicy, PolicyConfig, dict]:
    """-> (policy in eval mode on the CPU, its config, the checkpoint's payload); CheckpointError if it is not one."""
    from ttlib.training.checkpoints import from_fields, load_weights, read_checkpoint

    payload = read_checkpoint(path, kind=POLICY_KIND)
    policy = from_fields(MLPPolicy, payload["shape"], "shape", path)
    load_weights(policy, payload["model"], source=path)
    return policy.eval(), from_fields(PolicyConfig, payload["policy_config"], "policy_config", path), payload


def course_baseline(seeds, max_steps: int | None = None, progress: bool = False, record: bool = False):
    """The shipped %BC (best 25% of the course dataset, `ttlib train --model bc --top-percent 25`) played on
    `seeds` in the course dataset's environment: the baseline the notebooks' result plots draw beside their agents
    (`viz.baseline_line`), measured on the plot's own seeds. A second or two for 60 episodes. record: keep the
    first episode's rgb frames (`.frames`), to watch it beside an agent on the same seed."""
    from ttlib.training.checkpoints import default_checkpoint

    policy, _, payload = load_policy(default_checkpoint(COURSE_BASELINE))
    info = payload["dataset"]
    return evaluate(policy, info["env_id"], seeds, info["env_kwargs"], max_steps=max_steps, record=record,
                    progress=progress)
