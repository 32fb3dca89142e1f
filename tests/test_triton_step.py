"""The static search with its decoding step as one Triton kernel (decoder="triton") makes the static search's plan:
the same tokens in float64, the model's logits in float32. On a CPU the kernel runs under Triton's interpreter
(TRITON_INTERPRET=1: slow, so the models are tiny); where gpu-check runs the exactness tests, compiled on the GPU.

Triton comes with PyTorch's wheels on Linux x86-64 (CI's): there its absence fails these tests; elsewhere (macOS,
a CPU-only wheel on another machine) they are skipped."""

import importlib
import os
import platform
import sys
from dataclasses import replace

import pytest
import torch

from tests.test_static_decoder import Recording  # a runner that keeps every step's logits
from ttlib.bench.decoding import Preset, random_model
from ttlib.planning import beam as planning
from ttlib.planning import decoders, triton_step
from ttlib.planning.beam import PlannerConfig, beam_plan
from ttlib.planning.fast_decoder import BufferPool
from ttlib.planning.graphs import CUDAGraphs, Eager
from ttlib.planning.static_decoder import StaticPlanner, generated_length
from ttlib.planning.triton_step import TritonPlanner

DEVICE = torch.device(os.environ.get("TTLIB_TEST_DEVICE", "cpu"))
if DEVICE.type == "cpu":  # on before Triton is imported (its own tl.sum ... are interpreted then), and left on:
    # Triton imports more of itself later, which must see it (this process defines no other Triton kernels)
    if "triton" in sys.modules and os.environ.get("TRITON_INTERPRET") != "1":
        raise RuntimeError("Triton was imported before these tests could turn on its interpreter: run them with "
                           "TRITON_INTERPRET=1 on a CPU")
    os.environ["TRITON_INTERPRET"] = "1"
try:
    importlib.import_module("ttlib.planning.triton_kernels")
except ImportError:
    if platform.system() == "Linux" and platform.machine() == "x86_64":
        raise ImportError("Triton is missing: PyTorch's wheels on Linux x86-64 carry it (pip install torch, or "
                          "pip install triton); the Triton decoding step cannot be tested") from None
    pytest.skip("Triton comes with PyTorch's wheels on Linux x86-64 only", allow_module_level=True)

# two layers and two heads of the narrowest width the kernel takes (16 a head), few bins: the interpreter is slow
SMALL = Preset(obs_dim=2, act_dim=2, n_bins=12, n_layer=2, n_embd=32, n_head=2, n_transitions=4)
SETTINGS = [  # (environments, past transitions in the prefix, planner): widths, samplers, a short prefix
    (2, 1, dict(beam_width=2, horizon=2, sample_expand=3, context=2, top_k_action=4)),
    (1, 0, dict(beam_width=3, horizon=2, sample_expand=2, context=2, top_p_action=0.7, temperature=1.5)),
    (3, 1, dict(beam_width=1, horizon=1, sample_expand=1, context=2, gamma=0.9, value_weight=0.5)),
]


def small(dtype, seed=0, device="cpu"):
    return random_model(SMALL, device=device, dtype=dtype, seed=seed)


def prefix_for(model, n_envs, past, seed=0):
    c = model.config
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, c.n_bins, (n_envs, past * c.transition_dim + c.obs_dim), generator=g)


@pytest.mark.exactness
@pytest.mark.parametrize("n_envs, past, settings", SETTINGS)
def test_the_triton_step_makes_the_static_plan_in_float64(n_envs, past, settings, device):
    """Token for token (on CUDA twice from the same kept planner: the first plan records the graphs, the second
    replays them): top-k, top-p and a temperature sampled in the kernel, children's siblings masked, rewards and
    values read off the same logits."""
    model, tok = small(torch.float64, seed=n_envs, device=device)
    prefix, keys = prefix_for(model, n_envs, past, n_envs), torch.arange(n_envs) * 7 + 1
    static = beam_plan(model, tok, prefix, keys, PlannerConfig(**settings, decoder="static"))
    pool = BufferPool()
    for _ in range(2 if device.type == "cuda" else 1):  # (the interpreter is slow)
        fused = beam_plan(model, tok, prefix, keys, PlannerConfig(**settings, decoder="triton"), pool)
        assert torch.equal(fused.bins, static.bins)
        for name in ("score", "rewards", "values", "actions", "observations"):
            torch.testing.assert_close(getattr(fused, name), getattr(static, name), atol=1e-6, rtol=0)
    (planner,) = pool.kept.values()
    assert isinstance(planner, TritonPlanner)
    stats = planner.runner.stats()
    assert stats == {"runner": "eager"} if device.type == "cpu" else stats["replays"] > 0 and not stats["failed"]


@pytest.mark.exactness
def test_the_triton_step_gives_the_models_logits_in_float32(device):
    """One beam and one child per environment: every row's logits after every step are the model's along the
    plan's own tokens, to float32 rounding (products in IEEE float32: no TF32 on the GPU)."""
    model, tok = small(torch.float32, device=device)
    prefix, keys = prefix_for(model, 2, 1).to(device), torch.tensor([5, 6], device=device)
    config = PlannerConfig(beam_width=1, sample_expand=1, horizon=2, context=2, decoder="triton")
    runner = Recording(CUDAGraphs() if device.type == "cuda" else Eager())
    planner = runner.planner = TritonPlanner(model.eval(), tok, config, 2, runner)
    with torch.inference_mode():
        if device.type == "cuda":
            planner.plan(prefix, keys)  # records the graphs
            runner.logits.clear()
        plan = planner.plan(prefix, keys)
    along = planning.logits_along(model, prefix, plan.bins, "recompute")  # (E, n, N), recomputed
    steps = torch.stack(runner.logits, dim=1)  # (E, n, N): before the first token, then after every token fed
    assert steps.shape == along.shape == (2, generated_length(tok.act_dim, tok.obs_dim, 2), model.config.n_bins)
    torch.testing.assert_close(steps, along, atol=1e-4, rtol=1e-4)
    assert device.type != "cuda" or runner.runner.replays > 0 and runner.runner.failed is None


def test_a_float32_plan_is_the_static_plan_on_these_seeds():
    """In float32 the kernel sums in another order than ATen: a near-tie between two bins or two children could
    go the other way. On these seeds none does: the plan is the static search's, its figures to float32 rounding."""
    model, tok = small(torch.float32, seed=3)
    prefix, keys = prefix_for(model, 2, 1, seed=3), torch.tensor([11, 12])
    settings = dict(beam_width=3, horizon=2, sample_expand=2, context=2, top_k_action=6)
    static = beam_plan(model, tok, prefix, keys, PlannerConfig(**settings, decoder="static"))
    fused = beam_plan(model, tok, prefix, keys, PlannerConfig(**settings, decoder="triton"))
    assert torch.equal(fused.bins, static.bins)
    torch.testing.assert_close(fused.score, static.score, atol=1e-5, rtol=1e-5)


def test_the_triton_planner_reads_what_the_static_one_writes():
    """TritonPlanner is StaticPlanner with another step: the same cache after a plan (what the kernel stored, where
    the static step stores it), the same rows."""
    model, tok = small(torch.float64, seed=4)
    prefix, keys = prefix_for(model, 2, 1, seed=4), torch.tensor([2, 3])
    config = PlannerConfig(beam_width=2, horizon=2, sample_expand=2, context=2, top_k_action=5)
    planners = [cls(model.eval(), tok, config, 2, Eager()) for cls in (StaticPlanner, TritonPlanner)]
    with torch.inference_mode():
        for planner in planners:
            planner.plan(prefix, keys)
    static, fused = planners
    for parity in range(2):  # the slots that hold keys and values, in both buffers
        torch.testing.assert_close(fused.past[parity], static.past[parity], atol=1e-9, rtol=0)
    for name in ("bins", "generated", "rewards", "values", "logits"):
        torch.testing.assert_close(getattr(fused.children, name), getattr(static.children, name), atol=1e-9, rtol=0)


def test_the_triton_step_is_asked_for_never_chosen_on_a_cpu():
    """"auto" takes the Triton step only on CUDA, and only once AUTO_ON_CUDA says so; what it cannot do, it says."""
    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    assert decoders.STATIC_SEARCHES["triton"] is TritonPlanner
    assert decoders.resolve("auto", cpu, replays=True) != "triton"
    assert (decoders.resolve("auto", cuda, replays=True) == "triton") == (decoders.AUTO_ON_CUDA == "triton")
    model, tok = small(torch.float64)
    with pytest.raises(ValueError, match=r"decoder='triton' runs the whole search with static shapes and keeps no"):
        beam_plan(model, tok, prefix_for(model, 1, 0), torch.tensor([0]), PlannerConfig(decoder="triton", horizon=1),
                  trace=[])


def test_shapes_the_kernel_cannot_tile_and_a_missing_triton_say_so(monkeypatch):
    model, tok = random_model(replace(SMALL, n_embd=24, n_head=2), dtype=torch.float64)
    with pytest.raises(ValueError, match="n_embd that is a power of two of at least 16, got 24"):
        beam_plan(model, tok, prefix_for(model, 1, 0), torch.tensor([0]), PlannerConfig(decoder="triton", horizon=1))
    model, tok = random_model(replace(SMALL, n_embd=32, n_head=4), dtype=torch.float64)
    with pytest.raises(ValueError, match=r"head width \(n_embd / n_head\) that is a power of two of at least 16"):
        beam_plan(model, tok, prefix_for(model, 1, 0), torch.tensor([0]), PlannerConfig(decoder="triton", horizon=1))

    def no_triton(name, *args):
        raise ModuleNotFoundError("No module named 'triton'")

    monkeypatch.setattr(triton_step.importlib, "import_module", no_triton)
    with pytest.raises(RuntimeError, match="needs Triton, which comes with PyTorch's CUDA wheels"):
        triton_step.kernels(torch.device("cpu"))
