"""Notebook 05's exercises: inverse-CDF sampling, the plan score, the selection of the best children, and the
beam-search loop on top of them.

The loop is checked step by step against `planning.beam_plan` on small random models in float64 -- the children's
scores and the kept rows of every step, then every token of the best plans (check 4c) -- with ttlib's sampler, score
and selection lent to it, so that a mistake in exercises 1-3 never costs exercise 4. Two graded stages come before
that check, so that the points follow how far the loop is right: 4a its first step's expansion and the actions it
feeds, 4b then that step's reward token, scores and kept rows -- each judged on what the loop did before a later
stage, unwritten or wrong, stopped it.
"""

from __future__ import annotations

import dataclasses

import torch

from ttlib.exercises import Exercise, Mistake
from ttlib.exercises.refuse import Refused
from ttlib.model.gpt import GPTConfig, TrajectoryGPT
from ttlib.model.tokenizer import TrajectoryTokenizer
from ttlib.planning import beam as planning
from ttlib.planning import decoders

__all__ = ["EXERCISES", "EXPAND_AND_SAMPLE", "SWEEP", "children_trial", "first_step", "recording", "run_children",
           "run_sample", "run_score", "run_search", "sample_trial", "sampling", "score_trial", "scoring",
           "search_trial", "searching", "searching_actions", "searching_scores", "selecting", "ttlib_search"]


# ---- exercise 1: sample_bins -------------------------------------------------------------------------------------
def sample_trial(rng):
    """Random logits (now and then with ties at the k-th largest), or one of two cases worked out by hand."""
    kind = rng.choice(["random", "ties", "certain", "ramp"], p=[0.6, 0.2, 0.1, 0.1])
    if kind == "certain":  # a bin of probability 1 is always drawn, even by u close to 1
        logits = torch.full((1, 10), -30.0)
        logits[0, 7] = 30.0
        return logits, torch.tensor([0.999], dtype=torch.float64), None, 1.0
    if kind == "ramp":  # top-3 of the logits 0..9 keeps bins 7, 8 and 9: u near 0 draws bin 7
        return torch.arange(10.0)[None], torch.tensor([1e-9], dtype=torch.float64), 3, 1.0
    B, K = int(rng.integers(1, 20)), int(rng.integers(2, 120))
    logits = torch.randn(B, K) * float(rng.uniform(0.1, 5))
    if kind == "ties":
        logits = logits.round()
    top_k = None if rng.random() < 0.3 else int(rng.integers(2, K + 3))  # from 2: top-1, the argmax, hides mistakes
    uniform = torch.as_tensor(rng.uniform(0, 1, size=B))  # float64, like counter_uniform's
    return logits, uniform, top_k, float(rng.uniform(0.3, 2.0))


SWEEP = torch.linspace(0.02, 0.98, 13, dtype=torch.float64)  # numbers u at which every row is drawn too


def run_sample(answer, trial):
    """The trial's draw, then every row drawn at each u of SWEEP: where a sampler puts the boundaries between the
    bins -- its distribution -- tells one mistake from another far better than a single draw does."""
    logits, uniform, top_k, temperature = trial
    call = f"sample_bins(logits of shape {tuple(logits.shape)}, top_k={top_k}, temperature={temperature:.3g})"
    bins = answer.sample_bins(logits, uniform, top_k, temperature)
    outputs = {f"the bins your {call} draws": bins,
               f"the dtype of what your {call} returns": str(getattr(bins, "dtype", type(bins).__name__))}
    B = logits.shape[0]
    sweep = [answer.sample_bins(logits, u.expand(B), top_k, temperature) for u in SWEEP]
    outputs[f"the bins your {call} draws at u = {', '.join(f'{u:.2f}' for u in SWEEP.tolist())} (one column each)"] = \
        torch.stack([torch.as_tensor(b) for b in sweep], dim=1)
    return outputs


def _sampler_with(drop_kth=False, multiply=False, softmax_dim=-1, use_top_k=True):
    def sample_bins(logits, uniform, top_k=None, temperature=1.0):
        logits = logits * temperature if multiply else logits / temperature
        K = logits.shape[-1]
        if use_top_k and top_k is not None and top_k < K:
            kth = torch.topk(logits, top_k, dim=-1).values[:, -1:]  # (B, 1)
            logits = logits.masked_fill(logits <= kth if drop_kth else logits < kth, float("-inf"))
        cdf = torch.softmax(logits, dim=softmax_dim).cumsum(dim=-1)  # (B, K)
        return (cdf <= uniform.to(cdf.dtype)[:, None] * cdf[:, -1:]).sum(dim=-1).clamp(max=K - 1)

    return {"sample_bins": sample_bins}


sampling = Exercise(
    id="05-sample-bins", number=1, what="your sample_bins", names=("sample_bins",), trial=sample_trial,
    run=run_sample, reference={"sample_bins": planning.sample_bins}, forbid=(planning.sample_bins,), trials=20,
    hidden_trials=40, passed="your sampler draws the same bins as ttlib's.",
    mistakes=[
        Mistake("top-k drops the k-th largest logit too: mask only the logits *below* it (`logits < kth`), so "
                "that k bins (more on ties) stay.", _sampler_with(drop_kth=True)),
        Mistake("the temperature multiplies the logits: divide them by it, so that a temperature below 1 sharpens "
                "the distribution and one above 1 flattens it.", _sampler_with(multiply=True)),
        Mistake("the softmax runs over the batch axis (dim=0): each row's probabilities over its K bins must sum "
                "to 1, so take the softmax (and the cumsum) over the bins, dim=-1.", _sampler_with(softmax_dim=0)),
        Mistake("top-k is not applied: when top_k is given and smaller than K, mask every logit below the k-th "
                "largest of its row with -inf before the softmax.", _sampler_with(use_top_k=False)),
    ],
)


# ---- exercise 2: plan_score --------------------------------------------------------------------------------------
def score_trial(rng):
    if rng.random() < 0.15:  # by hand: 1 + 0.5 * 2 + 0.25 * 4 + 0.125 * 8 = 4
        return torch.tensor([[1.0, 2.0, 4.0]]), torch.tensor([8.0]), 0.5
    B, T = int(rng.integers(1, 7)), int(rng.integers(2, 8))
    dtype = torch.float64 if rng.random() < 0.5 else torch.float32
    scale = float(rng.choice([1.0, 100.0]))
    rewards = torch.as_tensor(rng.normal(size=(B, T)) * scale, dtype=dtype)
    return rewards, torch.as_tensor(rng.normal(size=B) * scale, dtype=dtype), float(rng.uniform(0.5, 1.0))


def run_score(answer, trial):
    rewards, value, gamma = trial
    call = f"plan_score(rewards of shape {tuple(rewards.shape)} in {str(rewards.dtype)[6:]}, value, gamma={gamma:.3g})"
    score = answer.plan_score(rewards, value, gamma)
    return {f"the dtype of what your {call} returns": str(getattr(score, "dtype", type(score).__name__)),
            f"your {call}": score}


def _score_with(first_power=0, value_power=lambda T: T, discount_rewards=True):
    def plan_score(rewards, value, gamma):
        T = rewards.shape[1]
        powers = torch.arange(first_power, first_power + T, dtype=rewards.dtype)  # (T,)
        discounted = rewards * gamma**powers if discount_rewards else rewards
        return discounted.sum(dim=1) + gamma ** value_power(T) * value

    return {"plan_score": plan_score}


scoring = Exercise(
    id="05-plan-score", number=2, what="your plan_score", names=("plan_score",), trial=score_trial, run=run_score,
    reference={"plan_score": planning.plan_score}, forbid=(planning.plan_score,), atol=1e-5, rtol=1e-5, trials=10,
    hidden_trials=20, passed="your score is the one beam_plan ranks plans by.",
    mistakes=[
        Mistake("the discounts start at gamma^1: the first reward is not discounted, so reward k gets gamma^k for "
                "k = 0 ... T-1 (torch.arange(T)).", _score_with(first_power=1)),
        Mistake("the value is not discounted: it is what comes after the T steps, so it gets gamma^T.",
                _score_with(value_power=lambda T: 0)),
        Mistake("the value is discounted by gamma^(T-1): it comes after the last reward (gamma^(T-1)), one step "
                "later, so it gets gamma^T.", _score_with(value_power=lambda T: T - 1)),
        Mistake("the rewards are not discounted: reward k counts gamma^k times, sum_k gamma^k r_k.",
                _score_with(discount_rewards=False)),
    ],
)


# ---- exercise 3: best_children -----------------------------------------------------------------------------------
def children_trial(rng):
    E, W, X = int(rng.integers(1, 6)), int(rng.integers(1, 9)), int(rng.integers(1, 5))
    score = torch.as_tensor(rng.normal(size=E * W * X)).float()
    if rng.random() < 0.5:
        score = score.round()  # many ties: the order among equal scores must be kept
    return score, E, W


def run_children(answer, trial):
    score, E, W = trial
    call = f"best_children(score of {E} environments x {score.shape[0] // E} children, {W} beams)"
    return {f"the rows your {call} keeps": answer.best_children(score, E, W)}


def _children_with(descending=True, offsets=True, width=lambda W: W, per_environment=True):
    def best_children(score, n_envs, beam_width):
        R = score.shape[0] // n_envs
        if not per_environment:
            return torch.sort(score, descending=descending, stable=True).indices[:n_envs * beam_width]
        order = torch.sort(score.view(n_envs, R), dim=1, descending=descending, stable=True).indices
        order = order[:, :width(beam_width)]  # (E, W)
        return (order + torch.arange(n_envs)[:, None] * R).reshape(-1) if offsets else order.reshape(-1)

    return {"best_children": best_children}


selecting = Exercise(
    id="05-best-children", number=3, what="your best_children", names=("best_children",), trial=children_trial,
    run=run_children, reference={"best_children": planning.best_children}, forbid=(planning.best_children,),
    trials=20, hidden_trials=40, passed="you select the same beams as beam_plan.",
    mistakes=[
        Mistake("the lowest scores are kept: a score is what the plan is expected to earn, so sort with "
                "descending=True and keep the first beam_width.", _children_with(descending=False)),
        Mistake("the environments' row offsets are missing: the sort of the (E, R) view gives columns 0 ... R-1 "
                "in every environment; add e * R to environment e's so that they index the whole batch.",
                _children_with(offsets=False)),
        Mistake("one beam too few is kept per environment: keep the first beam_width columns, `[:, :beam_width]`.",
                _children_with(width=lambda W: W - 1)),
        Mistake("one sort over every environment's children mixes the environments: sort the (E, R) view along "
                "dim=1, so each keeps its own best beam_width.", _children_with(per_environment=False)),
    ],
)


# ---- exercise 4: the beam-search loop ----------------------------------------------------------------------------
def search_trial(rng):
    """A tiny random Trajectory GPT in float64 (no near-ties for rounding to break), a tokenizer, a planner setting,
    the contexts and keys of E environments, and the decoder the loop runs on."""
    O, A, K, n = int(rng.integers(1, 4)), int(rng.integers(1, 3)), int(rng.integers(3, 20)), int(rng.integers(2, 5))
    model = TrajectoryGPT(GPTConfig(obs_dim=O, act_dim=A, n_bins=K, n_layer=1, n_head=2, n_embd=8, n_transitions=n,
                                    dropout=0.0)).double().eval()
    tokenizer = TrajectoryTokenizer.fit(rng.normal(size=(200, O + A + 2)) * 10, O, A, K)
    context = int(rng.integers(1, n))
    config = planning.PlannerConfig(beam_width=int(rng.integers(2, 5)), horizon=int(rng.integers(2, n - context + 2)),
                                    sample_expand=int(rng.integers(1, 4)), context=context,
                                    top_k_action=None if rng.random() < 0.4 else int(rng.integers(1, K + 1)),
                                    temperature=float(rng.uniform(0.5, 1.5)), gamma=float(rng.uniform(0.5, 1.0)),
                                    value_weight=float(rng.choice([1.0, rng.uniform(0, 2)])))
    E = int(rng.integers(1, 4))
    prefix = torch.as_tensor(rng.integers(0, K, size=(E, (context - 1) * (O + A + 2) + O)))
    decoder = decoders.RecomputeDecoder if rng.random() < 0.25 else decoders.CachedDecoder
    return model, tokenizer, prefix, torch.as_tensor(rng.integers(0, 2**40, size=E)), config, decoder


def run_search(answer, trial):
    model, tokenizer, prefix, keys, config, decoder = trial
    trace = []
    torch.manual_seed(0)  # a loop that draws from torch's generator draws the same numbers in every run
    plan = answer.beam_search(model, tokenizer, prefix, keys, config, decoder, trace)
    if not isinstance(plan, planning.Plan):
        raise AssertionError(f"your beam_search should return a planning.Plan (the given last line), got "
                             f"{type(plan).__name__}")
    outputs = {}
    for t, (score, keep) in enumerate(trace):  # the search tree, step by step
        outputs[f"step {t}: the children's scores"] = score
        # the kept rows, by their scores: children with the same tokens tie, and rounding may keep either one
        outputs[f"step {t}: the kept rows (their scores)"] = score[keep]
    bins = plan.bins
    outputs["the shape of the best plans' bins (environments, tokens)"] = str(tuple(bins.shape))
    for j in range(bins.shape[1]):
        name = planning.token_name(j, tokenizer.obs_dim, tokenizer.act_dim)
        outputs[f"the best plans' token {j} ({name})"] = bins[:, j]
    outputs["the best plans' scores"] = plan.score
    outputs["the best plans' expected rewards"] = plan.rewards
    outputs["the best plans' expected values"] = plan.values
    return outputs


def ttlib_search(model, tokenizer, prefix, keys, config, decoder_class=None, trace=None):
    return planning.beam_plan(model, tokenizer, prefix, keys, config, trace=trace)


def _search_with(select_cache=True, gather_generated=True, action_counter=lambda a: a, value_after_reward=True,
                 greedy_observation=True, value_weight=True, lowest=False, tile=False, expand_logits=True):
    """The notebook's loop with one thing done wrong (ttlib's sampler, score and selection, as lent)."""

    def beam_search(model, tokenizer, prefix, keys, config, decoder_class=decoders.CachedDecoder, trace=None):
        O, A = tokenizer.obs_dim, tokenizer.act_dim
        E, H, W, X = prefix.shape[0], config.horizon, config.beam_width, config.sample_expand
        decoder = decoder_class(model, prefix, W)
        logits = decoder.logits  # (E*W, K)
        generated, rewards, values = prefix.new_zeros(E * W, 0), logits.new_zeros(E * W, H), logits.new_zeros(E * W, H)
        row_keys = keys.repeat_interleave(W * X)[:, None]  # (E*W*X, 1)
        rows = (torch.arange(E * W * X) % (W * X))[:, None]  # (E*W*X, 1)
        for t in range(H):
            decoder.expand(X)
            logits = logits.repeat_interleave(X, dim=0) if expand_logits else logits
            generated, rewards, values = (x.repeat(X, 1) if tile else x.repeat_interleave(X, dim=0)
                                          for x in (generated, rewards, values))
            uniforms = planning.counter_uniform(row_keys, torch.arange(t * A, (t + 1) * A), rows)  # (E*W*X, A)
            for a in range(A):
                bins = planning.sample_bins(logits, uniforms[:, action_counter(a)], config.top_k_action,
                                            config.temperature)
                generated = torch.cat([generated, bins[:, None]], dim=1)
                logits = decoder.feed(bins)
            rewards[:, t] = tokenizer.expectation(torch.softmax(logits, dim=-1), tokenizer.reward_dim)
            reward_bins = logits.argmax(dim=-1)
            generated = torch.cat([generated, reward_bins[:, None]], dim=1)
            if not value_after_reward:  # the value read from the reward's logits
                values[:, t] = tokenizer.expectation(torch.softmax(logits, dim=-1), tokenizer.value_dim)
            logits = decoder.feed(reward_bins)
            if value_after_reward:
                values[:, t] = tokenizer.expectation(torch.softmax(logits, dim=-1), tokenizer.value_dim)
            value_bins = logits.argmax(dim=-1)
            weight = config.value_weight if value_weight else 1.0
            score = planning.plan_score(rewards[:, :t + 1], weight * values[:, t], config.gamma)
            keep = planning.best_children(-score if lowest else score, E, W)
            if trace is not None:
                trace.append((score.cpu().clone(), keep.cpu().clone()))
            generated = generated[keep] if gather_generated else generated[:E * W]
            rewards, values, score, value_bins = rewards[keep], values[keep], score[keep], value_bins[keep]
            generated = torch.cat([generated, value_bins[:, None]], dim=1)
            if t == H - 1:
                break
            if select_cache:
                decoder.select(keep)
            logits = decoder.feed(value_bins)
            for _ in range(O):
                bins = (logits.argmax(dim=-1) if greedy_observation
                        else torch.multinomial(torch.softmax(logits, dim=-1), 1)[:, 0])
                generated = torch.cat([generated, bins[:, None]], dim=1)
                logits = decoder.feed(bins)
        decoder.release()
        best = score.view(E, W).argmax(dim=1) + torch.arange(E) * W  # (E,)
        return planning.decode_plan(tokenizer, generated[best], rewards[best], values[best], score[best], H)

    return {"beam_search": beam_search}


searching = Exercise(
    id="05-beam-search", number="4c", what="your beam_search", names=("beam_search",), trial=search_trial,
    run=run_search, reference={"beam_search": ttlib_search},
    lends={"sample_bins": planning.sample_bins, "plan_score": planning.plan_score,
           "best_children": planning.best_children},
    forbid=(planning.beam_plan, planning.search_beams.__wrapped__),  # (the search inside its inference-mode wrapper)
    atol=1e-9, rtol=1e-6, trials=6, hidden_trials=10, passed="your search makes ttlib's plans, step by step.",
    mistakes=[
        Mistake("this is a loop that never reorders the cache: after the selection the decoder still holds every "
                "child in its old row, so the kept beams continue other beams' sequences. Call "
                "`decoder.select(keep)` before feeding the value bins.", _search_with(select_cache=False)),
        Mistake("the generated tokens are not reordered with the kept rows: `generated = generated[keep]`, like "
                "rewards, values and score, so that each row of generated describes the row of the cache beside it.",
                _search_with(gather_generated=False)),
        Mistake("every action dimension is sampled from the same random numbers: dimension a uses column a of "
                "uniforms, `uniforms[:, a]`.", _search_with(action_counter=lambda a: 0)),
        Mistake("the value is read from the reward's logits: feed the reward bins first; the logits that come "
                "back predict the value token.", _search_with(value_after_reward=False)),
        Mistake("the next observation is sampled: the search decodes it greedily, the likeliest bin "
                "(`logits.argmax(dim=-1)`), the model's best guess of what happens next.",
                _search_with(greedy_observation=False)),
        Mistake("the score leaves out value_weight: plan_score gets `config.value_weight * values[:, t]` as its "
                "value.", _search_with(value_weight=False)),
        Mistake("the lowest scores are kept: best_children(score, E, W) keeps the highest ones, which is what a "
                "plan is expected to earn.", _search_with(lowest=True)),
        Mistake("the rows are expanded with .repeat, which tiles the whole batch: decoder.expand makes child c of "
                "beam b row b * X + c, so your tensors need `.repeat_interleave(X, dim=0)` to stay beside their rows "
                "in the cache.", _search_with(tile=True)),
        Mistake("the logits are not expanded with the rows: after decoder.expand(X), `logits.repeat_interleave(X, "
                "dim=0)` gives each child its beam's logits to sample its first action from.",
                _search_with(expand_logits=False)),
    ],
)

# ---- exercise 4 in graded stages: how far into the first step the loop is right -----------------------------------
def recording(decoder_class):
    """decoder_class, noting every call a search makes on it, in order: ("expand", X), ("feed", bins) or
    ("select", keep). `Recording.last` is the latest decoder made."""

    class Recording(decoder_class):
        last = None

        def __init__(self, model, prefix, beams_per_env):
            super().__init__(model, prefix, beams_per_env)
            self.calls = []
            Recording.last = self

        def feed(self, bins):
            self.calls.append(("feed", bins.detach().cpu().clone()))
            return super().feed(bins)

        def expand(self, children):
            self.calls.append(("expand", children))
            return super().expand(children)

        def select(self, keep):
            self.calls.append(("select", keep.detach().cpu().clone()))
            return super().select(keep)

    return Recording


def first_step(answer, trial, through_scores: bool) -> dict:
    """The first step of `answer.beam_search` on `trial`, as far as a stage needs it: the decoder's first call and
    the action bins fed (stages 1-2), then the reward bins fed and the children's scores and kept rows (stages 3-4).
    A loop whose later stages are not written yet (or fail) is judged on what it did before it stopped."""
    model, tokenizer, prefix, keys, config, decoder = trial
    decoder_class, trace, stopped = recording(decoder), [], None
    torch.manual_seed(0)
    try:
        answer.beam_search(model, tokenizer, prefix, keys, config, decoder_class, trace)
    except Refused:
        raise
    except Exception as error:  # noqa: BLE001 (a later stage's error is not this stage's; re-raised if it is)
        stopped = error
    calls = decoder_class.last.calls if decoder_class.last is not None else []
    A = tokenizer.act_dim
    needed = A + 2 if through_scores else A + 1
    if len(calls) < needed or (through_scores and not trace):
        if stopped is not None:
            raise stopped
        made = "scores" if through_scores else "actions"
        raise AssertionError(f"your beam_search ended before the first step's {made} were made: the loop runs "
                             "`for t in range(H)`, and stage 1 starts it")
    name, what = calls[0]
    outputs = {"step 0, stage 1: the decoder's first call": f"{name}({what})" if name == "expand" else name}
    for a in range(A):
        outputs[f"step 0, stage 2: the bins fed for action dimension {a}"] = calls[1 + a][1]
    if through_scores:
        score, keep = trace[0]
        outputs["step 0, stage 3: the reward bins fed"] = calls[1 + A][1]
        outputs["step 0, stage 4: the children's scores"] = score
        outputs["step 0, stage 4: the kept rows (their scores)"] = score[keep]
    return outputs


def _stage(id, number, through_scores, mistakes, passed):
    """Exercise 4 checked as far as a stage: the notebook's loop with ttlib's pieces as reference (it runs on the
    recording decoder, like the learner's), fewer trials, and the mistakes that show by then."""
    return dataclasses.replace(
        searching, id=id, number=number, run=lambda answer, trial: first_step(answer, trial, through_scores),
        reference=_search_with(), trials=4, hidden_trials=6, passed=passed, cell=searching.id,
        mistakes=[m for m in searching.mistakes if m.says.startswith(mistakes)])


# (a batch tiled instead of repeated shows only from step 1 on, in check 4c: at step 0 the rows hold nothing yet)
EXPAND_AND_SAMPLE = ("every action dimension", "the logits are not expanded")
searching_actions = _stage("05-beam-search-actions", "4a", False, EXPAND_AND_SAMPLE,
                           "stages 1-2 expand the beams and sample ttlib's actions.")
searching_scores = _stage("05-beam-search-scores", "4b", True, EXPAND_AND_SAMPLE + (
    "the value is read", "the score leaves out", "the lowest scores"),
    "stages 1-4 score the children and keep the rows ttlib keeps.")

EXERCISES = [sampling, scoring, selecting, searching_actions, searching_scores, searching]
