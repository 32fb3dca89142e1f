"""Benchmarks of whole runs: rollouts (vectorized against one by one), training, evaluation over Ray workers.

    ttlib bench rollouts                  vectorized vs sequential evaluation of the same episodes
    ttlib bench training                  training tokens/s
    ttlib bench distributed               episodes/s on 1, 2, 4 Ray workers, both layouts; Ray's per-call cost

Like `bench.py`'s, every figure is measured side by side in one run; the rollout benchmark uses the shipped
checkpoint on the course environment, or a random model of a preset's shape.
"""

from __future__ import annotations

import time

import numpy as np
import torch

from ttlib.bench.decoding import Preset, environment, planner_for, preset_name, preset_of, random_model, timed
from ttlib.errors import ConfigError
from ttlib.planning.beam import PlannerConfig

__all__ = ["bench_distributed", "bench_rollouts", "bench_training"]


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
    from ttlib.evaluation.rollout import evaluate
    from ttlib.training.checkpoints import default_checkpoint, load_checkpoint

    if repeats < 1:
        raise ConfigError(f"repeats must be >= 1, got {repeats}")
    k = episodes if sequential_episodes is None else sequential_episodes
    if not 1 <= k <= episodes:
        raise ConfigError(f"sequential_episodes must be between 1 and episodes ({episodes}), got {k}")
    if preset is None:
        model, tokenizer, payload = load_checkpoint(checkpoint or default_checkpoint(), device=device)
        env_id, env_kwargs = payload["dataset"]["env_id"], payload["dataset"]["env_kwargs"]
        planner = planner or PlannerConfig(beam_width=8, horizon=3, sample_expand=2, context=3)
    else:
        if env_id is None:
            raise ConfigError("a preset's random model needs an environment of its shape: pass env_id")
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
    return {"benchmark": "rollouts", "env_id": env_id, "preset": None if preset is None else preset_name(preset),
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
    return {"benchmark": "training", "preset": preset_name(preset), "batch_size": batch_size, "seq_len": T,
            "tokens_per_s": batch_size * T / seconds, "ms_per_step": 1000 * seconds, **environment(device)}


def bench_distributed(workers=(1, 2, 4), episodes: int = 8, max_steps: int = 20, checkpoint: str | None = None,
                      planner: PlannerConfig | None = None, num_cpus: int | None = None, call_repeats: int = 200,
                      progress: bool = False) -> dict:
    """The same episodes in one process and on K Ray workers, local and central inference: episodes/s, whether
    the returns are identical, and what one call to an actor costs next to an in-process call."""
    from ttlib.evaluation.ray_cluster import connect
    from ttlib.evaluation.ray_evaluation import LocalWorker, RayEvaluator
    from ttlib.evaluation.rollout import EpisodeBatch, PlannerAgent, evaluate
    from ttlib.planning.beam import course_planner
    from ttlib.training.checkpoints import default_checkpoint, load_checkpoint

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
                        contexts = PlannerAgent(None, tokenizer, planner)  # a central environment worker's
                        batch = EpisodeBatch(contexts, info["env_id"], seeds, info["env_kwargs"]).reset()
                        prefix, keys = contexts.request(batch.observations())
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
