"""A Q critic learned by temporal differences (implicit Q-learning, IQL), for the planner to score actions with.

Why: the Trajectory Transformer's value token is trained on the discounted return of the episode it came from. On
mixed data that return says mostly *who* flew the episode, and the model reads the pilot off the action: the
value then ranks actions by how expert they look, not by what they do (notebook 06, section 2). A critic
trained by temporal differences values an action by its reward and the value of the state it leads to, whoever
took it:

    Q(s, a) <- r + gamma * (1 - done) * V(s')          (regression, squared error)
    V(s)    <- expectile_tau of Q(s, a) over the data's actions at s   (tau = 0.5: their mean; tau -> 1: the best)

V never asks for an action the data does not hold, so Q is only trusted where the data has actions: which is
why the planner still samples actions from the Trajectory Transformer, and the critic only ranks them.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import asdict, dataclass

import numpy as np
import torch
import torch.nn as nn

from ttlib.data import trajectories as ttdata
from ttlib.data.trajectories import split_episodes, subset
from ttlib.errors import TTLibError
from ttlib.training.checkpoint_files import CheckpointError, write_payload
from ttlib.training.checkpoints import load_weights, pick_device, read_checkpoint

__all__ = ["Critic", "CriticConfig", "CriticError", "CriticMember", "add_critic", "critic_from_payload",
           "critic_payload", "expectile_loss", "held_out", "load_critic", "mlp", "q_loss", "td_loss", "td_target",
           "train_critic", "train_member", "transitions", "value_loss"]


class CriticError(TTLibError, ValueError):
    """A critic that cannot be used with this model or data."""


@dataclass
class CriticConfig:
    expectile: float = 0.5  # tau of V's expectile regression: 0.5 values the data's mean action, near 1 its best
    gamma: float = 0.99  # discount of the temporal-difference target
    steps: int = 30_000  # gradient steps of every member
    batch_size: int = 256  # transitions per step
    learning_rate: float = 3e-4  # Adam, for Q and V alike
    hidden: int = 256  # width of the two hidden layers of every network
    target_rate: float = 0.005  # how fast the target Q networks follow the trained ones (Polyak averaging)
    seed: int = 0  # initialisation and batch sampling
    cosine: bool = True  # decay both learning rates to 0 along a cosine
    members: int = 3  # critics trained from seeds seed, seed+1, ...; the planner uses their mean
    val_fraction: float = 0.0  # share of episodes held out to measure a TD loss on (0: learn from all of them)

    def validate(self) -> None:
        if not 0 < self.expectile < 1:
            raise CriticError(f"expectile must be in (0, 1), got {self.expectile}")
        if not 0 < self.gamma <= 1:
            raise CriticError(f"gamma must be in (0, 1], got {self.gamma}")
        for name in ("steps", "batch_size", "hidden", "members"):
            if getattr(self, name) < 1:
                raise CriticError(f"{name} must be >= 1, got {getattr(self, name)}")
        if not 0 < self.target_rate <= 1:
            raise CriticError(f"target_rate must be in (0, 1], got {self.target_rate}")
        if not 0 <= self.val_fraction < 1:
            raise CriticError(f"val_fraction must be in [0, 1), got {self.val_fraction}")


def mlp(n_in: int, hidden: int) -> nn.Sequential:
    return nn.Sequential(nn.Linear(n_in, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(),
                         nn.Linear(hidden, 1))


class CriticMember(nn.Module):
    """Two Q networks (the smaller of the two is the estimate: one network's lucky overestimates do not count)
    and a V network, on observations standardised with the data's mean and standard deviation."""

    def __init__(self, obs_dim: int, act_dim: int, hidden: int = 256):
        super().__init__()
        self.obs_dim, self.act_dim = obs_dim, act_dim
        self.q1, self.q2 = mlp(obs_dim + act_dim, hidden), mlp(obs_dim + act_dim, hidden)
        self.v_net = mlp(obs_dim, hidden)
        self.register_buffer("obs_mean", torch.zeros(obs_dim))
        self.register_buffer("obs_std", torch.ones(obs_dim))

    def q_pair(self, obs: torch.Tensor, act: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """obs (B, obs_dim), act (B, act_dim) -> both Q estimates, (B,) each."""
        x = torch.cat([(obs - self.obs_mean) / self.obs_std, act], dim=-1)  # (B, obs_dim + act_dim)
        return self.q1(x)[:, 0], self.q2(x)[:, 0]

    def q(self, obs: torch.Tensor, act: torch.Tensor) -> torch.Tensor:
        """(B,) the value of taking `act` in `obs` and flying on as the best of the data does."""
        return torch.minimum(*self.q_pair(obs, act))

    def v(self, obs: torch.Tensor) -> torch.Tensor:
        """(B,) the value of `obs`."""
        return self.v_net((obs - self.obs_mean) / self.obs_std)[:, 0]


class Critic(nn.Module):
    """`members` critics trained alike from different random seeds; Q and V are their mean. One critic's
    ranking of nearly equal actions depends on its seed (on this course's data, one seed in three made a
    planner that crashed in a tenth of its episodes); the mean of three ranked well in every trial."""

    def __init__(self, obs_dim: int, act_dim: int, hidden: int = 256, members: int = 1):
        super().__init__()
        self.obs_dim, self.act_dim, self.hidden = obs_dim, act_dim, hidden
        self.members = nn.ModuleList(CriticMember(obs_dim, act_dim, hidden) for _ in range(members))

    def q(self, obs: torch.Tensor, act: torch.Tensor) -> torch.Tensor:
        """(B,) the value of taking `act` in `obs` and flying on as the best of the data does."""
        return torch.stack([member.q(obs, act) for member in self.members]).mean(dim=0)

    def v(self, obs: torch.Tensor) -> torch.Tensor:
        """(B,) the value of `obs`."""
        return torch.stack([member.v(obs) for member in self.members]).mean(dim=0)


def expectile_loss(diff: torch.Tensor, tau: float) -> torch.Tensor:
    """mean |tau - 1[diff < 0]| * diff^2: squared error that weighs positive errors tau, negative ones 1 - tau.
    Minimised over a constant c, with diff = x - c, it gives the tau-expectile of x (tau = 0.5: the mean)."""
    weight = torch.abs(tau - (diff < 0).to(diff.dtype))
    return (weight * diff**2).mean()


def td_target(critic: CriticMember, batch: dict, gamma: float) -> torch.Tensor:
    """(B,) r + gamma * (1 - done) * V(s'): what both Q networks regress on. Computed without gradient: V learns
    from its own loss only, never from being a target."""
    with torch.no_grad():
        return batch["reward"] + gamma * (1 - batch["done"]) * critic.v(batch["next_obs"])  # (B,)


def value_loss(critic: CriticMember, target: CriticMember, batch: dict, tau: float) -> torch.Tensor:
    """V's loss: the expectile regression of V(s) on the target networks' Q(s, a) (the smaller of their two)."""
    with torch.no_grad():
        q = target.q(batch["obs"], batch["act"])  # (B,)
    return expectile_loss(q - critic.v(batch["obs"]), tau)


def q_loss(critic: CriticMember, batch: dict, gamma: float) -> torch.Tensor:
    """Both Q networks' loss: each one's mean squared error against the TD target, the two added."""
    y = td_target(critic, batch, gamma)  # (B,)
    q1, q2 = critic.q_pair(batch["obs"], batch["act"])  # (B,) each
    return ((q1 - y) ** 2).mean() + ((q2 - y) ** 2).mean()


def transitions(data: ttdata.OfflineDataset) -> dict[str, torch.Tensor]:
    """Every (s, a, r, s', done) of the dataset as float32 tensors. The last step of an episode cut short by a
    time limit has no next observation in the data (Minari's final one is dropped), so it is left out."""
    parts = {"obs": [], "act": [], "reward": [], "next_obs": [], "done": []}
    for obs, act, reward, term in zip(data.observations, data.actions, data.rewards, data.terminations, strict=True):
        T = len(reward)
        n = T if term[-1] else T - 1  # steps whose next observation is known (or not needed)
        next_obs = np.concatenate([obs[1:T], obs[T - 1:T]])  # (T, obs_dim); the last row only used if done
        done = np.zeros(T, np.float32)
        done[T - 1] = float(term[-1])
        for key, value in zip(parts, (obs, act, reward, next_obs, done), strict=True):
            parts[key].append(value[:n])
    return {key: torch.as_tensor(np.concatenate(value), dtype=torch.float32) for key, value in parts.items()}


def td_loss(critic: CriticMember, batch: dict, gamma: float) -> float:
    """The Q networks' temporal-difference loss on every transition in `batch` (the training loss's formula)."""
    with torch.no_grad():
        return q_loss(critic, batch, gamma).item()


def held_out(data: ttdata.OfflineDataset, config: CriticConfig) -> tuple[ttdata.OfflineDataset, dict | None]:
    """-> (the episodes to learn from, the transitions of the held-out ones or None). The episodes are split as
    the Trajectory GPT's are (ttlib.data.trajectories.split_episodes): with the same seed and share, the same ones."""
    if config.val_fraction == 0:
        return data, None
    train_episodes, val_episodes = split_episodes(data, config.val_fraction, config.seed)
    return subset(data, train_episodes), transitions(subset(data, val_episodes))


def train_critic(data: ttdata.OfflineDataset, config: CriticConfig | None = None, progress: bool = True,
                 device: str = "cpu") -> tuple[Critic, list[dict]]:
    """Fit a Critic (`config.members` of them, one after the other) to the dataset by implicit Q-learning.
    Returns it (eval mode, on the CPU) and its history (every 1000 steps of every member: member, step, v_loss,
    q_loss, seconds since the start; with config.val_fraction, also the TD loss on the held-out episodes'
    transitions, val_td_loss, and on as many of the training ones, train_td_loss).

    The held-out TD loss says whether the critic generalises (compare it with the training one at the same step),
    not which step was best: the values grow as training goes, and their errors with them, so the lowest would
    point at an undertrained critic. The critic of the last step is kept."""
    from tqdm.auto import tqdm

    config = config or CriticConfig()
    config.validate()
    data, validation = held_out(data, config)
    batch = transitions(data)
    if len(batch["obs"]) == 0:
        raise CriticError("the dataset holds no transitions to learn from")
    if config.gamma == 1 and not batch["done"].any():
        raise CriticError("gamma 1 needs episodes that end (a termination): every episode of this dataset is cut "
                          "by a time limit, so undiscounted values would grow without bound; use a gamma below 1")
    batch = {key: value.to(device) for key, value in batch.items()}
    if validation is not None:
        validation = {key: value.to(device) for key, value in validation.items()}
    critic = Critic(data.obs_dim, data.act_dim, config.hidden, config.members)
    history, start = [], time.perf_counter()
    with tqdm(total=config.steps * config.members, desc="critic (IQL)", disable=not progress,
              mininterval=1.0) as bar:
        for index in range(config.members):
            member = train_member(batch, config, index, device, history, bar, validation)
            critic.members[index].load_state_dict(member.state_dict())
    history[-1]["seconds"] = time.perf_counter() - start
    if not np.isfinite([history[-1]["v_loss"], history[-1]["q_loss"]]).all():
        raise CriticError("the critic's training diverged (non-finite loss); lower its learning rate")
    return critic.eval(), history


def train_member(batch: dict, config: CriticConfig, index: int, device: str, history: list, bar,
                 validation: dict | None = None, *, losses=None) -> CriticMember:
    """Member `index` of a Critic, trained from seed `config.seed + index` on the transitions in `batch` (in their
    dtype); appends to `history` (with TD losses on `validation` and on as many training transitions, if given),
    advances the progress `bar` by a step per step. `losses`: (value_loss, q_loss) to train with in place of this
    module's (notebook 06 trains with the learner's)."""
    loss_of_v, loss_of_q = losses or (value_loss, q_loss)
    seed = config.seed + index
    torch.manual_seed(seed)
    obs_dim, act_dim = batch["obs"].shape[1], batch["act"].shape[1]
    critic = CriticMember(obs_dim, act_dim, config.hidden).to(batch["obs"].dtype)
    critic.obs_mean.copy_(batch["obs"].mean(0))
    critic.obs_std.copy_(batch["obs"].std(0) + 1e-6)
    target = CriticMember(obs_dim, act_dim, config.hidden).to(batch["obs"].dtype)
    target.load_state_dict(critic.state_dict())
    critic, target = critic.to(device), target.to(device)
    q_params = [*critic.q1.parameters(), *critic.q2.parameters()]
    q_optimizer = torch.optim.Adam(q_params, lr=config.learning_rate)
    v_optimizer = torch.optim.Adam(critic.v_net.parameters(), lr=config.learning_rate)
    generator = torch.Generator(device=device).manual_seed(seed)
    if validation is not None:  # a fixed sample of the training transitions, as many as the held-out ones
        picked = torch.randperm(len(batch["obs"]), generator=torch.Generator().manual_seed(seed))
        picked = picked[:len(validation["obs"])].to(device)
        fitted = {key: value[picked] for key, value in batch.items()}
    schedulers = [torch.optim.lr_scheduler.CosineAnnealingLR(o, config.steps) for o in (q_optimizer, v_optimizer)
                  ] if config.cosine else []
    for step in range(config.steps):
        i = torch.randint(0, len(batch["obs"]), (config.batch_size,), generator=generator, device=device)
        sample = {key: batch[key][i] for key in ("obs", "act", "reward", "next_obs", "done")}

        v_loss = loss_of_v(critic, target, sample, config.expectile)
        v_optimizer.zero_grad(set_to_none=True)
        v_loss.backward()
        v_optimizer.step()

        both_q_loss = loss_of_q(critic, sample, config.gamma)
        q_optimizer.zero_grad(set_to_none=True)
        both_q_loss.backward()
        q_optimizer.step()

        for scheduler in schedulers:
            scheduler.step()
        with torch.no_grad():  # the target networks follow slowly
            for p, p_target in zip(q_params, [*target.q1.parameters(), *target.q2.parameters()], strict=True):
                p_target.lerp_(p, config.target_rate)
        if step % 1000 == 0 or step == config.steps - 1:
            history.append({"member": index, "step": step, "v_loss": v_loss.item(), "q_loss": both_q_loss.item()})
            if validation is not None:
                history[-1].update(val_td_loss=td_loss(critic, validation, config.gamma),
                                   train_td_loss=td_loss(critic, fitted, config.gamma))
                bar.set_postfix(td=f"{history[-1]['train_td_loss']:.2f}", held_out=f"{history[-1]['val_td_loss']:.2f}")
        bar.update(1)
    return critic.cpu()


def critic_payload(critic: Critic, config: CriticConfig | None = None, history: list[dict] | None = None) -> dict:
    """What a checkpoint stores of a critic (beside the Trajectory Transformer it plans with)."""
    return {"obs_dim": critic.obs_dim, "act_dim": critic.act_dim, "hidden": critic.hidden,
            "members": len(critic.members),
            "config": asdict(config) if config is not None else None, "history": history or [],
            "state": {k: v.detach().cpu() for k, v in critic.state_dict().items()}}


def critic_from_payload(payload: dict, obs_dim: int, act_dim: int, source: str = "checkpoint") -> Critic:
    """The Critic a checkpoint (or a Ray bundle) stores, in the dtype it was stored in, checked against the model's
    observation and action sizes."""
    if (payload["obs_dim"], payload["act_dim"]) != (obs_dim, act_dim):
        raise CriticError(f"the critic in {source} is for obs {payload['obs_dim']} / act {payload['act_dim']}, "
                          f"the model for obs {obs_dim} / act {act_dim}")
    dtype = next((v.dtype for v in payload["state"].values() if v.is_floating_point()), torch.float32)
    critic = Critic(obs_dim, act_dim, payload["hidden"], payload["members"]).to(dtype)
    load_weights(critic, payload["state"], source=f"the critic in {source}")
    return critic.eval()


# ---- a critic in a Trajectory Transformer's checkpoint ---------------------------------------------------
def load_critic(path: str, device: str = "auto", payload: dict | None = None):
    """The Q critic a Trajectory Transformer checkpoint carries (`ttlib train-critic`), or None if it has none.
    payload: the checkpoint's, when it has been read already (`load_checkpoint` returns it)."""
    payload = payload if payload is not None else read_checkpoint(path)
    if payload.get("critic") is None:
        return None
    info = payload["dataset"]
    return critic_from_payload(payload["critic"], info["obs_dim"], info["act_dim"], path).to(pick_device(device))


def add_critic(path: str, config=None, out: str | None = None, progress: bool = True, gamma: float | None = None):
    """Train a Q critic (`critic.train_critic`) on the dataset a Trajectory Transformer checkpoint was trained on,
    and write the checkpoint again with it (to `out`, default: in place, atomically). The critic discounts by
    `gamma`; None (the default): as the checkpoint's value targets do (its dataset's gamma), whatever `config`
    says. Where episodes end (a landing, a crash), gamma 1 values the very return the environment scores.
    -> (critic, history)."""
    payload = read_checkpoint(path)
    info = payload["dataset"]
    config = dataclasses.replace(config or CriticConfig(), gamma=info["gamma"] if gamma is None else gamma)
    data = ttdata.load(info["id"], gamma=info["gamma"], progress=progress)
    if (data.obs_dim, data.act_dim) != (info["obs_dim"], info["act_dim"]):
        raise CheckpointError(f"dataset {info['id']} has obs {data.obs_dim} / act {data.act_dim} but {path} was "
                              f"trained for obs {info['obs_dim']} / act {info['act_dim']}")
    critic, history = train_critic(data, config, progress=progress)
    payload["critic"] = critic_payload(critic, config, history)
    write_payload(out or path, payload)
    return critic, history
