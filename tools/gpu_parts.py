"""gpu-check's parts that run in a process of their own (`tools/gpu_check.py` starts them): each returns its figures,
and `save(figures)` keeps what it has measured so far, so that a part stopped at its time limit still says something.

    probe      which device PyTorch sees, and the versions that matter
    dataset    the course dataset, built if missing (the notebooks read it)
    planning   one plan at faster-TT's HalfCheetah setting, float32, at batch 1, 25 and 100, every decoder side by
               side (`bench.bench_planning`: on CUDA the static search replayed as CUDA graphs, the same launched
               kernel by kernel, and the fused decoder), with the share of the device's matmul rate
    rollouts   25 HalfCheetah-v5 episodes of 1,000 steps planned together, with steps per second and the projected
               total saved as it goes
    triton     the static search with its decoding step one Triton kernel (decoder="triton"), replayed as CUDA graphs,
               beside the graphs and the fused decoder at batch 1, 25 and 100, with the kernels of one plan
               (torch.profiler) and whether it makes the same plan (only when asked for: --parts ... triton)
    training   training tokens/s, on the device and on the CPU (only when asked for: --parts ... training)
    notebook   one notebook with nbclient, saving which cell runs
"""

from __future__ import annotations

import os
import platform
import re
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]  # the repository checkout
SMOKE_DATASET_EPISODES = 12
ROLLOUT_ENV = "HalfCheetah-v5"
PLANNING_BATCHES = (1, 25, 100)  # smoke: (1, 2)


def part_probe(args, save) -> dict:
    """Which device the check runs on, and the versions that matter."""
    import gymnasium
    import torch

    cuda = torch.cuda.is_available()
    device = ("cuda" if cuda else "cpu") if args.device == "auto" else args.device
    if torch.device(device).type == "cuda" and not cuda:
        raise SystemExit(f"gpu-check: --device {device}, but PyTorch sees no CUDA device")
    return {"device": device, "device_name": torch.cuda.get_device_name(device) if device != "cpu" else
            platform.processor() or platform.machine(), "torch": torch.__version__, "cuda": torch.version.cuda,
            "python": platform.python_version(), "cpu_count": os.cpu_count(), "gymnasium": gymnasium.__version__}


def part_dataset(args, save) -> dict:
    from ttlib.data import trajectories as data

    present = {row["id"]: row for row in data.list_local()}
    built = data.DEFAULT_DATASET not in present
    if built:
        data.build(n_episodes=SMOKE_DATASET_EPISODES if args.smoke else None, progress=False)
        present = {row["id"]: row for row in data.list_local()}
    row = present[data.DEFAULT_DATASET]
    return {"dataset": row["id"], "built": built, "episodes": row["episodes"], "steps": row["steps"]}


def part_planning(args, save) -> dict:
    """Every decoder side by side at each batch, float32; saved after each batch."""
    from ttlib.bench import decoding as bench

    preset = "tiny" if args.smoke else "halfcheetah"
    runs = []
    for batch in (1, 2) if args.smoke else PLANNING_BATCHES:
        runs.append(bench.bench_planning(preset, batch=batch, repeats=1 if args.smoke else 5, device=args.device,
                                         uncached_repeats=1 if args.smoke else 0))
        save({"runs": runs})  # what was measured survives the part's time limit
    return {"runs": runs}


def part_compiled(args, save) -> dict:
    """The static search with its step fused by torch.compile, replayed as graphs, beside the graphs alone, at
    batch 1 and 25 (float32): whether compiling pays, and what it costs once (first_plan_ms)."""
    from ttlib.bench import decoding as bench

    preset = "tiny" if args.smoke else "halfcheetah"
    runs = []
    for batch in (1, 2) if args.smoke else (1, 25):
        runs.append(bench.bench_planning(preset, batch=batch, repeats=1 if args.smoke else 5, device=args.device,
                                         uncached_repeats=0, decoders=("static graphs compiled", "static graphs")))
        save({"runs": runs})
    return {"runs": runs}


TRITON_SMOKE = dict(obs_dim=2, act_dim=2, n_bins=12, n_layer=1, n_embd=32, n_head=2, n_transitions=4, beam_width=2,
                    horizon=1, context=2)  # a smoke run's model on the CPU, where Triton's interpreter is slow


def part_triton(args, save) -> dict:
    """The Triton step beside the graphs and the fused decoder at each batch (float32; on a CPU, a smoke run under
    Triton's interpreter: launched, beside the static search launched), then each one's kernels per plan."""
    from ttlib.bench import decoding as bench

    cuda = args.device != "cpu"
    preset = bench.PRESETS["halfcheetah"] if not args.smoke else bench.Preset(**TRITON_SMOKE)
    decoders = ("triton graphs", "static graphs", "fused") if cuda else ("triton", "static")
    out = {"decoders": list(decoders), "runs": []}
    for batch in PLANNING_BATCHES if not args.smoke else (1,):
        run = bench.bench_planning(preset, batch=batch, repeats=1 if args.smoke else 5, device=args.device,
                                   uncached_repeats=0, decoders=decoders)
        run["kernels_per_plan"], run["same_plan"] = kernels_per_plan(preset, batch, args.device, decoders)
        out["runs"].append(run)
        save(out)  # what was measured survives the part's time limit
    return out


def kernels_per_plan(preset, batch: int, device: str, decoders) -> tuple[dict, dict]:
    """Each decoder's kernels in one plan (kept planners, after a plan that records their graphs), as
    torch.profiler sees them: kernels run on the GPU, kernel launches and graph launches by the host; and whether
    each decoder's plan is the first one's (the same tokens; float32, so a near-tie may part them)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    from ttlib.bench import decoding as bench
    from ttlib.planning.beam import beam_plan

    model, tokenizer = bench.random_model(preset, device)
    prefix = torch.randint(0, preset.n_bins, (batch, (preset.context - 1) * model.config.transition_dim
                                              + preset.obs_dim), generator=torch.Generator().manual_seed(batch))
    counts, plans = {}, {}
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device != "cpu" else [])
    for name in decoders:
        planner, pool = bench.timed_planner(preset, name)
        plans[name] = beam_plan(model, tokenizer, prefix.to(device), torch.arange(batch), planner, pool)
        with profile(activities=activities) as prof:
            beam_plan(model, tokenizer, prefix.to(device), torch.arange(batch), planner, pool)
            if device != "cpu":
                torch.cuda.synchronize()
        events = prof.events()
        host = [e.name for e in events if e.device_type == torch.autograd.DeviceType.CPU]
        counts[name] = {"gpu_kernels": sum(e.device_type == torch.autograd.DeviceType.CUDA for e in events),
                        "kernel_launches": sum(n.startswith(("cudaLaunchKernel", "cuLaunchKernel")) for n in host),
                        "graph_launches": sum(n.startswith("cudaGraphLaunch") for n in host),
                        "aten_ops": sum(n.startswith("aten::") for n in host)}
    first = plans[decoders[0]]
    same = {name: {"bins": bool(torch.equal(plan.bins, first.bins)),
                   "max_score_gap": float((plan.score - first.score).abs().max())} for name, plan in plans.items()}
    return counts, same


def part_training(args, save) -> dict:
    from ttlib.bench import runs as bench_runs

    preset, batch, steps = ("tiny", 8, 3) if args.smoke else ("halfcheetah", 64, 20)
    out = {"device": bench_runs.bench_training(preset, batch_size=batch, steps=steps, device=args.device)}
    save(out)
    if args.device != "cpu":  # the same model on this machine's CPU, for the ratio
        out["cpu"] = bench_runs.bench_training(preset, batch_size=batch, steps=5, device="cpu")
        out["speedup_vs_cpu"] = out["device"]["tokens_per_s"] / out["cpu"]["tokens_per_s"]
    return out


def part_rollouts(args, save) -> dict:
    """The episodes of a random model of the halfcheetah preset's shape (smoke: a tiny one), all planned together
    as `rollout.evaluate` plans them (rollout's loop); every few seconds the steps so far, steps per second and the
    total they project are saved."""
    from dataclasses import replace

    from ttlib.bench import decoding as bench
    from ttlib.evaluation.rollout import EpisodeBatch, PlannerAgent
    from ttlib.planning.fast_decoder import BufferPool

    preset = replace(bench.PRESETS["tiny"], obs_dim=17, act_dim=6, n_layer=1, horizon=2, context=2) \
        if args.smoke else bench.PRESETS["halfcheetah"]  # smoke: a tiny model of HalfCheetah's shape
    episodes, steps = (3, 10) if args.smoke else (25, 1000)
    model, tokenizer = bench.random_model(preset, args.device)
    planner, pool = bench.planner_for(preset), BufferPool()
    out = {"env_id": ROLLOUT_ENV, "preset": "smoke" if args.smoke else "halfcheetah", "episodes": episodes,
           "max_steps": steps, "planned_steps": 0, "beam_width": planner.beam_width, "horizon": planner.horizon}
    start, saved = time.perf_counter(), [time.perf_counter()]

    def report():
        saved[0], seconds = time.perf_counter(), time.perf_counter() - start
        out.update(seconds=seconds, steps_per_s=out["planned_steps"] / seconds,
                   projected_s=episodes * steps * seconds / out["planned_steps"],
                   graphs=[p.runner.stats() for p in pool.kept.values()])
        save(out)

    class Reporting(PlannerAgent):  # the planner, saving how far it got every few seconds
        def act(self, observations):
            actions = super().act(observations)
            out["planned_steps"] += len(observations)
            if time.perf_counter() - saved[0] > 2:
                report()
            return actions

    batch = EpisodeBatch(Reporting(model, tokenizer, planner, buffers=pool), ROLLOUT_ENV,
                         list(range(1000, 1000 + episodes)), None, steps)
    try:
        played = batch.reset().play()
        report()
    finally:
        batch.close()
    return {**out, "vectorized_s": out["seconds"], "steps": int(sum(played.lengths)),
            "returns": [round(float(r), 2) for r in played.returns]}


def part_notebook(args, save) -> dict:
    """Run one notebook with nbclient, in the notebooks folder, as a learner's kernel would."""
    import nbformat
    from nbclient.exceptions import CellExecutionError, CellTimeoutError, DeadKernelError

    from ttlib.grading.nbrun import PollingNotebookClient  # a widget cell's reply is not missed (jupyter/nbclient#312)

    path = Path(args.notebook) if os.sep in args.notebook else ROOT / "notebooks" / args.notebook
    nb = nbformat.read(path, as_version=4)
    started, began, seconds = time.monotonic(), {}, {}  # when each code cell began; how long each took

    def slowest() -> dict:
        return dict(sorted(seconds.items(), key=lambda kv: -kv[1])[:5])

    def cell_starts(cell, cell_index, **_):  # saved as it happens: a notebook killed at its limit says where
        if cell.cell_type == "code":
            began[cell_index] = time.monotonic()
            save({"outcome": "running", "cell": cell_index, "cell_id": cell.get("id"),
                  "source": cell.source.splitlines()[:1], "at_s": round(began[cell_index] - started, 1),
                  "slowest_cells_s": slowest()})

    def cell_ends(cell, cell_index, **_):
        if cell_index in began:
            seconds[f"{cell_index} {cell.get('id')}"] = round(time.monotonic() - began[cell_index], 1)

    client = PollingNotebookClient(nb, timeout=args.cell_timeout, kernel_name="python3",
                                   resources={"metadata": {"path": str(path.parent)}},
                                   on_cell_start=cell_starts, on_cell_complete=cell_ends)
    try:
        client.execute()
    except (CellExecutionError, CellTimeoutError, DeadKernelError) as error:
        return {"outcome": "failed", **where_it_failed(nb, error)}
    return {"outcome": "passed", "cells": sum(c.cell_type == "code" for c in nb.cells),
            "slowest_cells_s": slowest()}


def where_it_failed(nb, error) -> dict:
    """The failing cell (its index, id, first line) and the error, from an executed notebook."""
    failure = {"error": type(error).__name__, "message": _plain(str(error))[-1500:]}
    for index, cell in enumerate(nb.cells):
        errors = [o for o in cell.get("outputs", []) if o.get("output_type") == "error"]
        if errors:
            failure.update(cell=index, cell_id=cell.get("id"), source=cell.source.splitlines()[:1],
                           ename=errors[0]["ename"], evalue=_plain(errors[0]["evalue"])[:500])
            missing = re.match(r"No module named '([\w.]+)'", failure["evalue"])
            if errors[0]["ename"] == "ModuleNotFoundError" and missing:
                failure["missing_module"] = missing.group(1).split(".")[0]
            break
    return failure


def _plain(text: str) -> str:
    return re.sub(r"\x1b\[[0-9;]*m", "", text)  # tracebacks come coloured


PART_FUNCTIONS = {"probe": part_probe, "dataset": part_dataset, "planning": part_planning, "compiled": part_compiled,
                  "triton": part_triton, "training": part_training, "rollouts": part_rollouts,
                  "notebook": part_notebook}
