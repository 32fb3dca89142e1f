"""Benchmarks: every speed claim of the course is measured here, side by side in one run, as ratios.

    ttlib bench decoding                  cached vs recompute decoding, tokens/s, at a sequence of 250
    ttlib bench planning --batch 1        ms per plan of each decoder side by side (fused, static; on a GPU also the
                                          static search replayed as CUDA graphs), against the recomputing one,
                                          GFLOP/s, and how far from the machine's FLOP floor (--faster-tt DIR: side
                                          by side with faster-TT's batch_beam_plan from a checkout of it)
    ttlib bench profile                   where a cached plan's time goes, by kind of operation
    ttlib bench rollouts | training | distributed     whole runs (bench_runs.py)

Timings are medians of several runs after warm-up. Costs do not depend on the weights, so the presets use
random weights.

The FLOP floor: a plan's matmul FLOPs (`flops.plan_flops`) divided by the rate at which this machine multiplies two
large float32 matrices (`matmul_rate`), the fastest any implementation could go. The planning benchmark times a
plan and that product alternately and reports their ratio, so that a busy machine slows both alike; the
figure travels across CPUs where an absolute time does not. Beside them it times the plan's own matrix products
alone (`flops.replay`).
"""

from __future__ import annotations

import os
import platform
import statistics
import sys
import time
import types
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import NamedTuple

import numpy as np
import torch

from ttlib.bench.flops import ATTENTION_PRODUCTS, LINEAR_PRODUCTS, plan_flops, product_flops, recorded_products, replay
from ttlib.errors import ConfigError
from ttlib.model.gpt import GPTConfig, TrajectoryGPT
from ttlib.model.tokenizer import TrajectoryTokenizer
from ttlib.planning.beam import PlannerConfig, beam_plan, logits_along, tokens_fed
from ttlib.planning.decoders import AUTO_ON_CPU
from ttlib.planning.fast_decoder import BufferPool

__all__ = ["DECODERS", "PRESETS", "Preset", "Timed", "bench_decoding", "bench_planning", "cpu_model", "decoders_for",
           "environment", "faster_tt_planner", "matmul_rate", "plan_flops", "planner_for", "preset_name", "preset_of",
           "profile_planning", "random_model", "seconds", "spread", "timed", "timed_planner"]


@dataclass
class Preset:
    obs_dim: int  # observation dimensions
    act_dim: int  # action dimensions
    n_bins: int = 100  # bins per dimension
    n_layer: int = 4  # blocks
    n_embd: int = 128  # width
    n_head: int = 4  # heads
    n_transitions: int = 10  # model window in transitions
    beam_width: int = 32  # planner settings: faster-TT's evaluation setting
    horizon: int = 5
    context: int = 5
    sample_expand: int = 2


PRESETS = {
    "halfcheetah": Preset(obs_dim=17, act_dim=6),  # seq 10 * 25 = 250 tokens
    "lunarlander": Preset(obs_dim=8, act_dim=2),
    "tiny": Preset(obs_dim=3, act_dim=2, n_bins=20, n_layer=2, n_embd=32, n_head=2, beam_width=4, horizon=3,
                   context=3),
}


def preset_of(preset: str | Preset) -> Preset:
    """A preset by name (PRESETS), or a Preset given as it is (other sizes, e.g. a tiny model of HalfCheetah's
    shape)."""
    return PRESETS[preset] if isinstance(preset, str) else preset


def planner_for(preset: Preset) -> PlannerConfig:
    """The planner setting a preset names (faster-TT's evaluation setting for "halfcheetah")."""
    return PlannerConfig(beam_width=preset.beam_width, horizon=preset.horizon, context=preset.context,
                         sample_expand=preset.sample_expand)


def random_model(preset: str | Preset, device="cpu", dtype=torch.float32, seed=0):
    """A randomly initialised model and a tokenizer fitted on Gaussian data, for timing only."""
    preset = preset_of(preset)
    torch.manual_seed(seed)
    config = GPTConfig(obs_dim=preset.obs_dim, act_dim=preset.act_dim, n_bins=preset.n_bins,
                       n_layer=preset.n_layer, n_head=preset.n_head, n_embd=preset.n_embd,
                       n_transitions=preset.n_transitions, dropout=0.0)
    model = TrajectoryGPT(config).to(device=device, dtype=dtype).eval()
    rows = np.random.default_rng(seed).normal(size=(2000, config.transition_dim))
    tokenizer = TrajectoryTokenizer.fit(rows, preset.obs_dim, preset.act_dim, preset.n_bins)
    return model, tokenizer


def seconds(fn) -> float:
    """Wall-clock seconds of one fn() call, the GPU's queue included."""
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    t = time.perf_counter()
    fn()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return time.perf_counter() - t


def timed(fn, repeats: int, warmup: int = 1) -> float:
    """Median wall-clock seconds of fn() over `repeats` runs after `warmup` runs."""
    if repeats < 1:
        raise ConfigError(f"repeats must be >= 1, got {repeats}")
    for _ in range(warmup):
        fn()
    return statistics.median(seconds(fn) for _ in range(repeats))


def spread(values) -> dict:
    """The median of repeated measurements and their range."""
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "n": len(values)}


def cpu_model() -> str:
    """The CPU's model name as lscpu gives it ("AMD EPYC", "Intel(R) Xeon(R) ..."): speed figures name it."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def preset_name(preset: str | Preset):
    """How a result names its preset: the name, or every size of a Preset given as it is."""
    return preset if isinstance(preset, str) else asdict(preset)


def environment(device: str = "cpu") -> dict:
    """Where a benchmark ran: the device it was given (its name, for a GPU), the CPU's model and vector
    instructions, torch's threads and version, and the load (runnable processes: above the cores, timings wait)."""
    device = torch.device(device)
    out = {"device": device.type, "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else None,
           "torch_threads": torch.get_num_threads(), "torch": torch.__version__, "cpu": cpu_model()}
    if hasattr(torch.backends.cpu, "get_cpu_capability"):
        out["cpu_isa"] = torch.backends.cpu.get_cpu_capability()  # the vector instructions PyTorch uses: AVX2, AVX512
    if hasattr(os, "getloadavg"):
        out["load_1min"] = round(os.getloadavg()[0], 2)
    out["cpu_cores"] = os.cpu_count()
    return out


def matmul_rate(device="cpu", dtype=torch.float32, n: int = 2048) -> float:
    """GFLOP/s of one product of two n x n matrices: how fast this machine multiplies large matrices, the rate no
    implementation of the planner can beat."""
    a, b = (torch.randn(n, n, device=device).to(dtype) for _ in range(2))
    torch.mm(a, b)  # warm-up: the library picks its kernel, the pages are touched
    return 2 * n**3 / seconds(lambda: torch.mm(a, b)) / 1e9


# ---- benchmarks ---------------------------------------------------------------------------------------------
def bench_decoding(preset: str | Preset = "halfcheetah", length: int | None = None, batch: int = 1,
                   repeats: int = 5, device: str = "cpu") -> dict:
    """Generate `length` tokens one by one: with the KV cache vs running the whole prefix again each time."""
    p = preset_of(preset)
    model, _ = random_model(p, device)
    length = length or model.config.block_size
    bins = torch.randint(0, p.n_bins, (batch, length), device=device)

    @torch.inference_mode()
    def cached():
        cache = model.new_cache(batch)
        for t in range(length):
            model(bins[:, t:t + 1], cache=cache, last_only=True)

    @torch.inference_mode()
    def recompute():
        for t in range(length):
            model(bins[:, :t + 1], last_only=True)

    t_cached = timed(cached, repeats)
    t_recompute = timed(recompute, repeats)
    return {"benchmark": "decoding", "preset": preset_name(preset), "length": length, "batch": batch,
            "tokens_per_s_cached": batch * length / t_cached, "tokens_per_s_recompute": batch * length / t_recompute,
            "speedup": t_recompute / t_cached, **environment(device)}


class Timed(NamedTuple):
    """One planner `ttlib bench planning` times: a decoder, and how the static search's units are launched."""
    decoder: str  # PlannerConfig.decoder
    graphs: bool = False  # on CUDA, replayed as CUDA graphs (BufferPool(graphs=...)); else launched kernel by kernel
    compile_step: bool = False  # PlannerConfig.compile_step


DECODERS = {  # the planners `ttlib bench planning` times side by side, by name
    "fused": Timed("fused"),  # fast_decoder.FusedDecoder, token by token from Python
    "static": Timed("static"),  # static_decoder, launched kernel by kernel
    "static graphs": Timed("static", graphs=True),  # the same, replayed as CUDA graphs (CUDA only)
    "static graphs compiled": Timed("static", graphs=True, compile_step=True),  # its step fused by torch.compile
    # first (gpu-check times it apart: its compile takes about a minute)
    "triton": Timed("triton"),  # its step one Triton kernel (triton_step; gpu-check's triton part), launched,
    "triton graphs": Timed("triton", graphs=True),  # or replayed as graphs
}


def timed_planner(preset: Preset, name: str) -> tuple[PlannerConfig, BufferPool]:
    """The planner DECODERS[name] times, and its buffers, kept from plan to plan as a rollout keeps them."""
    choice = DECODERS[name]
    planner = replace(planner_for(preset), decoder=choice.decoder, compile_step=choice.compile_step)
    return planner, BufferPool(graphs=choice.graphs)


def decoders_for(device: str) -> tuple:
    """What a device times: both ways on a CPU, and the replayed graphs beside them on a GPU; the default
    (what `beam_plan` picks there, in a rollout) first."""
    if torch.device(device).type == "cuda":
        return "static graphs", "static", "fused"
    return ("static", "fused") if AUTO_ON_CPU == "static" else ("fused", "static")


def bench_planning(preset: str | Preset = "halfcheetah", batch: int = 1, repeats: int = 5,
                   uncached_repeats: int = 1, device: str = "cpu", dtype: str = "float32", faster_tt: str | None = None,
                   faster_tt_repeats: int = 1, decoders: tuple | None = None) -> dict:
    """ms per beam_plan call (batch environments at once) for every decoder of `decoders` (default:
    decoders_for(device), the first being the default), timed in turn, each followed by a float32 product of
    two 2048 x 2048 matrices: a plan's time over `plan_flops / that rate` is one measurement of its
    `plan_over_floor` (median and range; `share_of_matmul_rate` is its inverse), and fused / other is one of its
    `speedup_vs_fused`. The top-level figures are the default decoder's: against the recomputing decoder
    (`uncached_repeats` plans), GFLOP/s, the fused plan's own matrix products replayed alone after each round
    (`ms_products_alone`, their ratios to the floor and to the plan), the largest difference of the cached and the
    recomputing decoder's logits along a plan (its first 4 environments). faster_tt: a checkout of faster-TT, whose
    batch_beam_plan is then timed alternately with ours on a model of the same shape, `faster_tt_repeats` times."""
    if repeats < 1:
        raise ConfigError(f"repeats must be >= 1, got {repeats}")
    decoders = tuple(decoders or decoders_for(device))
    p = preset_of(preset)
    model, tokenizer = random_model(p, device, getattr(torch, dtype))
    td = model.config.transition_dim
    prefix = torch.randint(0, p.n_bins, (batch, (p.context - 1) * td + p.obs_dim), device=device)
    keys, planners = torch.arange(batch), {name: timed_planner(p, name) for name in (*decoders, "fused")}

    def run(name):
        return beam_plan(model, tokenizer, prefix, keys, *planners[name])

    environment_before = environment(device)
    first_ms = {name: 1000 * seconds(lambda name=name: run(name)) for name in decoders}  # graphs: recorded here
    for name in decoders:
        run(name)  # warm-up
    products = recorded_products(lambda: run("fused"))
    products_alone = replay(products, device, model.pos_emb.dtype)
    products_alone()
    times, rates, alone = {name: [] for name in decoders}, [], []
    for _ in range(repeats):  # each plan, the products alone, then the yardstick: load that comes and goes slows all
        for name in decoders:
            times[name].append(seconds(lambda name=name: run(name)))
        alone.append(seconds(products_alone))
        rates.append(matmul_rate(device))
    out = _planning_figures(model, planner_for(p), batch, times, rates, alone, products, first_ms)
    default = decoders[0]
    recompute = replace(planner_for(p), decoder="recompute")
    t_uncached = timed(lambda: beam_plan(model, tokenizer, prefix, keys, recompute), uncached_repeats, warmup=0) \
        if uncached_repeats > 0 else float("nan")
    plan = run(default)  # the decoders on the same tokens (the default's plan): their largest logit difference
    recomputed = logits_along(model, prefix[:4], plan.bins[:4], "recompute")
    out.update({"benchmark": "planning", "preset": preset_name(preset), "batch": batch, "beam_width": p.beam_width,
                "horizon": p.horizon, "context": p.context, "sample_expand": p.sample_expand,
                "seq_len": model.config.block_size + 1, "dtype": dtype,
                "tokens_fed_per_plan": tokens_fed(p.obs_dim, p.act_dim, p.horizon),
                "ms_per_plan_uncached": 1000 * t_uncached, "speedup": t_uncached / (out["ms_per_plan_cached"] / 1000),
                "max_logit_gap": float((logits_along(model, prefix[:4], plan.bins[:4]) - recomputed).abs().max()),
                "max_abs_logit": float(recomputed.abs().max())})
    for name in ("static graphs", "static graphs compiled"):  # what recording (and compiling) cost, what failed
        if name in planners and planners[name][1].kept:
            kept = next(iter(planners[name][1].kept.values()))
            out["graphs" if name == "static graphs" else "compiled"] = kept.runner.stats()
    if faster_tt:
        theirs = faster_tt_planner(faster_tt, p, batch, device)
        faster_tt_planner(faster_tt, p, 1, device)()  # warm-up, on one environment
        pairs = [(seconds(theirs), seconds(lambda: run(default))) for _ in range(faster_tt_repeats)]
        out["faster_tt_ms_per_plan"] = spread([1000 * theirs_s for theirs_s, _ in pairs])
        out["speedup_vs_faster_tt"] = spread([theirs_s / ours_s for theirs_s, ours_s in pairs])
    environment_after = environment(device)
    return {**out, **environment_after, "load_1min": [environment_before.get("load_1min"),
                                                      environment_after.get("load_1min")]}


def _planning_figures(model, planner, batch, times: dict, rates: list, alone: list, products: list,
                      first_ms: dict) -> dict:
    """The planning benchmark's ratios, from the seconds of every decoder's plans, the matmul rates and the
    products alone measured beside them (the first decoder of `times` is the default)."""
    flops = plan_flops(model.config, planner, batch)
    floor = [flops / (rate * 1e9) for rate in rates]  # seconds, one per round

    def over_floor(seconds):
        return [t / f for t, f in zip(seconds, floor, strict=True)]

    per_decoder = {name: {"ms_per_plan": spread([1000 * t for t in ts]), "plan_over_floor": spread(over_floor(ts)),
                          "share_of_matmul_rate": spread([1 / r for r in over_floor(ts)]),
                          "first_plan_ms": first_ms[name]} for name, ts in times.items()}
    for name, ts in times.items() if "fused" in times else ():
        if name != "fused":
            per_decoder[name]["speedup_vs_fused"] = spread([f / t for f, t in zip(times["fused"], ts, strict=True)])
    default, ts = next(iter(times.items()))
    t = statistics.median(ts)
    return {"default_decoder": default, "decoders": per_decoder, "ms_per_plan_cached": 1000 * t,
            "gflop_per_plan": flops / 1e9, "gflops_achieved": flops / 1e9 / t,
            "matmul_gflops": statistics.median(rates), "floor_ms": 1000 * flops / (statistics.median(rates) * 1e9),
            "plan_over_floor": per_decoder[default]["plan_over_floor"],
            "share_of_matmul_rate": per_decoder[default]["share_of_matmul_rate"],
            "gflop_linear_made": product_flops(products, LINEAR_PRODUCTS) / 1e9,
            "gflop_attention_made": product_flops(products, ATTENTION_PRODUCTS) / 1e9,
            "ms_products_alone": 1000 * statistics.median(alone),
            "products_alone_over_floor": spread(over_floor(alone)),
            "plan_over_products_alone": spread([t / a for t, a in zip(ts, alone, strict=True)])}


def faster_tt_planner(checkout: str, preset: Preset, batch: int, device="cpu"):
    """faster-TT's `batch_beam_plan` (github.com/Howuhh/faster-trajectory-transformer) on a randomly initialised
    model of the preset's shape, imported from a checkout of it: returns plan(), one call for `batch` random
    contexts with faster-TT's evaluation settings (top-k off, greedy observations). Nothing of it is copied here.

    Its package `trajectory.models.gpt` also imports its trainer (wandb, gym), which planning does not use: the
    package is registered without running that file, and its modules are imported one by one."""
    import importlib

    root = Path(checkout).resolve()
    if not (root / "trajectory" / "planning" / "beam.py").is_file():
        raise ConfigError(f"no faster-TT checkout at {checkout} (trajectory/planning/beam.py is missing): clone "
                          "github.com/Howuhh/faster-trajectory-transformer there")
    if str(root) not in sys.path:
        sys.path.insert(0, str(root))
    if "trajectory.models.gpt" not in sys.modules:
        package = types.ModuleType("trajectory.models.gpt")
        package.__path__ = [str(root / "trajectory" / "models" / "gpt")]
        sys.modules["trajectory.models.gpt"] = package
    GPT = importlib.import_module("trajectory.models.gpt.gpt").GPT
    beam = importlib.import_module("trajectory.planning.beam")
    beam.trange = lambda n, **kwargs: range(n)  # no progress bar per plan
    Discretizer = importlib.import_module("trajectory.utils.discretization").KBinsDiscretizer

    torch.manual_seed(0)
    td = preset.obs_dim + preset.act_dim + 2
    model = GPT(vocab_size=preset.n_bins, transition_dim=td, observation_dim=preset.obs_dim,
                action_dim=preset.act_dim, seq_len=preset.n_transitions * td, embedding_dim=preset.n_embd,
                num_layers=preset.n_layer, num_heads=preset.n_head, use_sep_heads=True).to(device).eval()
    discretizer = Discretizer(np.random.default_rng(0).normal(size=(2000, td)), preset.n_bins, "uniform")
    discretizer.to(device)
    context = torch.randint(0, preset.n_bins, (batch, (preset.context - 1) * td + preset.obs_dim), device=device)

    def plan():
        return beam.batch_beam_plan(model, discretizer, context, steps=preset.horizon, beam_width=preset.beam_width,
                                    sample_expand=preset.sample_expand, discount=0.99, context_size=preset.context)
    return plan


def profile_planning(preset: str | Preset = "halfcheetah", batch: int = 1, device: str = "cpu") -> dict:
    """Where one cached plan's time goes: shares of self time by kind of operation (torch.profiler)."""
    from torch.profiler import ProfilerActivity, profile

    p = preset_of(preset)
    model, tokenizer = random_model(p, device)
    planner = planner_for(p)
    prefix = torch.randint(0, p.n_bins, (batch, (p.context - 1) * model.config.transition_dim + p.obs_dim),
                           device=device)
    buffers = BufferPool()
    beam_plan(model, tokenizer, prefix, torch.arange(batch), planner, buffers)  # warm-up
    plan_s = seconds(lambda: beam_plan(model, tokenizer, prefix, torch.arange(batch), planner, buffers))
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        beam_plan(model, tokenizer, prefix, torch.arange(batch), planner, buffers)
    kinds = {"matmul: linear layers and heads": LINEAR_PRODUCTS,
             "matmul: attention (scores, weighted values)": ATTENTION_PRODUCTS,
             "softmax, gelu, layer norm": ("aten::_softmax", "aten::gelu", "aten::native_layer_norm"),
             "copies (cache writes, beam selection, cat)": ("aten::copy_", "aten::index_select", "aten::cat",
                                                            "aten::index")}
    shares = dict.fromkeys([*kinds, "everything else (small ops, views, Python)"], 0.0)
    total = sum(e.self_cpu_time_total for e in prof.key_averages())
    for e in prof.key_averages():
        kind = next((k for k, ops in kinds.items() if e.key in ops), "everything else (small ops, views, Python)")
        shares[kind] += e.self_cpu_time_total / total
    ops = sum(e.count for e in prof.key_averages() if e.key.startswith("aten::"))
    return {"benchmark": "planning-profile", "preset": preset_name(preset), "batch": batch, "aten_ops_per_plan": ops,
            "op_time_ms": total / 1000, "plan_ms_unprofiled": 1000 * plan_s,  # (the profiler's own cost shows)
            "time_shares": {k: round(v, 3) for k, v in shares.items()},
            **environment(device)}
