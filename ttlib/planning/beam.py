"""Beam-search planning with the Trajectory GPT, batched over environments and run on the KV cache.

The model has learned p(next token | trajectory so far). To act, we let it imagine many futures and keep the
ones it believes pay off best:

    for each of `horizon` steps:
        expand:  every kept beam gets `sample_expand` children
        actions: sample the action tokens (this is where the futures differ)
        reward, value: read the model's distribution for both; score each child by
                 sum_k gamma^k E[r_k] + gamma^(t+1) E[V_t]   (rewards so far + the value of what follows)
                 or, with a critic (`value="critic"`, see `critic.py`), by
                 sum_{k<t} gamma^k E[r_k] + gamma^t Q(s_t, a_t)   (rewards so far + the critic's value of the action)
                 or, imitating (`value="likelihood"`, the paper's imitation mode), by
                 sum_k log p(a_k)   (how likely the model finds the plan's actions: no reward at all);
                 the first two plus `likelihood_weight` * sum_k log p(a_k) when it is set (the critic planner's
                 0.3: the model's likelihood breaks the critic's near-ties)
        select:  keep the best `beam_width` children per environment
        observe: decode the next observation greedily (top-1): the model's most likely outcome

The first action of the best plan is executed and the whole search runs again at the next step. With
`action_mean_beta`, the mean of the first actions of every plan scored at the last step is executed instead, each
weighted by softmax(beta * score): one step ahead (the critic planner) the critic then moves the model's own average
action only as far as its preference asks, where a maximum would pick the proposal it overrates most.

Where the next token's logits come from is one choice, `PlannerConfig.decoder` (`decoders.py` maps each name to
its class): a token decoder this search asks one token at a time -- "readable" (`decoders.CachedDecoder`, the
model's own KV cache: the one to read), "fused" (`fast_decoder.FusedDecoder`, the same numbers with far fewer
operations: the CPU's default) or "recompute" (the whole sequence again for every token, the naive baseline) --
or "static", the whole search, not only the model, with static shapes (`static_decoder`), which a GPU replays as
CUDA graphs (its default in a rollout), and "triton", the same with its step one Triton kernel. All consume the
same random numbers (`search.py`), so the same seed gives the same plan with any of them (exactly in float64; in
float32 rounding may break a near-tie). Random numbers come from a counter-based hash of (environment key, token
counter, beam row): an environment's plan does not depend on which other environments share the batch.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from numbers import Integral, Real
from typing import Literal, get_args

import torch

from ttlib.agents.critic import Critic
from ttlib.errors import ConfigError, MismatchError
from ttlib.model.gpt import TrajectoryGPT
from ttlib.model.tokenizer import TrajectoryTokenizer
from ttlib.planning.decoders import DECODERS, STATIC_SEARCHES, DecoderName, open_decoder, resolve
from ttlib.planning.fast_decoder import BufferPool
from ttlib.planning.search import Plan, best_children, counter_uniform, decode_plan, plan_score, sample_bins
from ttlib.planning.static_decoder import static_plan

__all__ = ["Beams", "Plan", "PlannerConfig", "PlannerConfigError", "RULES", "VALUES", "Value", "beam_plan",
           "best_children", "check_critic", "check_fits", "counter_uniform", "course_planner", "critic_planner",
           "current_states", "decode_plan", "decoded", "imitation_planner", "logits_along", "plan_score",
           "sample_bins", "score_actions", "search_beams", "token_name", "tokens_fed", "weighted_mean"]


Value = Literal["token", "critic", "likelihood"]  # what can score a plan (PlannerConfig.value)
VALUES: tuple[str, ...] = get_args(Value)


class PlannerConfigError(ConfigError):
    """A planner setting that cannot plan: raised when the PlannerConfig is made, so that none exists."""


RULES = {  # PlannerConfig's numbers: field -> (its type, what must hold, said in words)
    "beam_width": (Integral, lambda n: n >= 1, ">= 1"),
    "horizon": (Integral, lambda n: n >= 1, ">= 1"),
    "sample_expand": (Integral, lambda n: n >= 1, ">= 1"),
    "context": (Integral, lambda n: n >= 1, ">= 1"),
    "top_k_action": (Integral, lambda n: n >= 1, ">= 1 or None"),
    "top_p_action": (Real, lambda p: 0 < p <= 1, "in (0, 1] or None"),
    "temperature": (Real, lambda t: t > 0, "> 0"),
    "gamma": (Real, lambda g: 0 < g <= 1, "in (0, 1]"),
    "value_weight": (Real, lambda w: w >= 0, ">= 0"),
    "likelihood_weight": (Real, lambda w: w >= 0, ">= 0"),
    "action_mean_beta": (Real, lambda b: b > 0, "> 0 or None"),
}


@dataclass(frozen=True)
class PlannerConfig:
    beam_width: int = 32  # candidate plans kept per environment after each step
    horizon: int = 5  # transitions imagined ahead
    sample_expand: int = 2  # children sampled from every kept plan at each step
    context: int = 5  # transitions of history the model sees, the current observation's included
    top_k_action: int | None = None  # sample actions among the k likeliest bins only (None: all)
    top_p_action: float | None = None  # ...and among the likeliest bins that hold this much probability (None: all)
    temperature: float = 1.0  # softmax temperature for action sampling
    gamma: float = 0.99  # discount used to score plans
    value_weight: float = 1.0  # weight of the predicted value in a plan's score (0: rewards only)
    likelihood_weight: float = 0.0  # with value "token" or "critic": add this times the log-probability of the
    #                                 plan's actions to its score, preferring what the model finds likely (0: none)
    value: Value = "token"  # what scores a plan: "token" (rewards and the value token), "critic" (a Q critic) or
    #                         "likelihood" (the log-probability of its actions: imitation, for a model of good data)
    action_mean_beta: float | None = None  # act the mean of the first actions of every plan scored at the last
    #                                        step, weighted by softmax(beta * score), not the best plan's (None:
    #                                        the best plan's, which `--action-mean-beta 0` asks for too)
    decoder: DecoderName = "auto"  # where the logits come from (decoders.py): "fused", "readable", "recompute",
    #                                "static", "triton" or "auto" (the fastest measured on the plan's device)
    compile_step: bool = False  # static: fuse the decoding step's small kernels with torch.compile first
    # (Triton on a GPU; a one-time compile of about a minute, measured by gpu-check before it is a default)

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Raise PlannerConfigError for a setting that cannot plan (done when the config is made)."""
        for name, (kind, holds, says) in RULES.items():
            value = getattr(self, name)
            if value is None and name in ("top_k_action", "top_p_action", "action_mean_beta"):  # (None: off)
                continue
            if isinstance(value, bool) or not isinstance(value, kind):
                raise PlannerConfigError(f"{name} must be a {'whole ' * (kind is Integral)}number, got {value!r}")
            if not holds(value):
                raise PlannerConfigError(f"{name} must be {says}, got {value!r}")
        for name, valid in (("value", VALUES), ("decoder", DECODERS)):
            if getattr(self, name) not in valid:
                raise PlannerConfigError(f"{name} must be one of {', '.join(map(repr, valid))}, got "
                                         f"{getattr(self, name)!r}")
        if self.decoder in STATIC_SEARCHES and self.needs_tokens():
            asked = (f"value={self.value!r}" if self.value != "token" else "a likelihood_weight"
                     if self.likelihood_weight else "an action_mean_beta")
            raise PlannerConfigError(f"decoder={self.decoder!r} is the static search, which scores with the value "
                                     f"token alone: plan with decoder='fused' for {asked}")
        if self.compile_step and self.decoder not in ("static", "auto"):
            raise PlannerConfigError(f"compile_step compiles the static search's step: decoder={self.decoder!r} "
                                     "has none (plan with decoder='static')")

    def needs_tokens(self) -> bool:
        """Does the search read the sampled tokens (a critic, the likelihood, the weighted mean), which only a
        token decoder keeps? The static search scores with the value token alone."""
        return self.value != "token" or bool(self.likelihood_weight) or self.action_mean_beta is not None


def check_critic(config: PlannerConfig, critic) -> None:
    """A planner that scores with a critic needs one: say so before any search starts."""
    if config.value == "critic" and critic is None:
        raise ConfigError("this planner scores with a critic (value='critic') but none was given: pass critic=, "
                          "train one with `ttlib train-critic`, or plan with value='token'")


def course_planner(**overrides) -> PlannerConfig:
    """The planner setting used for the course's LunarLander checkpoint (README, notebooks 05-09, `ttlib evaluate`).

    A short context and horizon with top-k action sampling: on this small, briefly trained model a long context
    makes the closed-loop agent copy its own past actions. Keyword arguments override single fields.
    """
    settings = dict(beam_width=32, horizon=3, sample_expand=4, context=1, top_k_action=20)
    settings.update(overrides)
    return PlannerConfig(**settings)


def critic_planner(**overrides) -> PlannerConfig:
    """The course's planner with a Q critic (`critic.py`, notebook 06 section 3): what `ttlib evaluate` plans with
    when the checkpoint carries a critic. The model proposes 128 actions (32 beams x 4, top-k 20) and ranks them
    by Q(s, a) + 0.3 log p(a): the critic's value, and a little of how likely the model finds the action, so that
    of two near-equal values the one the data backs wins (the critic's error grows where the data thin out). One
    step ahead, because the critic already values all that follows, and every further step would judge the model's
    imagined, binned observations instead of the real one."""
    return course_planner(**{"value": "critic", "horizon": 1, "likelihood_weight": 0.3, **overrides})


def imitation_planner(**overrides) -> PlannerConfig:
    """The Trajectory Transformer's imitation mode (the paper's): the model proposes 128 actions, as in the
    critic planner, and the likeliest of them is taken -- no reward, no value. Meant for a model trained on good
    data only (`ttlib train --top-percent 25`), which it then copies as %BC does -- as far as the model's actions
    are accurate: at the course's training budgets they are not yet (docs/RESULTS.md). On mixed data the likeliest
    action is the mixture's (notebook 06, "without search")."""
    return course_planner(**{"value": "likelihood", "horizon": 1, **overrides})


def logits_along(model: TrajectoryGPT, prefix: torch.Tensor, bins: torch.Tensor,
                 decoder: DecoderName = "fused") -> torch.Tensor:
    """What one token decoder ("fused", "readable" or "recompute") computes along given tokens: prefix (E, P), bins
    (E, n) fed after it -> (E, n, N), the logits it gave for each of the n tokens. Fed a plan's own tokens, the
    cached and the recomputing decoder must agree to rounding: "the cache changes nothing" without a search's
    near-ties in the way. The logits are on the model's device (a plan's bins come back on the CPU: they are
    moved there)."""
    device = model.pos_emb.device
    prefix, bins = prefix.to(device), bins.to(device)
    was_training = model.training
    model.eval()
    try:
        with torch.inference_mode():
            along = open_decoder(decoder, model, prefix, 1, bins.shape[1])
            logits = [along.logits]  # (E, N) for the first token
            logits += [along.feed(bins[:, j]) for j in range(bins.shape[1] - 1)]
            along.release()
        return torch.stack(logits, dim=1)
    finally:
        model.train(was_training)


def score_actions(model: TrajectoryGPT, tokenizer: TrajectoryTokenizer, prefix: torch.Tensor, actions,
                  gamma: float = 0.99, decoder: DecoderName = "fused") -> torch.Tensor:
    """What the search thinks of given actions: prefix (E, P) contexts, actions (E, act_dim) real actions ->
    (E,) E[r] + gamma E[V], the score of a one-step plan that takes them (the reward read as `beam_plan` reads it,
    its likeliest bin fed before the value), along the token decoder `decoder`."""
    O, A = tokenizer.obs_dim, tokenizer.act_dim
    device = model.pos_emb.device
    actions = torch.as_tensor(actions).cpu().numpy()
    bins = torch.as_tensor(tokenizer.encode(actions, slice(O, O + A), on_clip="ignore"), device=device)  # (E, A)
    prefix, padding = prefix.to(device), bins.new_zeros(len(bins), 1)
    reward_logits = logits_along(model, prefix, torch.cat([bins, padding], 1), decoder)[:, A]  # (E, N)
    fed = torch.cat([bins, reward_logits.argmax(-1, keepdim=True), padding], 1)
    value_logits = logits_along(model, prefix, fed, decoder)[:, A + 1]  # (E, N)
    reward = tokenizer.expectation(torch.softmax(reward_logits, -1), tokenizer.reward_dim)
    value = tokenizer.expectation(torch.softmax(value_logits, -1), tokenizer.value_dim)
    return (reward + gamma * value).cpu()


def token_name(j: int, obs_dim: int, act_dim: int) -> str:
    """What generated token j of a plan is: 'step 1, action dim 0', 'step 0, reward', 'step 2, observation dim 3'."""
    step, i = divmod(j, act_dim + 2 + obs_dim)  # per step: action, reward, value, next observation
    if i < act_dim:
        return f"step {step}, action dim {i}"
    if i - act_dim < 2:
        return f"step {step}, {('reward', 'value')[i - act_dim]}"
    return f"step {step}, observation dim {i - act_dim - 2} (after it)"


def tokens_fed(obs_dim: int, act_dim: int, horizon: int) -> int:
    """Tokens a plan feeds to the model after the context: actions+reward each step, value+obs between steps."""
    return horizon * (act_dim + 1) + (horizon - 1) * (1 + obs_dim)


def check_fits(model: TrajectoryGPT, context: int, horizon: int) -> None:
    """A context of C transitions plus a horizon of H must fit the model's window: C + H - 1 <= n_transitions."""
    n = model.config.n_transitions
    if context + horizon - 1 > n:
        raise MismatchError(f"context ({context}) + horizon ({horizon}) - 1 = {context + horizon - 1} transitions "
                            f"do not fit the model's window of {n} transitions; lower context or horizon")


def beam_plan(model: TrajectoryGPT, tokenizer: TrajectoryTokenizer, prefix: torch.Tensor, keys: torch.Tensor,
              config: PlannerConfig, buffers: BufferPool | None = None, trace: list | None = None,
              critic: Critic | None = None, observation: torch.Tensor | None = None) -> Plan:
    """Plan for E environments at once.

    prefix (E, P): every environment's context as bins, ending with its current observation (all E the same
    length). keys (E,) int64: one random key per environment and decision (e.g. hash of seed and step).
    buffers: the cache buffers (and the static search, with its CUDA graphs), kept from one call to the next by
    whoever plans again and again (a rollout); None allocates fresh ones (and replays no graphs). The model plans
    in evaluation mode (no dropout); its mode is restored afterwards. trace: a list to which every step appends
    (score (E*W*X,) of its children, keep (E*W,) the rows it kept), on the CPU: the search tree, for
    `viz.plot_beam_tree`. critic: the Q critic that `config.value == "critic"` scores with (on the model's
    device); ignored with `value="token"`. observation (E, obs_dim): the current observations as the environments
    gave them, which the critic scores the first action in (None: the prefix's last observation, decoded).
    config.decoder says where the logits come from; "auto" takes the static search (`static_decoder`), replayed as
    CUDA graphs, on a GPU with buffers kept, and the fused decoder otherwise and for a critic or a trace.
    """
    check_critic(config, critic)
    if trace is not None and config.decoder in STATIC_SEARCHES:
        raise PlannerConfigError(f"decoder={config.decoder!r} runs the whole search with static shapes and keeps no "
                                 "search tree: plan with decoder='fused' to trace it")
    was_training = model.training
    model.eval()
    try:
        return search_beams(model, tokenizer, prefix, keys, config, buffers, trace,
                          critic if config.value == "critic" else None, observation)
    finally:
        model.train(was_training)


def _check_prefix(model: TrajectoryGPT, tokenizer: TrajectoryTokenizer, prefix: torch.Tensor, horizon: int) -> None:
    c = model.config
    O, A, td = c.obs_dim, c.act_dim, c.transition_dim
    if (tokenizer.obs_dim, tokenizer.act_dim) != (O, A):
        raise MismatchError(f"tokenizer is for obs {tokenizer.obs_dim}/act {tokenizer.act_dim} but the model for "
                            f"obs {O}/act {A}")
    if prefix.shape[1] % td != O:
        raise MismatchError(f"the context must be whole transitions followed by one observation ({O} tokens), "
                            f"got {prefix.shape[1]} tokens with transition_dim {td}")
    check_fits(model, prefix.shape[1] // td + 1, horizon)


@dataclass
class Beams:
    """What the search knows of every row (a beam, or a child while sampling)."""
    generated: torch.Tensor  # (rows, n) bins generated so far
    discounted_rewards: torch.Tensor  # (rows,) sum_k gamma^k E[r_k] so far
    rewards: torch.Tensor  # (rows, H) expected reward of every step
    values: torch.Tensor  # (rows, H) expected value after every step
    states: torch.Tensor  # (rows, obs_dim) the observation the next action is taken in (critic only): the real
    #                       one at the first step, the model's decoded one after it
    log_likelihood: torch.Tensor  # (rows,) sum of log p of the action bins sampled so far, under the model

    def rows(self, index: torch.Tensor) -> Beams:
        return Beams(*(getattr(self, f.name)[index] for f in fields(self)))

    def repeat(self, children: int) -> Beams:
        return Beams(*(getattr(self, f.name).repeat_interleave(children, 0) for f in fields(self)))

    def append(self, bins: torch.Tensor) -> None:
        self.generated = torch.cat([self.generated, bins[:, None]], dim=1)


def decoded(tokenizer: TrajectoryTokenizer, bins: torch.Tensor, dims: slice) -> torch.Tensor:
    """bins (rows, n) of the n consecutive dimensions `dims` -> what they decode to (each bin's mean), (rows, n)
    float32, on bins' device: `tokenizer.decode` without leaving torch."""
    means = torch.as_tensor(tokenizer.means[dims], dtype=torch.float32, device=bins.device)  # (n, n_bins)
    return means.gather(1, bins.T).T


def _children_scores(config, tokenizer, beams: Beams, t: int, rewards_before, action_bins: list, critic):
    """Every child's score after step t, as `config.value` asks: the log-likelihood of its actions, its discounted
    rewards and the value token, or the rewards before step t and the critic's Q(s_t, a_t) (which holds r_t); the
    last two plus `config.likelihood_weight` times the log-likelihood."""
    if config.value == "likelihood":
        return beams.log_likelihood.clone()
    if critic is None:
        score = beams.discounted_rewards + config.value_weight * config.gamma ** (t + 1) * beams.values[:, t]
    else:
        O, A = tokenizer.obs_dim, tokenizer.act_dim
        actions = decoded(tokenizer, torch.stack(action_bins, dim=1), slice(O, O + A))  # (rows, A)
        score = rewards_before + config.value_weight * config.gamma**t * critic.q(beams.states, actions)
    return score + config.likelihood_weight * beams.log_likelihood if config.likelihood_weight else score


@torch.inference_mode()
def search_beams(model, tokenizer, prefix, keys, config, buffers, trace=None, critic=None, observation=None) -> Plan:
    """The search itself, without autograd (see beam_plan, which calls it with the model in evaluation mode)."""
    _check_prefix(model, tokenizer, prefix, config.horizon)
    O, A = model.config.obs_dim, model.config.act_dim
    E, H, W, X = prefix.shape[0], config.horizon, config.beam_width, config.sample_expand
    device = model.pos_emb.device
    prefix, keys = prefix.to(device), keys.to(device=device, dtype=torch.int64)
    name = resolve(config.decoder, device, replays=buffers is not None and buffers.graphs,
                   tokens_needed=trace is not None or config.needs_tokens())
    if name in STATIC_SEARCHES:
        return static_plan(model, tokenizer, prefix, keys, config, buffers, STATIC_SEARCHES[name])

    decoder = open_decoder(name, model, prefix, W, tokens_fed(O, A, H) + (X - 1) * (A + 1),
                           buffers)  # past slots per beam: the last step's X children side by side
    logits = decoder.logits  # (E*W, N): W identical beams per environment to start with
    zeros = logits.new_zeros(E * W, H)
    states = current_states(tokenizer, prefix, observation, critic is not None)  # (E, O), or (E, 0) without a critic
    beams = Beams(prefix.new_zeros(E * W, 0), zeros[:, 0].clone(), zeros, zeros.clone(),
                  states.repeat_interleave(W, 0), zeros[:, 0].clone())
    row_keys = keys.repeat_interleave(W * X)[:, None]  # (E*W*X, 1) every child's environment key
    rows = (torch.arange(E * W * X, device=device) % (W * X))[:, None]  # (E*W*X, 1) its index in its environment

    for t in range(H):
        decoder.expand(X)  # each beam becomes X children, which share its past in the cache
        logits, beams = logits.repeat_interleave(X, dim=0), beams.repeat(X)
        counters = torch.arange(t * A, (t + 1) * A, device=device)  # (A,) one number per action dimension
        uniforms = counter_uniform(row_keys, counters, rows)  # (E*W*X, A)
        action_bins = []
        for a in range(A):  # sample the action, one dimension at a time
            bins = sample_bins(logits, uniforms[:, a], config.top_k_action, config.temperature, config.top_p_action)
            if config.value == "likelihood" or config.likelihood_weight:  # the model's own distribution, untruncated
                beams.log_likelihood += torch.log_softmax(logits, -1).gather(1, bins[:, None])[:, 0]
            beams.append(bins)
            action_bins.append(bins)
            logits = decoder.feed(bins)
        reward_probs, reward_bins = torch.softmax(logits, dim=-1), logits.argmax(dim=-1)
        beams.append(reward_bins)
        logits = decoder.feed(reward_bins)
        value_probs, value_bins = torch.softmax(logits, dim=-1), logits.argmax(dim=-1)
        beams.rewards[:, t] = tokenizer.expectation(reward_probs, tokenizer.reward_dim)
        beams.values[:, t] = tokenizer.expectation(value_probs, tokenizer.value_dim)
        rewards_before = beams.discounted_rewards  # (E*W*X,) sum_{k<t} gamma^k E[r_k]
        beams.discounted_rewards = rewards_before + config.gamma**t * beams.rewards[:, t]
        score = _children_scores(config, tokenizer, beams, t, rewards_before, action_bins, critic)  # (E*W*X,)
        children = beams, score  # every plan of this step, scored: the last step's are what action_mean_beta weighs

        keep = best_children(score, E, W)  # (E*W,) select: the best W children of every environment
        if trace is not None:
            trace.append((score.cpu().clone(), keep.cpu().clone()))
        beams, score, value_bins = beams.rows(keep), score[keep], value_bins[keep]
        beams.append(value_bins)
        if t == H - 1:  # after the last step's selection no token is fed: the cache need not follow
            break
        decoder.select(keep)
        logits = decoder.feed(value_bins)  # the value token goes in now, for the W survivors only
        for _ in range(O):  # the most likely next observation
            bins = logits.argmax(dim=-1)
            beams.append(bins)
            logits = decoder.feed(bins)
        if critic is not None:
            beams.states = decoded(tokenizer, beams.generated[:, -O:], slice(0, O))  # (E*W, O) imagined

    decoder.release()
    best = score.view(E, W).argmax(dim=1) + torch.arange(E, device=device) * W  # (E,)
    return _decode_plan(tokenizer, beams.rows(best), score[best], H, config.action_mean_beta, children)


def weighted_mean(actions: torch.Tensor, score: torch.Tensor, beta: float) -> torch.Tensor:
    """actions (E, R, A) of R proposals, score (E, R) -> (E, A) sum_i softmax(beta * score)_i actions_i: the
    advantage-weighted mean of the proposals (as IQL's policy is fitted, here taken at planning time). A large beta
    tends to the best proposal's action, a small one to the proposals' plain mean, the model's own average action:
    where the critic is unsure between near-equal proposals, the mean moves only as far as the critic's preference
    asks, instead of jumping to whichever proposal the critic's error favours."""
    weights = torch.softmax(beta * score.double(), dim=1)  # (E, R)
    return (weights[:, :, None] * actions.double()).sum(dim=1).float()  # (E, A)


def current_states(tokenizer: TrajectoryTokenizer, prefix: torch.Tensor, observation, for_critic: bool):
    """What the critic scores the first action in: the real current observation (E, O) when the caller knows it,
    else the prefix's last observation decoded; (E, 0) when no critic scores."""
    E, O = prefix.shape[0], tokenizer.obs_dim
    if not for_critic:
        return prefix.new_zeros(E, 0, dtype=torch.float32)
    if observation is None:
        return decoded(tokenizer, prefix[:, -O:], slice(0, O))
    observation = torch.as_tensor(observation, dtype=torch.float32).to(prefix.device)
    if observation.shape != (E, O):
        raise MismatchError(f"observation must be (environments, obs_dim) = ({E}, {O}), got {tuple(observation.shape)}")
    return observation


def _decode_plan(tokenizer, best: Beams, score, horizon, action_mean_beta=None, children=None) -> Plan:
    """The best plans as a Plan; with action_mean_beta, its first action is the weighted mean of the first actions
    of every plan of the last step (`children`: their Beams and scores, (E*R,) rows), the best plan still shown."""
    plan = decode_plan(tokenizer, best.generated, best.rewards, best.values, score, horizon)
    if action_mean_beta is not None:
        O, A, E = tokenizer.obs_dim, tokenizer.act_dim, len(score)
        beams, scores = children
        first = decoded(tokenizer, beams.generated[:, :A], slice(O, O + A)).view(E, -1, A)  # (E, R, A)
        plan.actions[:, 0] = weighted_mean(first, scores.view(E, -1), action_mean_beta).cpu()
    return plan
