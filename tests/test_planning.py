"""Beam search: the KV cache changes the speed, never the plan; one field chooses the decoder."""

import ast
import inspect
import textwrap
from dataclasses import FrozenInstanceError, replace

import numpy as np
import pytest
import torch

from ttlib.bench.decoding import PRESETS, random_model
from ttlib.bench.flops import plan_flops
from ttlib.errors import TTLibError
from ttlib.planning import beam as planning
from ttlib.planning import decoders
from ttlib.planning.beam import PlannerConfig, PlannerConfigError, beam_plan, counter_uniform, sample_bins
from ttlib.planning.decoders import CachedDecoder, RecomputeDecoder
from ttlib.planning.fast_decoder import BufferPool, FusedDecoder, min_slots
from ttlib.planning.static_decoder import StaticPlanner


def tiny(dtype=torch.float64, seed=0, device="cpu"):
    return random_model(PRESETS["tiny"], device=device, dtype=dtype, seed=seed)


def prefix_for(model, n_envs, transitions, seed=0):
    c = model.config
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, c.n_bins, (n_envs, (transitions - 1) * c.transition_dim + c.obs_dim), generator=g)


@pytest.mark.exactness
@pytest.mark.parametrize("seed", range(3))
def test_all_three_decoders_make_the_same_plan_in_float64(seed, device):
    """In float64 rounding is ~1e-16, far below any near-tie a search meets: the fused decoder, the readable one on
    the model's own cache and the recomputing baseline make the same plan. (In float32 a near-tie can go either
    way on another torch, CPU or GPU: there the claim is the next test's.)"""
    model, tok = tiny(torch.float64, seed, device)
    prefix = prefix_for(model, 3, 3, seed)
    keys = torch.tensor([11, 22, 33]) + seed
    settings = dict(beam_width=4, horizon=3, sample_expand=3, context=3, top_k_action=5)
    fused = beam_plan(model, tok, prefix, keys, PlannerConfig(**settings))
    for other in (PlannerConfig(**settings, decoder="readable"), PlannerConfig(**settings, decoder="recompute")):
        plan = beam_plan(model, tok, prefix, keys, other)
        assert torch.equal(fused.bins, plan.bins)
        torch.testing.assert_close(fused.score, plan.score, atol=1e-9, rtol=0)


@pytest.mark.exactness
@pytest.mark.parametrize("seed", range(3))
def test_both_decoders_compute_the_same_logits_along_a_float32_plan(seed, device):
    """What "the cache changes nothing" means in float32: fed the same tokens (the cached plan's), the cached and the
    recomputing decoder give the same logits, to rounding."""
    model, tok = tiny(torch.float32, seed, device)
    prefix = prefix_for(model, 3, 3, seed)
    plan = beam_plan(model, tok, prefix, torch.tensor([11, 22, 33]) + seed,
                     PlannerConfig(beam_width=4, horizon=3, sample_expand=3, context=3, top_k_action=5))
    cached = planning.logits_along(model, prefix, plan.bins, "fused")
    recomputed = planning.logits_along(model, prefix, plan.bins, "recompute")
    readable = planning.logits_along(model, prefix, plan.bins, "readable")
    assert cached.shape == (3, plan.bins.shape[1], model.config.n_bins)
    torch.testing.assert_close(cached, recomputed, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(readable, recomputed, atol=1e-4, rtol=1e-4)
    # and the check can fail: one token changed early in the plan changes the logits after it
    other = plan.bins.clone()
    other[:, 0] = (other[:, 0] + 1) % model.config.n_bins
    assert (planning.logits_along(model, prefix, other)[:, 1:] - cached[:, 1:]).abs().max() > 1e-3


@pytest.mark.exactness
def test_decoders_agree_through_any_sequence_of_expansions_and_selections(device):
    """Beyond what beam_plan does: more tokens than the buffers first hold (they grow, while expanded and not),
    children expanded again before a selection, a selection with no expansion before it, and selections that keep,
    drop and duplicate rows (each row stays with its environment: the first half of the rows plans for environment
    0, the second for 1)."""
    model, _ = tiny(torch.float64, device=device)
    prefix = prefix_for(model, 2, 2).to(device)
    fused = FusedDecoder(model, prefix, 3, capacity=10)
    readable, recomputed = CachedDecoder(model, prefix, 3), RecomputeDecoder(model, prefix, 3)
    decoders = (fused, readable, recomputed)
    torch.testing.assert_close(fused.logits, recomputed.logits)
    torch.testing.assert_close(readable.logits, recomputed.logits)
    g = torch.Generator().manual_seed(0)
    rows = 6  # 2 environments x 3 beams
    with torch.inference_mode():
        for action, arg in [("expand", 2), ("feed", 11), ("select", [0, 0, 5, 6, 9, 11]), ("feed", 3),
                            ("select", [2, 1, 1, 3, 5, 5]), ("feed", 1),
                            ("expand", 2), ("feed", 2), ("expand", 2), ("feed", 4),
                            ("select", [1, 4, 11, 12, 15, 20]), ("feed", 2)]:
            if action == "expand":
                for decoder in decoders:
                    decoder.expand(arg)
                rows *= arg
            elif action == "select":
                for decoder in decoders:
                    decoder.select(torch.tensor(arg, device=device))
                rows = len(arg)
            else:
                for _ in range(arg):
                    bins = torch.randint(0, model.config.n_bins, (rows,), generator=g).to(device)
                    expected = recomputed.feed(bins)
                    torch.testing.assert_close(fused.feed(bins), expected)
                    torch.testing.assert_close(readable.feed(bins), expected)


def test_buffers_kept_from_the_last_plan_leave_no_trace():
    """The cache's buffers are kept from one plan to the next. Whatever the last plan left in them must not change
    the next plan: here every key, and every value past the first slots (which stay finite, being read as
    padding weighted 0), is nan."""
    model, tok = random_model(PRESETS["lunarlander"])
    prefix, keys = prefix_for(model, 2, 2), torch.tensor([5, 6])
    config = PlannerConfig(beam_width=4, horizon=3, sample_expand=2, context=2)
    pool = BufferPool()
    first = beam_plan(model, tok, prefix, keys, config, pool)
    kept = pool.free[:2]
    assert len(kept) == 2  # the plan gave back its two buffers
    padding = min_slots(1, model.config.n_embd // model.config.n_head)
    with torch.inference_mode():  # (where plans make them)
        for buffer in kept:
            assert buffer.shape[4] > padding  # there are values slots past the padding to spoil
            buffer[:, 0] = float("nan")
            buffer[:, 1, ..., padding:, :] = float("nan")
    again = beam_plan(model, tok, prefix, keys, config, pool)
    assert {id(b) for b in pool.free[:2]} == {id(b) for b in kept}  # the spoiled buffers were used
    assert torch.equal(first.bins, again.bins) and torch.equal(first.score, again.score)


def test_plan_shapes_and_decoding():
    model, tok = tiny()
    plan = beam_plan(model, tok, prefix_for(model, 2, 2), torch.tensor([1, 2]),
                     PlannerConfig(beam_width=3, horizon=3, context=2))
    O, A = tok.obs_dim, tok.act_dim
    assert plan.actions.shape == (2, 3, A) and plan.observations.shape == (2, 2, O)
    assert plan.rewards.shape == plan.values.shape == (2, 3) and plan.score.shape == (2,)
    assert plan.bins.shape == (2, 3 * (A + 2) + 2 * O)
    # decoded actions are what the action dimensions' bins hold (their means)
    means = tok.means[O:O + A]
    for j in range(A):
        assert np.isin(plan.actions[..., j].numpy(), means[j].astype(np.float32)).all()
    # the score is what the plan's own rewards and final value say
    g = 0.99
    expected = sum(g**t * plan.rewards[:, t] for t in range(3)) + g**3 * plan.values[:, 2]
    torch.testing.assert_close(plan.score, expected, atol=1e-5, rtol=1e-5)


@pytest.mark.exactness
def test_an_environment_plans_the_same_alone_or_in_a_batch(device):
    model, tok = tiny(device=device)
    prefix = prefix_for(model, 4, 3)
    keys = torch.tensor([5, 6, 7, 8])
    config = PlannerConfig(beam_width=4, horizon=2, context=3)
    batch = beam_plan(model, tok, prefix, keys, config)
    alone = beam_plan(model, tok, prefix[2:3], keys[2:3], config)
    assert torch.equal(batch.bins[2:3], alone.bins)


def test_a_wider_search_never_scores_worse_at_horizon_one():
    """Row 0 draws the same random numbers in both searches, so the wide search contains the narrow one's
    candidate and its best score can only be higher or equal."""
    model, tok = tiny(seed=4)
    prefix = prefix_for(model, 1, 3)
    wide = beam_plan(model, tok, prefix, torch.tensor([3]), PlannerConfig(beam_width=8, horizon=1,
                                                                          sample_expand=4, context=3))
    narrow = beam_plan(model, tok, prefix, torch.tensor([3]), PlannerConfig(beam_width=1, horizon=1,
                                                                            sample_expand=1, context=3))
    assert wide.score.item() >= narrow.score.item() - 1e-9


def test_counter_uniform_is_deterministic_and_uniform():
    keys = torch.arange(20000, dtype=torch.int64) * 7919
    rows = torch.arange(20000) % 64
    u = counter_uniform(keys, 3, rows)
    assert torch.equal(u, counter_uniform(keys, 3, rows))
    assert not torch.equal(u, counter_uniform(keys, 4, rows))
    assert 0 < u.min() and u.max() < 1
    hist = torch.histc(u.float(), bins=10, min=0, max=1)
    assert hist.min() > 1700 and hist.max() < 2300


def test_sample_bins_follows_the_distribution_and_top_k():
    logits = torch.log(torch.tensor([[0.1, 0.2, 0.7]])).repeat(30000, 1)
    u = counter_uniform(torch.arange(30000), 0, torch.zeros(30000, dtype=torch.long))
    counts = torch.bincount(sample_bins(logits, u), minlength=3).float() / 30000
    torch.testing.assert_close(counts, torch.tensor([0.1, 0.2, 0.7]), atol=0.02, rtol=0)
    assert set(sample_bins(logits, u, top_k=1).tolist()) == {2}
    nucleus = torch.bincount(sample_bins(logits, u, top_p=0.8), minlength=3).float() / 30000  # keeps 0.7, 0.2
    torch.testing.assert_close(nucleus, torch.tensor([0.0, 2 / 9, 7 / 9]), atol=0.02, rtol=0)
    assert set(sample_bins(logits, u, top_p=0.5).tolist()) == {2}


@pytest.mark.parametrize("field, value", [("beam_width", 0), ("horizon", 0), ("sample_expand", 0),
                                          ("context", 0), ("temperature", 0.0), ("top_p_action", 0.0),
                                          ("top_p_action", 1.5), ("top_k_action", 0), ("gamma", 1.5),
                                          ("value_weight", -1.0), ("beam_width", "8"), ("horizon", 2.0),
                                          ("gamma", True), ("decoder", "cached")])
def test_bad_planner_settings_raise_when_the_config_is_made(field, value):
    """An invalid planner cannot exist: it raises when made (or replaced), and a made one cannot be changed."""
    with pytest.raises(PlannerConfigError, match=field):
        PlannerConfig(**{"beam_width": 2, "horizon": 2, "context": 2, field: value})
    with pytest.raises(PlannerConfigError, match=field):
        replace(PlannerConfig(), **{field: value})
    with pytest.raises(FrozenInstanceError):
        setattr(PlannerConfig(), field, value)


def test_context_plus_horizon_longer_than_the_model_raises():
    model, tok = tiny()  # n_transitions = 10
    with pytest.raises(ValueError, match="do not fit the model's window of 10"):
        beam_plan(model, tok, prefix_for(model, 1, 8), torch.tensor([0]),
                  PlannerConfig(beam_width=2, horizon=4, context=8))


def test_prefix_must_end_with_an_observation():
    model, tok = tiny()
    with pytest.raises(ValueError, match="whole transitions followed by one observation"):
        beam_plan(model, tok, torch.zeros(1, 5, dtype=torch.long), torch.tensor([0]), PlannerConfig(horizon=2))


def test_flop_count_of_the_halfcheetah_plan_is_exact():
    """The count in closed form: a token at position p (p keys before it, itself included) costs, per layer,
    2*12*C^2 for the qkv, projection and MLP matmuls plus 2*2*C*p for q.k and weights.v, and 2*C*N for its head.
    The context (P = 4*25 + 17 = 117 tokens, one head at its end) runs once; then every step feeds A+1 = 7 tokens
    to 64 children and, between steps, 1+O = 18 tokens to the 32 survivors."""
    model, _ = random_model(PRESETS["halfcheetah"])
    C, L, N, O, A, P = 128, 4, 100, 17, 6, 117

    def tokens(rows, first, n):  # n tokens at positions first .. first+n-1, on `rows` rows each
        return rows * (n * (L * 24 * C * C + 2 * C * N) + 4 * C * L * (2 * first + n - 1) * n // 2)

    expected = P * L * 24 * C * C + 4 * C * L * P * (P + 1) // 2 + 2 * C * N
    position = P + 1
    for step in range(5):
        expected += tokens(64, position, A + 1)
        position += A + 1
        if step < 4:
            expected += tokens(32, position, 1 + O)
            position += 1 + O
    assert plan_flops(model.config, PlannerConfig(), batch=1) == expected == 9_052_953_600
    assert plan_flops(model.config, PlannerConfig(), batch=3) == 3 * expected


def test_planning_runs_in_evaluation_mode_and_restores_the_mode():
    """Dropout must not randomise plans: a model left in training mode plans like the same model in eval mode."""
    model, tok = tiny(torch.float32)
    model.config.dropout = 0.5
    for module in model.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.5
    prefix, keys = prefix_for(model, 2, 3), torch.tensor([1, 2])
    config = PlannerConfig(beam_width=4, horizon=2, context=3)
    reference = beam_plan(model.eval(), tok, prefix, keys, config)
    model.train()
    again = beam_plan(model, tok, prefix, keys, config)
    assert model.training
    assert torch.equal(reference.bins, again.bins)


def test_plan_score_is_the_score_beam_plan_ranks_by():
    model, tok = tiny(torch.float64, 1)
    prefix = prefix_for(model, 2, 2, 1)
    config = PlannerConfig(beam_width=3, horizon=3, sample_expand=2, context=2, gamma=0.9)
    plan = beam_plan(model, tok, prefix, torch.tensor([1, 2]), config)
    score = planning.plan_score(plan.rewards.double(), plan.values[:, -1].double(), 0.9)
    torch.testing.assert_close(score.float(), plan.score, atol=1e-4, rtol=1e-5)
    got = planning.plan_score(torch.tensor([[1.0, 2.0, 4.0]]), torch.tensor([8.0]), 0.5)
    assert torch.allclose(got, torch.tensor([4.0]))


def test_trace_records_every_step_and_changes_nothing():
    model, tok = tiny(torch.float64, 2)
    prefix = prefix_for(model, 2, 2, 2)
    config = PlannerConfig(beam_width=3, horizon=3, sample_expand=2, context=2)
    trace = []
    traced = beam_plan(model, tok, prefix, torch.tensor([7, 8]), config, trace=trace)
    assert torch.equal(traced.bins, beam_plan(model, tok, prefix, torch.tensor([7, 8]), config).bins)
    assert len(trace) == 3
    for score, keep in trace:
        assert score.shape == (12,) and keep.shape == (6,)
        assert (keep[:3] < 6).all() and (keep[3:] >= 6).all()  # each environment keeps its own children
    torch.testing.assert_close(trace[-1][0][trace[-1][1]].view(2, 3).max(dim=1).values.float(), traced.score)


def test_token_names_follow_the_generated_layout():
    names = [planning.token_name(j, obs_dim=2, act_dim=1) for j in range(7)]
    assert names == ["step 0, action dim 0", "step 0, reward", "step 0, value", "step 0, observation dim 0 (after it)",
                     "step 0, observation dim 1 (after it)", "step 1, action dim 0", "step 1, reward"]


def test_score_actions_gives_every_child_of_a_one_step_search_its_score():
    """Scoring the actions a horizon-1 search sampled gives the scores it ranked them by."""
    model, tok = tiny(torch.float64, 5)
    prefix = prefix_for(model, 2, 2, 5)
    config = PlannerConfig(beam_width=6, horizon=1, sample_expand=1, context=2, gamma=0.9)
    trace = []
    plan = beam_plan(model, tok, prefix, torch.tensor([7, 8]), config, trace=trace)
    score = planning.score_actions(model, tok, prefix, plan.actions[:, 0], gamma=0.9)
    torch.testing.assert_close(score.float(), plan.score, atol=1e-4, rtol=1e-5)
    children, _ = trace[0]  # (E*W,) every sampled child's score: the best of each environment is the plan's
    torch.testing.assert_close(children.view(2, 6).max(dim=1).values.float(), plan.score, atol=1e-4, rtol=1e-5)
    # another action gets another score, through the same cached or recomputing decoder
    other = planning.score_actions(model, tok, prefix, -plan.actions[:, 0], gamma=0.9)
    assert not torch.allclose(other, score)
    torch.testing.assert_close(planning.score_actions(model, tok, prefix, -plan.actions[:, 0], 0.9, "recompute"),
                               other)


@pytest.mark.parametrize("horizon", [1, 2])
def test_the_imitation_planner_takes_the_likeliest_of_its_proposals(horizon):
    """value="likelihood": a plan's score is the log-probability the model gives its action bins (under the full
    distribution, not the top-k one they were sampled from), and the plan kept is the likeliest proposal."""
    model, tok = tiny(seed=5)
    A = model.config.act_dim
    prefix = prefix_for(model, 2, 2)
    config = planning.imitation_planner(beam_width=4, sample_expand=3, context=2, top_k_action=5, horizon=horizon)
    trace = []
    plan = beam_plan(model, tok, prefix, torch.tensor([1, 2]), config, trace=trace)
    logits = planning.logits_along(model, prefix, plan.bins)  # (2, n, N)
    step = A + 2 + model.config.obs_dim
    actions = [j for j in range(plan.bins.shape[1]) if j % step < A]  # the action tokens of every step
    log_p = torch.log_softmax(logits, -1).gather(2, plan.bins[:, :, None])[:, actions, 0].sum(1)
    torch.testing.assert_close(plan.score, log_p.float(), atol=1e-6, rtol=0)
    if horizon == 1:  # every proposal was one action: the plan is the likeliest of the 12 per environment
        assert torch.equal(plan.score, trace[0][0].view(2, -1).max(dim=1).values.float())
    with pytest.raises(PlannerConfigError, match="value must be one of 'token', 'critic', 'likelihood'"):
        PlannerConfig(value="nope", context=2)


# ---- one decoder choice ----------------------------------------------------------------------------------------
def test_one_field_chooses_the_decoder():
    """PlannerConfig.decoder is the one choice of decoder (tests/test_structure.py: no other field says how to
    decode): its names are the registry's, and every name but "auto" is exactly one decoder class."""
    assert PlannerConfig().decoder == "auto" and PlannerConfig.__annotations__["decoder"] == "DecoderName"
    assert set(decoders.DECODERS) == {"auto", *decoders.TOKEN_DECODERS, *decoders.STATIC_SEARCHES}
    assert not set(decoders.TOKEN_DECODERS) & set(decoders.STATIC_SEARCHES)
    with pytest.raises(PlannerConfigError) as raised:
        PlannerConfig(decoder="cached")
    assert isinstance(raised.value, TTLibError) and isinstance(raised.value, ValueError)
    assert str(raised.value) == ("decoder must be one of 'auto', 'fused', 'readable', 'recompute', 'static', "
                                 "'triton', got 'cached'")
    for name in decoders.STATIC_SEARCHES:  # what the static search cannot do is said when the config is made
        with pytest.raises(PlannerConfigError, match=f"decoder='{name}' is the static search"):
            PlannerConfig(decoder=name, value="critic")
    with pytest.raises(PlannerConfigError, match="compile_step compiles the static search's step"):
        PlannerConfig(decoder="fused", compile_step=True)


def unused_parameters(method) -> list[str]:
    """The parameters of a method (self aside) that its body never reads."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(method)))
    function = tree.body[0]
    read = {node.id for node in ast.walk(function) if isinstance(node, ast.Name)}
    return [a.arg for a in function.args.args[1:] + function.args.kwonlyargs if a.arg not in read]


def parameters(method) -> list[str]:
    return list(inspect.signature(method).parameters)


@pytest.mark.parametrize("name", [n for n in decoders.DECODERS if n != "auto"])
def test_every_decoder_implements_its_protocol_and_reads_every_argument(name):
    """A token decoder is made as cls(model, prefix, beams_per_env) (more only with defaults) and has the Decoder
    protocol's methods, with its parameters; a static search is a StaticPlanner with its constructor and plan.
    No argument is taken only to be ignored."""
    if name in decoders.STATIC_SEARCHES:
        cls = decoders.STATIC_SEARCHES[name]
        assert issubclass(cls, StaticPlanner)
        methods = ("__init__", "plan")
        reference = StaticPlanner
    else:
        cls = decoders.TOKEN_DECODERS[name]
        init = inspect.signature(cls.__init__).parameters
        assert list(init)[:4] == ["self", "model", "prefix", "beams_per_env"]
        assert all(p.default is not p.empty for p in list(init.values())[4:]), f"{cls.__name__}: more than 3 needed"
        assert unused_parameters(cls.__init__) == [], cls.__name__
        methods = ("feed", "expand", "select", "release")
        reference = decoders.Decoder
        model, _ = tiny()
        made = cls(model, prefix_for(model, 2, 1), 3)
        assert isinstance(made, decoders.Decoder) and made.logits.shape == (6, model.config.n_bins)
    for method in methods:
        assert parameters(getattr(cls, method)) == parameters(getattr(reference, method)), (cls.__name__, method)
        if method in vars(cls):  # (a method it inherits is checked where it is written)
            assert unused_parameters(getattr(cls, method)) == [], (cls.__name__, method)


def test_auto_is_resolved_by_the_device():
    """"auto" is the fastest measured where the plan runs: the static search on a GPU that replays its graphs
    (a pool kept from plan to plan), the fused decoder on a GPU planning once, AUTO_ON_CPU on a CPU; a search tree,
    a critic or the likelihood need the search in beam.py. A named decoder is itself."""
    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    assert decoders.resolve("auto", cuda, replays=True) == decoders.AUTO_ON_CUDA
    assert decoders.resolve("auto", cuda, replays=False) == "fused"
    assert decoders.resolve("auto", cuda, replays=True, tokens_needed=True) == "fused"
    assert decoders.resolve("auto", cpu, replays=True) == decoders.AUTO_ON_CPU
    for name in decoders.DECODERS[1:]:
        assert decoders.resolve(name, cpu, replays=False) == name
    assert decoders.AUTO_ON_CPU in decoders.DECODERS and decoders.AUTO_ON_CUDA in decoders.STATIC_SEARCHES
