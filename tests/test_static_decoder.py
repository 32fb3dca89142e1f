"""The static search makes the fused decoder's plan: the same tokens in float64, the model's logits in float32 --
run eagerly here, replayed as CUDA graphs where gpu-check runs these tests (the `device` fixture)."""

import warnings
from dataclasses import replace

import pytest
import torch

from ttlib.bench.decoding import PRESETS, random_model
from ttlib.planning import beam as planning
from ttlib.planning.beam import PlannerConfig, PlannerConfigError, beam_plan
from ttlib.planning.fast_decoder import BufferPool
from ttlib.planning.graphs import CUDAGraphs, Eager, compiled
from ttlib.planning.static_decoder import StaticPlanner, generated_length, plan_schedule, slots

SETTINGS = [  # (environments, past transitions in the prefix, planner): widths, depths, samplers, a short prefix
    (3, 2, dict(beam_width=4, horizon=3, sample_expand=3, context=3, top_k_action=5)),
    (2, 1, dict(beam_width=3, horizon=2, sample_expand=2, context=3, top_p_action=0.8, temperature=1.5)),
    (1, 0, dict(beam_width=1, horizon=1, sample_expand=1, context=1)),
    (2, 2, dict(beam_width=4, horizon=3, sample_expand=1, context=3, top_k_action=3, gamma=0.9, value_weight=0.5)),
]


def tiny(dtype=torch.float64, seed=0, device="cpu"):
    return random_model(PRESETS["tiny"], device=device, dtype=dtype, seed=seed)


def prefix_for(model, n_envs, past, seed=0):
    c = model.config
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, c.n_bins, (n_envs, past * c.transition_dim + c.obs_dim), generator=g)


def graphs_replayed(pool: BufferPool) -> dict:
    """The kept static planner's runner: what it replayed, and whether a capture failed."""
    (planner,) = pool.kept.values()
    return planner.runner.stats()


@pytest.mark.exactness
@pytest.mark.parametrize("seed", range(2))
@pytest.mark.parametrize("n_envs, past, settings", SETTINGS)
def test_the_static_search_makes_the_fused_plan_in_float64(n_envs, past, settings, seed, device):
    """Token for token, twice from the same kept planner (on CUDA: the first plan records the graphs, the second
    replays them). In float64 rounding is far below any near-tie a search meets (see test_planning)."""
    model, tok = tiny(torch.float64, seed, device)
    prefix, keys = prefix_for(model, n_envs, past, seed), torch.arange(n_envs) * 7 + seed
    fused = beam_plan(model, tok, prefix, keys, PlannerConfig(**settings, decoder="fused"))
    pool = BufferPool()
    for _ in range(2):
        static = beam_plan(model, tok, prefix, keys, PlannerConfig(**settings, decoder="static"), pool)
        assert torch.equal(static.bins, fused.bins)
        for name in ("score", "rewards", "values", "actions", "observations"):
            torch.testing.assert_close(getattr(static, name), getattr(fused, name), atol=1e-6, rtol=0)
    stats = graphs_replayed(pool)
    if device.type == "cuda":
        assert stats["failed"] is None and stats["graphs"] > 0 and stats["replays"] > 0, stats
    else:
        assert stats == {"runner": "eager"}


class Recording:
    """A runner that runs another and keeps the logits every step leaves: the model's output, step by step."""

    def __init__(self, runner):
        self.runner, self.static, self.logits, self.planner = runner, runner.static, [], None

    def run(self, name, fn):
        self.runner.run(name, fn)
        if name[0] in ("start", "step"):
            rows = self.planner.beams if name[0] == "start" or name[1] == "beams" else self.planner.children
            self.logits.append(rows.logits.clone())  # (E, N): one row per environment


@pytest.mark.exactness
@pytest.mark.parametrize("seed", range(2))
def test_the_static_step_gives_the_models_logits_in_float32(seed, device):
    """One beam and one child per environment: every row's logits after every step are the model's along the
    plan's own tokens, to float32 rounding -- on CUDA, as the replayed graphs computed them."""
    model, tok = tiny(torch.float32, seed, device)
    prefix, keys = prefix_for(model, 3, 2, seed).to(device), torch.tensor([5, 6, 7], device=device)
    config = PlannerConfig(beam_width=1, sample_expand=1, horizon=3, context=3, decoder="static")
    runner = Recording(CUDAGraphs() if device.type == "cuda" else Eager())
    planner = runner.planner = StaticPlanner(model.eval(), tok, config, 3, runner)
    with torch.inference_mode():
        planner.plan(prefix, keys)  # (on CUDA: records the graphs)
        runner.logits.clear()
        plan = planner.plan(prefix, keys)
    along = planning.logits_along(model, prefix, plan.bins, "recompute")  # (E, n, N), recomputed
    steps = torch.stack(runner.logits, dim=1)  # (E, n, N): before the first token, then after every token fed
    assert steps.shape == along.shape == (3, generated_length(tok.act_dim, tok.obs_dim, 3), model.config.n_bins)
    torch.testing.assert_close(steps, along, atol=1e-4, rtol=1e-4)
    assert device.type != "cuda" or runner.runner.replays > 0 and runner.runner.failed is None


def test_a_kept_planner_is_reused_and_what_it_held_leaves_no_trace():
    """The second plan of a rollout reuses the first one's planner, whose cache still holds the first context and
    plan (here a longer context, other keys); the plan is what a fresh planner makes."""
    model, tok = tiny()
    config = PlannerConfig(beam_width=3, horizon=3, sample_expand=2, context=3, decoder="static")
    pool = BufferPool()
    beam_plan(model, tok, prefix_for(model, 2, 2, seed=1), torch.tensor([8, 9]), config, pool)
    (kept,) = pool.kept.values()
    prefix, keys = prefix_for(model, 2, 1, seed=2), torch.tensor([1, 2])
    again = beam_plan(model, tok, prefix, keys, config, pool)
    assert list(pool.kept.values()) == [kept]
    fresh = beam_plan(model, tok, prefix, keys, config)
    assert torch.equal(again.bins, fresh.bins) and torch.equal(again.score, fresh.score)


def test_a_model_changed_in_place_gets_a_new_planner():
    """Training between two plans changes the weights where they are: a kept planner (its weights laid out once)
    would plan with the old ones, so the new weights make a new planner."""
    model, tok = tiny()
    config = PlannerConfig(beam_width=3, horizon=2, sample_expand=2, context=2, decoder="static")
    prefix, keys, pool = prefix_for(model, 2, 1), torch.tensor([3, 4]), BufferPool()
    before = beam_plan(model, tok, prefix, keys, config, pool)
    with torch.no_grad():
        for block in model.blocks:
            block.mlp.up.weight.mul_(3.0)
    after = beam_plan(model, tok, prefix, keys, config, pool)
    assert torch.equal(after.bins, beam_plan(model, tok, prefix, keys, replace(config, decoder="fused")).bins)
    assert not torch.equal(after.score, before.score) and len(pool.kept) == 2


@pytest.mark.parametrize("X", [1, 2, 3])
def test_the_schedule_lays_out_a_plan(X):
    """Every token's slot is inside the cache; no child ever sees a sibling's slot or a value token's; every
    column of the plan is written exactly once (the first action of a step by `expand`, its value by `select`)."""
    A, O, H = 2, 3, 3
    rows, seen, used = plan_schedule(A, O, H, X)
    S, G = slots(A, O, H, X), generated_length(A, O, H)
    assert len(rows) == len(used) == planning.tokens_fed(O, A, H) and seen.shape == (len(rows), X, S)
    assert not seen[:, :, S - 1].any()  # the value tokens' slot
    columns = [row[3] for row in rows if row[3] < G] + [t * (A + 2 + O) + c for t in range(H) for c in (0, A + 1)]
    assert sorted(columns) == list(range(G))
    assert all(0 <= row[0] < S for row in rows) and max(used) <= S - 1
    k = 0
    for t in range(H):
        written = []  # (slot, child) of every token this step's children wrote so far
        for _ in range(A + 1):
            written += [(rows[k][0] + c, c) for c in range(X)]
            for c in range(X):
                assert [bool(seen[k, c, slot]) for slot, _ in written] == [c == writer for _, writer in written]
            k += 1
        k += 1 + O if t < H - 1 else 0


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA: the capture must fail")
def test_a_failed_capture_says_why_and_plans_eagerly():
    """On a CPU the CUDA graph capture fails for real: the runner warns once, says why, and the plan is exact."""
    model, tok = tiny()
    config = PlannerConfig(beam_width=3, horizon=2, sample_expand=2, context=2, decoder="static")
    prefix, keys = prefix_for(model, 2, 1), torch.tensor([3, 4])
    runner = CUDAGraphs()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with torch.inference_mode():
            plan = StaticPlanner(model, tok, config, 2, runner).plan(prefix, keys)
    assert [str(w.message) for w in caught] == [f"CUDA graphs: {runner.failed}"]
    assert runner.failed.startswith("capturing ('start', 10) failed, running it eagerly: ")
    assert set(runner.failures) == {("start", 10), ("expand", 0), ("expand", 1), ("step", "children", 0),
                                    ("step", "children", 1), ("select", 0), ("select", 1), ("step", "beams", 1),
                                    ("finish",)}  # every unit of a 2-step plan, tried once
    A, O = tok.act_dim, tok.obs_dim
    assert runner.graphs == {} and runner.replays == 0 and runner.eager_runs == 1 + 2 * (1 + A + 1 + 1) + 1 + O + 1
    assert torch.equal(plan.bins, beam_plan(model, tok, prefix, keys, replace(config, decoder="fused")).bins)


def test_a_prefix_longer_than_the_planners_context_gets_room():
    """beam_plan takes any prefix that fits the model's window, whatever config.context says; so does the static
    search (a planner with room for it); a planner made for a shorter context says so."""
    model, tok = tiny()
    config = PlannerConfig(beam_width=2, horizon=2, sample_expand=2, context=1, decoder="static")
    prefix, keys = prefix_for(model, 2, 2), torch.tensor([1, 2])
    static = beam_plan(model, tok, prefix, keys, config)
    assert torch.equal(static.bins, beam_plan(model, tok, prefix, keys, replace(config, decoder="fused")).bins)
    with torch.inference_mode(), pytest.raises(ValueError, match="longer than the 3 context slots"):
        StaticPlanner(model, tok, config, 2, Eager()).plan(prefix, keys)


def test_the_static_search_says_what_it_cannot_do():
    """It keeps no search tree (said when asked for one) and scores with the value token only (said when the
    config is made: test_planning)."""
    model, tok = tiny()
    config = PlannerConfig(beam_width=2, horizon=1, context=2, decoder="static")
    with pytest.raises(PlannerConfigError, match="keeps no search tree: plan with decoder='fused' to trace it"):
        beam_plan(model, tok, prefix_for(model, 1, 1), torch.tensor([0]), config, trace=[])
    trace = []  # "auto" with a trace: the fused decoder, on any device
    auto = beam_plan(model, tok, prefix_for(model, 1, 1), torch.tensor([0]), replace(config, decoder="auto"),
                     BufferPool(), trace=trace)
    assert len(trace) == 1 and torch.equal(auto.bins, beam_plan(model, tok, prefix_for(model, 1, 1),
                                                                  torch.tensor([0]), config).bins)


def test_a_pool_without_graphs_launches_the_static_search_kernel_by_kernel(device):
    """BufferPool(graphs=False) keeps the static planner but runs its units eagerly, on any device: what `ttlib
    bench planning` times the graphs against. The plan is the same."""
    model, tok = tiny(device=device)
    config = PlannerConfig(beam_width=3, horizon=2, sample_expand=2, context=2, decoder="static")
    prefix, keys = prefix_for(model, 2, 1), torch.tensor([3, 4])
    launched, replayed = BufferPool(graphs=False), BufferPool()
    plans = [beam_plan(model, tok, prefix, keys, config, pool) for pool in (launched, replayed, launched, replayed)]
    assert all(torch.equal(plan.bins, plans[0].bins) for plan in plans)
    assert graphs_replayed(launched) == {"runner": "eager"}
    assert graphs_replayed(replayed)["runner"] == ("cuda-graphs" if device.type == "cuda" else "eager")


def test_a_step_that_cannot_be_compiled_says_why_and_runs_as_written():
    """graphs.compiled: torch.compile refuses a function it cannot make one graph of (here a graph break, under
    fullgraph=True); the wrapper warns once, keeps the reason where the runner keeps its failures, and from then on
    runs the function as written."""
    runner, calls = CUDAGraphs(), []

    def step(x):
        calls.append(1)
        torch._dynamo.graph_break()
        return x + 1

    run = compiled(step, runner)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert run(torch.ones(2)).tolist() == [2.0, 2.0]
        assert run(torch.ones(2)).tolist() == [2.0, 2.0]
    assert runner.failures["compile"].startswith("torch.compile failed, running the step as written: ")
    assert runner.failed == runner.failures["compile"]
    assert [str(w.message) for w in caught] == [runner.failed]
