"""The Decision Transformer (Chen et al., 2021): act by conditioning on a target return instead of planning.

The Trajectory Transformer models the whole trajectory and *searches* it for a good future. The Decision
Transformer reads the same offline data as a sequence of triples

    (R_0, s_0, a_0, R_1, s_1, a_1, ...),    R_t = r_t + r_{t+1} + ... (the return still to come)

and is trained only to predict a_t from everything before it, up to s_t. Acting needs no search: ask for a
return R_0 (the "target"), read off an action, and after every reward r_t ask for what is left,
R_{t+1} = R_t - r_t. If the data hold good and bad episodes, the return token tells the model which of them to
imitate.

The pieces are small: one linear embedding each for returns, (normalized) states and actions, a learned
embedding of the timestep t added to all three tokens of step t (no other positional embedding), ttlib's
pre-norm blocks with the same causal attention and KV cache as the Trajectory GPT, and a tanh head on the state
tokens' outputs. The loss is the mean squared error of the actions. Training reuses ttlib.training.train's loop.

The context window and the KV cache. The model sees at most K triples (it is trained on windows of K). Acting
for a long episode, the classic DT slides the window: at step t it recomputes the whole last-K window. A cache
cannot simply drop the oldest triple, because in layers 2 and up every cached key and value was computed while
that triple was visible -- dropping it would change them, so the cached result would no longer be the one a
recompute gives. So the window *refills* instead: it grows from `keep` to K triples by appending one new
(a_{t-1}, R_t, s_t) group to the cache per step (3 tokens, not a recompute), and when it is full it restarts from
the last `keep` triples with one fresh pass over them. Every step's context is therefore a contiguous run of
`keep` to K triples, which the model was trained on (the loss covers every position of a window, so every
context length 1..K), and the uncached path, which recomputes that same window at every step, gives the same
actions -- a test checks it. keep = K is the classic sliding window (a fresh pass every step once full); the
default keep = K // 2 pays one fresh pass every K // 2 + 1 steps and otherwise feeds 3 tokens per step.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field, replace

import numpy as np
import torch
from torch import nn

from ttlib.data import trajectories as ttdata
from ttlib.data import validate
from ttlib.errors import ConfigError, MismatchError
from ttlib.evaluation.rollout import EvalResult, play
from ttlib.model.attention import KVCache
from ttlib.model.gpt import Block, TrajectoryGPT, check_dims
from ttlib.training.checkpoint_files import CheckpointError
from ttlib.training.checkpoints import (
    checkpoint_weights,
    dataset_summary,
    default_checkpoint,
    from_fields,
    load_weights,
    pick_device,
    read_checkpoint,
)
from ttlib.training.train import RunConfig, fit, keep_best, load_and_split, start_training

__all__ = ["COURSE_CHECKPOINT", "DTAgent", "DTConfig", "DTTrainConfig", "DTTrainResult", "DecisionTransformer", "KIND",
           "SHIPPED", "Windows", "default_target", "evaluate", "interleave", "load_checkpoint", "returns_to_go",
           "train"]

KIND = "decision-transformer"  # the `kind` of a DT checkpoint (a Trajectory GPT's is "trajectory-gpt")
COURSE_CHECKPOINT = "dt_lunarlander.safetensors"  # the shipped Decision Transformer for the course dataset
SHIPPED = {ttdata.DEFAULT_DATASET: COURSE_CHECKPOINT}  # dataset id -> the Decision Transformer shipped for it


@dataclass
class DTConfig:
    obs_dim: int = 0  # observation dimensions (0 in a training config: the data decide)
    act_dim: int = 0  # action dimensions (0 in a training config: the data decide)
    context: int = 20  # K: the longest context, in (return, state, action) triples
    n_layer: int = 3  # transformer blocks
    n_head: int = 1  # attention heads per block
    n_embd: int = 128  # width of the residual stream
    max_timestep: int = 1000  # rows of the timestep embedding (longer episodes reuse the last row)
    dropout: float = 0.1  # dropout on embeddings and residual branches (training only)
    rtg_scale: float = 100.0  # returns-to-go are divided by this before they are embedded
    action_low: list[float] | None = None  # the action space's bounds, which the tanh head is scaled to;
    action_high: list[float] | None = None  # None: tanh's own [-1, 1] (no scaling at all)

    @property
    def block_size(self) -> int:
        """Longest input in tokens: K triples."""
        return 3 * self.context


def returns_to_go(rewards: np.ndarray) -> np.ndarray:
    """R_t = r_t + r_{t+1} + ... + r_{T-1} (undiscounted, r_t included). (T,) -> (T,) float32."""
    rewards = np.asarray(rewards, dtype=np.float64)
    return np.cumsum(rewards[::-1])[::-1].astype(np.float32)


def interleave(returns: torch.Tensor, states: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
    """Three (B, T, C) token streams -> (B, 3T, C) in the order R_0, s_0, a_0, R_1, s_1, a_1, ..."""
    B, T, C = states.shape
    return torch.stack([returns, states, actions], dim=2).reshape(B, 3 * T, C)  # (B, T, 3, C) -> (B, 3T, C)


class DecisionTransformer(nn.Module):
    def __init__(self, config: DTConfig):
        super().__init__()
        check_dims(config)
        self.config = config
        C = config.n_embd
        self.embed_return = nn.Linear(1, C)
        self.embed_state = nn.Linear(config.obs_dim, C)
        self.embed_action = nn.Linear(config.act_dim, C)
        self.embed_timestep = nn.Embedding(config.max_timestep, C)
        self.embed_ln = nn.LayerNorm(C)
        self.drop = nn.Dropout(config.dropout)
        self.blocks = nn.ModuleList([Block(config) for _ in range(config.n_layer)])  # ttlib.model.gpt's blocks
        self.ln_f = nn.LayerNorm(C)
        self.action_head = nn.Linear(C, config.act_dim)  # then tanh, scaled to [action_low, action_high]
        # Not saved in the state dict: they come from the config, so checkpoints without them load as before.
        low, high = self.action_range()
        self.register_buffer("act_low", torch.tensor(low, dtype=torch.float32), persistent=False)
        self.register_buffer("act_half_span", (torch.tensor(high) - torch.tensor(low)).float() / 2,
                             persistent=False)
        self.register_buffer("obs_mean", torch.zeros(config.obs_dim))  # dataset statistics, saved with the model
        self.register_buffer("obs_std", torch.ones(config.obs_dim))
        T = config.block_size
        self.register_buffer("allowed", torch.tril(torch.ones(T, T, dtype=torch.bool)), persistent=False)
        self.apply(TrajectoryGPT._init_weights)

    optimizer_groups = TrajectoryGPT.optimizer_groups  # the same rule: decay weight matrices, not embeddings

    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def config_dict(self) -> dict:
        return asdict(self.config)

    def action_range(self) -> tuple[list[float], list[float]]:
        """(low, high) of the actions this model produces."""
        c = self.config
        if c.action_low is None or c.action_high is None:
            return [-1.0] * c.act_dim, [1.0] * c.act_dim
        return list(c.action_low), list(c.action_high)

    def set_obs_stats(self, mean, std) -> None:
        self.obs_mean.copy_(torch.as_tensor(mean, dtype=torch.float32))
        self.obs_std.copy_(torch.as_tensor(std, dtype=torch.float32).clamp(min=1e-6))

    def new_cache(self, batch: int) -> KVCache:
        c = self.config
        return KVCache(c.n_layer, batch, c.n_head, c.n_embd // c.n_head, c.block_size,
                       dtype=self.ln_f.weight.dtype, device=self.ln_f.weight.device)

    def embed(self, returns, states, actions, timesteps) -> torch.Tensor:
        """returns (B, T, 1) raw returns-to-go, states (B, T, obs), actions (B, T, act), timesteps (B, T)
        -> tokens (B, 3T, C), interleaved R, s, a, each with its step's timestep embedding."""
        time_emb = self.embed_timestep(timesteps.clamp(0, self.config.max_timestep - 1))  # (B, T, C)
        r = self.embed_return(returns / self.config.rtg_scale) + time_emb
        s = self.embed_state((states - self.obs_mean) / self.obs_std) + time_emb
        a = self.embed_action(actions) + time_emb
        return self.drop(self.embed_ln(interleave(r, s, a)))  # (B, 3T, C)

    def transform(self, x: torch.Tensor, cache: KVCache | None = None) -> torch.Tensor:
        """Tokens (B, T, C) through the blocks; with a cache they continue the tokens it holds. -> (B, T, C)."""
        start, T = (cache.length if cache is not None else 0), x.shape[1]
        if start + T > self.config.block_size:
            raise MismatchError(f"{start + T} tokens exceed the context of {self.config.context} triples")
        allowed = self.allowed[start:start + T, :start + T]  # (T, start+T) causal
        for layer, block in enumerate(self.blocks):
            x = block(x, allowed, cache, layer)
        if cache is not None:
            cache.advance(T)
        return self.ln_f(x)

    def predict(self, h: torch.Tensor) -> torch.Tensor:
        action = torch.tanh(self.action_head(h))  # (..., act_dim) in [-1, 1]
        if self.config.action_low is None:
            return action  # [-1, 1] is the action space: exactly tanh, as the shipped checkpoint was trained
        return self.act_low + (action + 1) * self.act_half_span  # (..., act_dim) in [low, high]

    def forward(self, returns, states, actions, timesteps, mask=None):
        """Training and recompute: windows of T steps -> predicted actions (B, T, act), masked MSE loss.

        The action of step t is read off the output at s_t, which has seen R_0..R_t, s_0..s_t, a_0..a_{t-1}.
        """
        B, T, _ = states.shape
        h = self.transform(self.embed(returns, states, actions, timesteps))  # (B, 3T, C)
        predicted = self.predict(h.view(B, T, 3, -1)[:, :, 1])  # (B, T, act) from the state tokens
        loss = None
        if mask is not None:
            per_step = ((predicted - actions) ** 2).mean(-1)  # (B, T)
            loss = (per_step * mask).sum() / mask.sum().clamp(min=1)
        return predicted, loss


# ---- training data ------------------------------------------------------------------------------------------
class Windows:
    """Windows of K steps of returns-to-go, states, actions and timesteps, drawn at random from whole episodes.

    A window may start at any step; one that runs past its episode's end is zero-padded and masked.
    """

    def __init__(self, data: ttdata.OfflineDataset, context: int):
        self.context = context
        pad = lambda x: np.concatenate([x, np.zeros((context, *x.shape[1:]), x.dtype)])  # noqa: E731
        self.returns = np.concatenate([pad(returns_to_go(r)) for r in data.rewards])[:, None]  # (N, 1)
        self.states = np.concatenate([pad(o) for o in data.observations])  # (N, obs)
        self.actions = np.concatenate([pad(a) for a in data.actions])  # (N, act)
        self.timesteps = np.concatenate([pad(np.arange(len(r))) for r in data.rewards])  # (N,)
        self.real = np.concatenate([pad(np.ones(len(r), np.float32)) for r in data.rewards])  # (N,)
        self.starts = np.flatnonzero(self.real)  # every real step may start a window

    def __len__(self) -> int:
        return len(self.starts)

    def sample(self, batch_size: int, generator: torch.Generator, device="cpu"):
        """-> returns (B, K, 1), states (B, K, obs), actions (B, K, act), timesteps (B, K), mask (B, K)."""
        pick = torch.randint(0, len(self.starts), (batch_size,), generator=generator).numpy()
        index = self.starts[pick][:, None] + np.arange(self.context)[None, :]  # (B, K) rows
        mask = self.real[index]  # (B, K) 0 past the episode's end (the padding between episodes is K long)
        out = (self.returns[index], self.states[index], self.actions[index], self.timesteps[index], mask)
        return tuple(torch.as_tensor(x).to(device) for x in out)


@dataclass
class DTTrainConfig(RunConfig):
    model: DTConfig = field(default_factory=DTConfig)  # the model's shape (its obs/act dims and bounds: the data's)
    batch_size: int = 32  # windows per step
    steps: int = 1000  # optimiser steps in total (a few minutes on a CPU)
    warmup_steps: int = 200  # linear warmup from 0 to lr
    weight_decay: float = 1e-4  # AdamW decay on weight matrices
    grad_clip: float = 0.25  # clip the gradient's global norm to this

    def model_config(self, obs_dim: int, act_dim: int, action_bounds=None) -> DTConfig:
        """The model for this data; action_bounds: (low, high) lists the actions span, None for [-1, 1]
        (validate.action_bounds)."""
        low, high = action_bounds if action_bounds is not None else (None, None)
        return replace(self.model, obs_dim=obs_dim, act_dim=act_dim, action_low=low, action_high=high)


@dataclass
class DTTrainResult:
    model: DecisionTransformer  # with the best evaluation's weights (the checkpoint's model; best_model.BestModel)
    history: list[dict] = field(default_factory=list)  # {"step", "train_loss", "val_loss", "lr", "seconds"}
    tokens_per_second: float = 0.0  # training throughput (tokens processed per second)
    seconds: float = 0.0  # wall-clock training time
    best: dict | None = None  # which evaluation's model was kept (BestModel.summary); None without validation
    last_weights: dict | None = None  # the last step's state dict (on the CPU)


def train(config: DTTrainConfig | None = None, out: str | None = None, resume: str | None = None,
          data: ttdata.OfflineDataset | None = None, progress: bool = True) -> DTTrainResult:
    """Train a Decision Transformer with ttlib.training.train's loop (schedule, clipping, validation, atomic checkpoints
    at every evaluation with the best model and the last state, `resume` from one). Returns the best model."""
    config = config or DTTrainConfig()
    device = pick_device(config.device)
    torch.manual_seed(config.seed)
    data, train_data, val_data = load_and_split(config, data, 0.99, progress)  # (values unused: 0.99, load's default)
    model = DecisionTransformer(config.model_config(data.obs_dim, data.act_dim, validate.action_bounds(data)))
    states = np.concatenate(train_data.observations)  # (N, obs) statistics of the training episodes only
    model.set_obs_stats(states.mean(0), states.std(0))
    model = model.to(device)
    state, _ = start_training(model, config, resume, kind=KIND)

    train_windows, val_windows = Windows(train_data, config.model.context), Windows(val_data, config.model.context)
    t0 = time.perf_counter()
    tokens_per_second = fit(
        model, None, config, state, dataset_summary(data),
        lambda: train_windows.sample(config.batch_size, state.generator, device),
        (lambda: val_windows.sample(config.batch_size, state.val_generator, device)) if len(val_windows) else None,
        out=out, kind=KIND, tokens_per_step=config.batch_size * 3 * config.model.context, progress=progress)
    seconds = time.perf_counter() - t0
    last_weights = keep_best(model, state)
    return DTTrainResult(model, state.history, tokens_per_second, seconds, state.best_summary(), last_weights)


def load_checkpoint(path: str | None = None, device: str = "auto", which: str = "best"):
    """-> (model in eval mode, payload). Without a path: the shipped course checkpoint. which: "best" (the best
    evaluation's model) or "last" (the last step's; see ttlib.training.checkpoints.checkpoint_weights)."""
    path = path or default_checkpoint(COURSE_CHECKPOINT)
    payload = read_checkpoint(path, kind=None)
    if payload.get("kind") != KIND:
        raise CheckpointError(f"{path} holds a {payload.get('kind')!r} model, not a Decision Transformer: "
                              "evaluate it with ttlib.evaluation.rollout.evaluate (`ttlib evaluate --model tt`)")
    model = DecisionTransformer(from_fields(DTConfig, payload["model_config"], "model_config", path))
    load_weights(model, checkpoint_weights(payload, which), source=path)
    return model.to(pick_device(device)).eval(), payload


# ---- acting -------------------------------------------------------------------------------------------------
class DTAgent:
    """Acts in E environments in lockstep, on the KV cache (use_cache=True) or by recomputing the window: an agent
    of ttlib.agents.protocol.Agent, which rollout.play plays.

    Per step: `act(states)` -> actions, then `observe(rewards)` (which lowers every return-to-go by its reward).
    The window holds `keep` to K triples (see the module docstring); both paths use the same window. `start(seeds)`
    begins new episodes, one row each, every row asking for `target_return` again.
    """

    name = "this Decision Transformer"
    clipped = 0  # it reads observations as they are: nothing to clip

    def __init__(self, model: DecisionTransformer, target_return, n_envs: int = 1, use_cache: bool = True,
                 keep: int | None = None):
        c = model.config
        self.model, self.use_cache, self.target_return = model, use_cache, target_return
        self.obs_dim, self.act_dim = c.obs_dim, c.act_dim
        self.keep = keep if keep is not None else max(1, c.context // 2)
        if not 1 <= self.keep <= c.context:
            raise ConfigError(f"keep must be in [1, context = {c.context}], got {self.keep}")
        self.start(range(n_envs))

    def start(self, seeds) -> None:
        """Forget everything: one new episode per seed, each asking for the target return."""
        n_envs, c, device = len(seeds), self.model.config, self.model.ln_f.weight.device
        self.target = torch.as_tensor(self.target_return, dtype=torch.float32, device=device).expand(n_envs).clone()
        self.t = 0  # steps taken so far
        self.returns = torch.zeros(n_envs, 0, 1, device=device)  # (E, n, 1) the window: R, s, a, t per step
        self.states = torch.zeros(n_envs, 0, c.obs_dim, device=device)  # (E, n, obs)
        self.actions = torch.zeros(n_envs, 0, c.act_dim, device=device)  # (E, n, act)
        self.timesteps = torch.zeros(n_envs, 0, dtype=torch.long, device=device)  # (E, n)
        self.cache = None
        self.passes = {"fresh": 0, "cached": 0}  # forward passes over a whole window / over 3 new tokens

    def action_range(self) -> tuple[list[float], list[float]]:
        return self.model.action_range()

    @torch.no_grad()
    def act(self, states) -> np.ndarray:
        """states (E, obs) of the current step -> actions (E, act)."""
        model = self.model
        E = self.target.shape[0]
        s = torch.as_tensor(np.asarray(states), dtype=torch.float32, device=self.target.device).view(E, 1, -1)
        t = torch.full((E, 1), self.t, dtype=torch.long, device=s.device)
        no_action = torch.zeros(E, 1, model.config.act_dim, device=s.device)  # a_t is what we are about to choose
        self.returns = torch.cat([self.returns, self.target.view(E, 1, 1)], 1)
        self.states, self.timesteps = torch.cat([self.states, s], 1), torch.cat([self.timesteps, t], 1)
        self.actions = torch.cat([self.actions, no_action], 1)
        window = self.states.shape[1]
        if window > model.config.context:  # full: restart from the last `keep` triples
            self.returns, self.states, self.actions, self.timesteps = (
                x[:, -self.keep:] for x in (self.returns, self.states, self.actions, self.timesteps))
            self.cache = None
        if self.use_cache and self.cache is not None:  # 3 new tokens: a_{t-1}, R_t, s_t
            tokens = model.embed(self.returns[:, -2:], self.states[:, -2:], self.actions[:, -2:],
                                 self.timesteps[:, -2:])[:, 2:5]  # (E, 3, C)
            h = model.transform(tokens, self.cache)[:, -1]  # (E, C) the output at s_t
            self.passes["cached"] += 1
        else:  # a fresh pass over the window, without its last (unknown) action
            self.cache = model.new_cache(E) if self.use_cache else None
            tokens = model.embed(self.returns, self.states, self.actions, self.timesteps)[:, :-1]  # (E, 3n-1, C)
            h = model.transform(tokens, self.cache)[:, -1]
            self.passes["fresh"] += 1
        action = model.predict(h)  # (E, act)
        self.actions[:, -1] = action
        self.t += 1
        return action.cpu().numpy()

    def observe(self, rewards, actions=None) -> None:
        """Rewards (E,) of the step just taken: what is left to get is R_{t+1} = R_t - r_t. (The actions the
        environments took are its own, already in its window.)"""
        self.target -= torch.as_tensor(np.asarray(rewards), dtype=torch.float32, device=self.target.device)

    def keep_rows(self, rows) -> None:
        """Continue with environments `rows` only (the others finished their episodes)."""
        rows = torch.as_tensor(rows, dtype=torch.long, device=self.target.device)
        self.target = self.target[rows]
        self.returns, self.states, self.actions, self.timesteps = (
            x[rows] for x in (self.returns, self.states, self.actions, self.timesteps))
        if self.cache is not None:
            self.cache.reorder(rows)

    def decision(self, row: int) -> None:
        return None  # an action, nothing more to show


def evaluate(model: DecisionTransformer, env_id: str, seeds, target_return: float, env_kwargs: dict | None = None,
             vectorized: bool = True, n_envs: int | None = None, max_steps: int | None = None,
             use_cache: bool = True, keep: int | None = None, record: bool = False,
             progress: bool = True) -> EvalResult:
    """Play one episode per seed, conditioned on `target_return` (rollout.play with a `DTAgent`); the same
    EvalResult as ttlib.evaluation.rollout.evaluate.

    vectorized=True steps up to `n_envs` (default: all seeds) environments together in a gymnasium.vector env and
    acts for all running ones in one batched call; False plays the episodes one after another.
    """
    agent = DTAgent(model, target_return, use_cache=use_cache, keep=keep)
    return play(agent, env_id, seeds, env_kwargs, vectorized, n_envs, max_steps=max_steps, record=record,
                progress=progress)


def default_target(info: dict) -> float:
    """The return to ask for when none is given: the dataset's expert reference score (its best behaviour)."""
    if info.get("ref_max_score") is not None:
        return float(info["ref_max_score"])
    raise ConfigError("this checkpoint's dataset has no reference scores: give a target return")
