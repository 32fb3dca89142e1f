"""Benchmarks: every speed claim of the course is measured here, side by side in one run, as ratios.

    ttlib bench decoding                  cached vs recompute decoding, tokens/s, at a sequence of 250
    ttlib bench planning --batch 1        cached vs uncached beam search, ms per plan, GFLOP/s achieved, and how
                                          far from the machine's float32 FLOP floor (--faster-tt DIR: side by side
                                          with faster-TT's batch_beam_plan from a checkout of it)
    ttlib bench rollouts                  vectorized vs sequential evaluation of the same episodes
    ttlib bench profile                   where a cached plan's time goes, by kind of operation
    ttlib bench training                  training tokens/s
    ttlib bench distributed               episodes/s on 1, 2, 4 Ray workers, both layouts; Ray's per-call cost

Timings are medians of several runs after warm-up. Costs do not depend on the weights, so the presets use
random weights; the rollout benchmark uses the shipped checkpoint on the course environment.

The FLOP floor: a plan's matmul FLOPs (`plan_flops`) divided by the rate at which this machine multiplies two
large float32 matrices (`matmul_rate`), the fastest any implementation could go. The planning benchmark times a
plan and that product alternately and reports their ratio, so that a busy machine slows both alike; the
figure travels across CPUs where an absolute time does not. Beside them it times the plan's own matrix products
alone (recorded from one plan, replayed at their own sizes with nothing between them): how far those are from the
floor is what the matrix library does at a beam search's sizes; how far the plan is from them is everything else.
"""

from __future__ import annotations

import os
import platform
import statistics
import sys
import time
import types
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch

from .fast_decoder import BufferPool
from .model import GPTConfig, TrajectoryGPT
from .planning import PlannerConfig, beam_plan, logits_along, tokens_fed
from .tokenizer import TrajectoryTokenizer


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
        raise ValueError(f"repeats must be >= 1, got {repeats}")
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


def _name(preset: str | Preset):
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


# ---- FLOP counting ------------------------------------------------------------------------------------------
def token_flops(config: GPTConfig, keys: int, head: bool) -> int:
    """Matmul FLOPs to push one token through the model when it attends to `keys` tokens."""
    C = config.n_embd
    per_layer = 2 * 12 * C * C + 2 * 2 * keys * C  # qkv + proj + mlp, then q.k and weights.v over all heads
    return config.n_layer * per_layer + (2 * C * config.n_bins if head else 0)


def plan_flops(config: GPTConfig, planner: PlannerConfig, batch: int, attention: bool = True) -> int:
    """Matmul FLOPs of one cached beam_plan call for `batch` environments (counted the way beam_plan runs).
    attention=False: the linear layers' and heads' alone."""
    O, A, td = config.obs_dim, config.act_dim, config.transition_dim
    P = (planner.context - 1) * td + O
    flops = batch * sum(token_flops(config, (p + 1) * attention, head=p == P - 1) for p in range(P))  # the context
    W, X, pos = planner.beam_width, planner.sample_expand, P
    for t in range(planner.horizon):
        fed = [W * X] * (A + 1)  # action tokens and the reward, on every child
        if t < planner.horizon - 1:
            fed += [W] * (1 + O)  # value and next observation, on the survivors
        for rows in fed:
            pos += 1
            flops += batch * rows * token_flops(config, pos * attention, head=True)  # (no keys: linear alone)
    return flops


# ---- the products a plan makes, without the plan ----------------------------------------------------------
LINEAR_PRODUCTS = ("aten::mm", "aten::addmm", "aten::linear", "aten::matmul")  # the linear layers and heads
ATTENTION_PRODUCTS = ("aten::bmm", "aten::baddbmm", "aten::baddbmm_")  # scores and weighted values


def recorded_products(fn) -> list:
    """The matrix products one fn() call makes, in order, as (operation, input shapes), seen where PyTorch
    dispatches each operation to its kernel. (The context's attention, one fused `scaled_dot_product_attention`
    per layer, is not among them.)"""
    from torch.utils._python_dispatch import TorchDispatchMode

    products = []

    class Recorder(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            name = f"aten::{func.overloadpacket.__name__}"
            if name in LINEAR_PRODUCTS + ATTENTION_PRODUCTS:
                products.append((name, [list(a.shape) for a in args[:3] if isinstance(a, torch.Tensor)]))
            return func(*args, **(kwargs or {}))

    with Recorder():
        fn()
    return products


def product_flops(products: list, kinds: tuple) -> int:
    """FLOPs of the recorded products of the given kinds: 2 per multiply-add."""
    flops = 0
    for name, shapes in products:
        if name in kinds:  # a (.., M, K) times b (.., K, N) or (K,); linear: b is the weight, (N, K)
            a, b = shapes[1:3] if name in ("aten::addmm", "aten::baddbmm", "aten::baddbmm_") else shapes[:2]
            flops += 2 * int(np.prod(a)) * (b[0] if name == "aten::linear" else b[-1] if len(b) > 1 else 1)
    return flops


def replay(products: list, device="cpu", dtype=torch.float32):
    """fn() that makes the same products in the same order and nothing else: one tensor per shape, reused, as a
    plan reuses its weights. Timed beside the plan, it says how much of the plan is its matrix products at their
    own sizes, and how far those alone are from the FLOP floor."""
    tensors = {}

    def tensor(shape):
        if tuple(shape) not in tensors:
            tensors[tuple(shape)] = torch.randn(shape, device=device).to(dtype)
        return tensors[tuple(shape)]

    ops = {"aten::mm": torch.mm, "aten::addmm": torch.addmm, "aten::linear": torch.nn.functional.linear,
           "aten::matmul": torch.matmul, "aten::bmm": torch.bmm,
           "aten::baddbmm": torch.baddbmm, "aten::baddbmm_": torch.Tensor.baddbmm_}
    calls = [(ops[name], [tensor(shape) for shape in shapes]) for name, shapes in products]

    @torch.inference_mode()
    def run():
        for op, args in calls:
            op(*args)
    return run


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
    return {"benchmark": "decoding", "preset": _name(preset), "length": length, "batch": batch,
            "tokens_per_s_cached": batch * length / t_cached, "tokens_per_s_recompute": batch * length / t_recompute,
            "speedup": t_recompute / t_cached, **environment(device)}


def bench_planning(preset: str | Preset = "halfcheetah", batch: int = 1, repeats: int = 5,
                   uncached_repeats: int = 1, device: str = "cpu", dtype: str = "float32", faster_tt: str | None = None,
                   faster_tt_repeats: int = 1) -> dict:
    """ms per beam_plan call (batch environments at once), cached and uncached, GFLOP/s achieved, and the ratio
    to the FLOP floor: each timed plan is followed by a float32 product of two 2048 x 2048 matrices, and the plan's
    time over `plan_flops / that rate` is one measurement of `plan_over_floor` (median and range reported;
    `share_of_matmul_rate` is its inverse); the plan's own matrix products replayed alone after each plan
    (`ms_products_alone`, and their ratios to the floor and to the plan); the largest difference of the two
    decoders' logits along the cached plan, beside the largest logit. faster_tt: a checkout of faster-TT, whose
    batch_beam_plan is then timed alternately with ours on a model of the same shape, `faster_tt_repeats` times."""
    p = preset_of(preset)
    model, tokenizer = random_model(p, device, getattr(torch, dtype))
    planner = planner_for(p)
    td = model.config.transition_dim
    prefix = torch.randint(0, p.n_bins, (batch, (p.context - 1) * td + p.obs_dim), device=device)
    keys = torch.arange(batch)
    buffers = BufferPool()  # kept from one plan to the next, as a rollout keeps them

    def run(use_cache=True):
        planner.use_cache = use_cache
        return beam_plan(model, tokenizer, prefix, keys, planner, buffers)

    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    environment_before = environment(device)
    flops = plan_flops(model.config, planner, batch)
    run(), run()  # warm-up
    products = recorded_products(run)
    products_alone = replay(products, device, model.pos_emb.dtype)
    products_alone()
    times, rates, alone = [], [], []
    for _ in range(repeats):  # a plan, its products alone, then the yardstick: load that comes and goes slows all
        times.append(seconds(run))
        alone.append(seconds(products_alone))
        rates.append(matmul_rate(device))
    over_floor = [t / (flops / (rate * 1e9)) for t, rate in zip(times, rates, strict=True)]
    alone_over_floor = [t / (flops / (rate * 1e9)) for t, rate in zip(alone, rates, strict=True)]
    t_cached = statistics.median(times)
    t_uncached = timed(lambda: run(False), uncached_repeats, warmup=0) if uncached_repeats > 0 else float("nan")
    plan = run()  # the decoders on the same tokens (the cached plan's): their largest logit difference
    recomputed = logits_along(model, prefix, plan.bins, False)
    logit_gap = float((logits_along(model, prefix, plan.bins, True) - recomputed).abs().max())
    out = {"benchmark": "planning", "preset": _name(preset), "batch": batch, "beam_width": p.beam_width,
           "horizon": p.horizon, "context": p.context, "sample_expand": p.sample_expand,
           "seq_len": model.config.block_size + 1, "tokens_fed_per_plan": tokens_fed(p.obs_dim, p.act_dim,
                                                                                    p.horizon),
           "ms_per_plan_cached": 1000 * t_cached, "ms_per_plan_uncached": 1000 * t_uncached,
           "speedup": t_uncached / t_cached, "max_logit_gap": logit_gap,
           "max_abs_logit": float(recomputed.abs().max()), "gflop_per_plan": flops / 1e9,
           "gflops_achieved": flops / 1e9 / t_cached, "dtype": dtype,
           "matmul_gflops": statistics.median(rates), "floor_ms": 1000 * flops / (statistics.median(rates) * 1e9),
           "plan_over_floor": spread(over_floor), "share_of_matmul_rate": spread([1 / r for r in over_floor]),
           "gflop_linear_made": product_flops(products, LINEAR_PRODUCTS) / 1e9,
           "gflop_attention_made": product_flops(products, ATTENTION_PRODUCTS) / 1e9,
           "ms_products_alone": 1000 * statistics.median(alone), "products_alone_over_floor": spread(alone_over_floor),
           "plan_over_products_alone": spread([t / a for t, a in zip(times, alone, strict=True)])}
    if faster_tt:
        theirs = faster_tt_planner(faster_tt, p, batch, device)
        faster_tt_planner(faster_tt, p, 1, device)()  # warm-up, on one environment
        pairs = [(seconds(theirs), seconds(run)) for _ in range(faster_tt_repeats)]
        out["faster_tt_ms_per_plan"] = spread([1000 * theirs_s for theirs_s, _ in pairs])
        out["speedup_vs_faster_tt"] = spread([theirs_s / ours_s for theirs_s, ours_s in pairs])
    environment_after = environment(device)
    return {**out, **environment_after, "load_1min": [environment_before.get("load_1min"),
                                                      environment_after.get("load_1min")]}


def faster_tt_planner(checkout: str, preset: Preset, batch: int, device="cpu"):
    """faster-TT's `batch_beam_plan` (github.com/Howuhh/faster-trajectory-transformer) on a randomly initialised
    model of the preset's shape, imported from a checkout of it: returns plan(), one call for `batch` random
    contexts with faster-TT's evaluation settings (top-k off, greedy observations). Nothing of it is copied here.

    Its package `trajectory.models.gpt` also imports its trainer (wandb, gym), which planning does not use: the
    package is registered without running that file, and its modules are imported one by one."""
    import importlib

    root = Path(checkout).resolve()
    if not (root / "trajectory" / "planning" / "beam.py").is_file():
        raise ValueError(f"no faster-TT checkout at {checkout} (trajectory/planning/beam.py is missing): clone "
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
    return {"benchmark": "planning-profile", "preset": _name(preset), "batch": batch, "aten_ops_per_plan": ops,
            "op_time_ms": total / 1000, "plan_ms_unprofiled": 1000 * plan_s,  # (the profiler's own cost shows)
            "time_shares": {k: round(v, 3) for k, v in shares.items()},
            **environment(device)}


def bench_rollouts(episodes: int = 25, max_steps: int = 50, checkpoint: str | None = None,
                   planner: PlannerConfig | None = None, repeats: int = 3, preset: str | Preset | None = None,
                   env_id: str | None = None, device: str = "cpu", sequential_episodes: int | None = None) -> dict:
    """The same episodes evaluated vectorized (one batch) and sequentially (one by one): median seconds of
    `repeats` runs each, after a two-step warm-up of both.

    By default the shipped checkpoint plans in its own environment. With `preset`, a randomly initialised model
    of that preset's shape plans in `env_id` with the preset's planner -- what a plan costs does not depend on
    the weights (faster-TT's headline: preset "halfcheetah", 25 episodes of 1,000 steps in HalfCheetah-v5).
    `sequential_episodes`: play only the first k episodes one by one (default: all), for when all of them would
    take too long; the speedup then compares the time per episode."""
    from .rollout import evaluate
    from .train import default_checkpoint, load_checkpoint

    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    k = episodes if sequential_episodes is None else sequential_episodes
    if not 1 <= k <= episodes:
        raise ValueError(f"sequential_episodes must be between 1 and episodes ({episodes}), got {k}")
    if preset is None:
        model, tokenizer, payload = load_checkpoint(checkpoint or default_checkpoint(), device=device)
        env_id, env_kwargs = payload["dataset"]["env_id"], payload["dataset"]["env_kwargs"]
        planner = planner or PlannerConfig(beam_width=8, horizon=3, sample_expand=2, context=3)
    else:
        if env_id is None:
            raise ValueError("a preset's random model needs an environment of its shape: pass env_id")
        model, tokenizer = random_model(preset, device)
        env_kwargs, planner = None, planner or planner_for(preset_of(preset))
    seeds = list(range(1000, 1000 + episodes))

    def run(seeds, vectorized, steps=max_steps):
        return evaluate(model, tokenizer, env_id, seeds, planner, env_kwargs=env_kwargs, vectorized=vectorized,
                        max_steps=steps, progress=False)

    run(seeds, True, steps=2)  # warm-up
    run(seeds[:k], False, steps=2)
    vec, seq = [run(seeds, True) for _ in range(repeats)], [run(seeds[:k], False) for _ in range(repeats)]
    vec_s, seq_s = float(np.median([r.seconds for r in vec])), float(np.median([r.seconds for r in seq]))
    same = all(np.array_equal(v.returns[:k], s.returns) for v in vec for s in seq)
    return {"benchmark": "rollouts", "env_id": env_id, "preset": None if preset is None else _name(preset),
            "episodes": episodes, "steps": vec[0].steps, "max_steps": max_steps, "repeats": repeats,
            "vectorized_s": vec_s, "sequential_episodes": k, "sequential_steps": seq[0].steps,
            "sequential_s": seq_s, "speedup": (seq_s / k) / (vec_s / episodes), "same_returns": same,
            "beam_width": planner.beam_width, "horizon": planner.horizon,
            "dtype": str(model.pos_emb.dtype).removeprefix("torch."), **environment(device)}


def bench_training(preset: str | Preset = "lunarlander", batch_size: int = 64, steps: int = 20,
                   device: str = "cpu") -> dict:
    """Training tokens/s (forward + backward + AdamW) on random windows of the model's length."""
    p = preset_of(preset)
    model, _ = random_model(p, device)
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    T = model.config.block_size
    x = torch.randint(0, p.n_bins, (batch_size, T + 1), device=device)

    def step():
        _, loss = model(x[:, :-1], x[:, 1:])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()

    seconds = timed(step, steps, warmup=3)
    return {"benchmark": "training", "preset": _name(preset), "batch_size": batch_size, "seq_len": T,
            "tokens_per_s": batch_size * T / seconds, "ms_per_step": 1000 * seconds, **environment(device)}


def bench_distributed(workers=(1, 2, 4), episodes: int = 8, max_steps: int = 20, checkpoint: str | None = None,
                      planner: PlannerConfig | None = None, num_cpus: int | None = None, call_repeats: int = 200,
                      progress: bool = False) -> dict:
    """The same episodes in one process and on K Ray workers, local and central inference: episodes/s, whether
    the returns are identical, and what one call to an actor costs next to an in-process call."""
    from .distributed import LocalWorker, RayEvaluator, connect
    from .planning import course_planner
    from .rollout import EpisodeBatch, evaluate
    from .train import default_checkpoint, load_checkpoint

    model, tokenizer, payload = load_checkpoint(checkpoint or default_checkpoint(), device="cpu")
    info = payload["dataset"]
    planner = planner or course_planner(beam_width=8)
    seeds = list(range(2000, 2000 + episodes))
    one = evaluate(model, tokenizer, info["env_id"], seeds, planner, env_kwargs=info["env_kwargs"],
                   max_steps=max_steps, progress=False)
    out = {"benchmark": "distributed", "episodes": episodes, "max_steps": max_steps, "steps": one.steps,
           "beam_width": planner.beam_width, "horizon": planner.horizon, "in_process_episodes_per_s":
           episodes / one.seconds, "in_process_torch_threads": torch.get_num_threads()}
    ray, started = connect(num_cpus=num_cpus)
    try:
        out["cluster_cpus"] = float(ray.cluster_resources().get("CPU", 0))
        for central in (False, True):
            layout = "central" if central else "local"
            for k in workers:
                with RayEvaluator(model, tokenizer, info["env_id"], k, central, info["env_kwargs"]) as evaluator:
                    result = evaluator.evaluate(seeds, planner, max_steps, progress=progress)
                    out[f"{layout}_{k}_episodes_per_s"] = episodes / result.seconds
                    out[f"{layout}_{k}_same_returns"] = bool(np.array_equal(result.returns, one.returns))
                    if not central and k == workers[0]:  # one round trip to an actor, empty and with contexts
                        batch = EpisodeBatch(info["env_id"], seeds, tokenizer, planner.context, info["env_kwargs"])
                        _, prefix, keys = batch.reset().observe()
                        batch.close()
                        message = {"prefix": prefix.numpy(), "keys": keys.numpy()}  # what a worker sends per step
                        out["ray_call_us"] = 1e6 * evaluator.call_seconds(call_repeats)
                        out["ray_call_with_contexts_us"] = 1e6 * evaluator.call_seconds(call_repeats, message)
        again = evaluate(model, tokenizer, info["env_id"], seeds, planner, env_kwargs=info["env_kwargs"],
                         max_steps=max_steps, progress=False)  # once more at the end: load drifts during the run
        out["in_process_episodes_per_s"] = episodes / min(one.seconds, again.seconds)
        worker = object.__new__(LocalWorker)  # the same method, called in this process
        t = time.perf_counter()
        for _ in range(call_repeats * 100):
            worker.ping(message)
        out["in_process_call_us"] = 1e6 * (time.perf_counter() - t) / (call_repeats * 100)
    finally:
        if started:
            ray.shutdown()
    return {**out, **environment()}
