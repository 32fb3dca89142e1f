"""Running a decoding step: launched kernel by kernel, or recorded once as a CUDA graph and replayed.

On a GPU every PyTorch operation is a kernel launch that costs the host several microseconds, and a planner's
decoding step at beam-search sizes is a hundred small kernels whose arithmetic takes less time than launching
them: the GPU waits on the host. A CUDA graph records the kernels of one call, with the memory they read and
write, and replays all of them with one launch. That is only correct for a call that does the same thing every
time -- the same kernels on the same tensors at the same addresses -- which is what `static_decoder`'s steps are
built for: their shapes never change, and what changes from one token to the next (positions, cache slots, which
rows see which slots) is read from tensors.

A runner runs such a unit of work, a function of no arguments, under a name that says which unit it is:

    runner.run(name, fn)   # Eager: fn(). CUDAGraphs: the first call runs fn and records it; later calls replay

Everything here but `_capture` and `graph.replay()` runs on any device: the tests run it on the CPU, where the
capture fails for real and the runner goes on eagerly, and gpu-check runs it on the GPU.
"""

from __future__ import annotations

import time
import warnings

import torch

__all__ = ["CUDAGraphs", "Eager", "compiled"]


class Eager:
    """Every unit launched operation by operation, as written."""

    static = False  # the steps may read just the cache slots in use (a CUDA graph must read all of them)

    def run(self, name, fn) -> None:
        fn()

    def stats(self) -> dict:
        return {"runner": "eager"}


class CUDAGraphs:
    """Every unit recorded as a CUDA graph the first time it runs, and replayed from then on.

    If a capture fails, the runner says why (a warning, and `failed`, the first reason; `failures` has them all)
    and runs that unit eagerly from then on: the plans stay correct, only slower. Keep the runner as long as the
    tensors the units read and write: a graph replays on their memory."""

    static = True

    def __init__(self):
        self.graphs = {}  # name -> the recorded torch.cuda.CUDAGraph
        self.pool = None  # the graphs' memory pool, shared: no graph's temporaries outlive its replay
        self.failed = None  # why the first capture that failed did (None: none did)
        self.failures = {}  # name -> why its capture failed (it runs eagerly)
        self.capture_s = 0.0  # seconds spent recording graphs
        self.replays = 0  # units replayed as graphs
        self.eager_runs = 0  # units run eagerly (each first run, and everything after a failed capture)

    def run(self, name, fn) -> None:
        graph = self.graphs.get(name)
        if graph is not None:
            graph.replay()
            self.replays += 1
            return
        self.eager_runs += 1
        if name in self.failures:
            fn()
            return
        self._warm_up(fn)  # the real work of this call, and what the capture needs done once before it
        start = time.perf_counter()
        try:
            self.graphs[name] = self._capture(fn)
        except Exception as error:  # noqa: BLE001 -- any reason at all: go on eagerly and say why
            why = f"capturing {name!r} failed, running it eagerly: {type(error).__name__}: {error}"
            self.failures[name] = why
            if self.failed is None:  # (said once)
                self.failed = why
                warnings.warn(f"CUDA graphs: {why}", RuntimeWarning, stacklevel=2)
        self.capture_s += time.perf_counter() - start

    def _warm_up(self, fn) -> None:
        """Run fn once on a side stream, as PyTorch asks before a capture (lazy initialisation happens there)."""
        if not torch.cuda.is_available():
            fn()  # (no side stream without CUDA; the capture then fails, and says so)
            return
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            fn()
        torch.cuda.current_stream().wait_stream(side)

    def _capture(self, fn):
        """Record fn's kernels without running them; -> the graph. The only lines here that need CUDA."""
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            fn()
        self.pool = self.pool if self.pool is not None else graph.pool()
        return graph

    def stats(self) -> dict:
        return {"runner": "cuda-graphs", "graphs": len(self.graphs), "capture_s": round(self.capture_s, 3),
                "replays": self.replays, "eager_runs": self.eager_runs, "failed": self.failed,
                "units_failed": len(self.failures)}


def compiled(fn, runner):
    """fn compiled by torch.compile (one graph, static shapes), which fuses its small elementwise kernels -- layer
    norms, GELU, softmax, the masks -- into a few generated ones; the runner still records and replays the result.
    If compiling fails, the reason goes where the runner keeps its failures, a warning says it once, and fn runs
    as written from then on."""
    state = {"fn": torch.compile(fn, fullgraph=True, dynamic=False)}

    def run(*args):
        try:
            return state["fn"](*args)
        except Exception as error:  # noqa: BLE001 -- any reason at all: go on as written and say why
            if state["fn"] is fn:
                raise
            why = f"torch.compile failed, running the step as written: {type(error).__name__}: {error}"
            if hasattr(runner, "failures"):
                runner.failures["compile"] = why
                runner.failed = runner.failed or why
            warnings.warn(why, RuntimeWarning, stacklevel=2)
            state["fn"] = fn
            return fn(*args)

    return run
