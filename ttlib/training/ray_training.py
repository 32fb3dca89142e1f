"""Data-parallel training on a Ray cluster: Ray finds room for the workers, torchrun's agents run them.

`ttlib train --workers N --ray HOST:PORT` (ttlib.training.data_parallel.train(..., launch=on_cluster(ADDRESS))) joins
the cluster -- the one notebook 08 and `ttlib evaluate --address` use -- and starts N `Agent` actors wherever it has a
GPU (or, without GPUs, CPUs) free. Each actor runs torchrun's elastic agent for one worker process, and the agents
meet at a rendezvous store that the first one hosts (c10d). Everything after the placement is torchrun's, as on one
machine: the ranks, the process group, and starting all the workers again from the last checkpoint when one dies.
Ray does what a cluster's scheduler does -- find room, start a process there, stop it again -- and nothing more.

The launching process loads the data once; it reaches every worker through Ray's object store. Rank 0 writes the
checkpoints wherever it runs, and every worker reads the one it resumes from, so --out (and --resume) must be on
storage the machines share (a network file system, or one machine). The progress bar here follows the checkpoint.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import socket
import uuid

from tqdm.auto import tqdm

from ttlib.evaluation.ray_cluster import DistributedError, connect
from ttlib.training.checkpoint_files import CheckpointError
from ttlib.training.checkpoints import read_checkpoint
from ttlib.training.data_parallel import Run, failure_message, file_identity, worker_main
from ttlib.training.train import TrainingError

__all__ = ["Agent", "READY_SECONDS", "launch_on_ray", "on_cluster"]

READY_SECONDS = 120  # how long the cluster may take to find room for every worker


class Agent:
    """Hosts torchrun's elastic agent for one worker process, on whichever machine Ray put this actor."""

    def where(self) -> tuple[str, int]:
        """(this machine's address, a free port on it): where the first agent hosts the rendezvous."""
        import ray

        host = ray.util.get_node_ip_address()
        with socket.socket() as probe:
            probe.bind((host, 0))
            return host, probe.getsockname()[1]

    def run(self, run: Run, device_type: str, agents: int, endpoint: str, host: bool, max_restarts: int,
            run_id: str, threads: int) -> dict:
        """worker_main in one process under torchrun's agent, one of `agents` that meet at `endpoint`.
        -> {rank: what it returned}, or {"failed": why} once the workers failed more than max_restarts times."""
        import os

        import ray
        from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
        from torch.distributed.launcher.api import LaunchConfig, elastic_launch

        os.environ["OMP_NUM_THREADS"] = str(threads)  # the worker uses the CPUs Ray gave this actor
        launch = LaunchConfig(min_nodes=agents, max_nodes=agents, nproc_per_node=1, run_id=run_id,
                              rdzv_backend="c10d", rdzv_endpoint=endpoint, rdzv_configs={"is_host": host},
                              max_restarts=max_restarts, monitor_interval=0.5, start_method="spawn",
                              local_addr=ray.util.get_node_ip_address())
        try:
            return elastic_launch(launch, worker_main)(run, device_type)
        except ChildFailedError as failure:
            return {"failed": failure_message(failure, max_restarts, run.out)}


def on_cluster(address: str):
    """data_parallel.train's `launch` for the Ray cluster at `address`."""
    return functools.partial(launch_on_ray, address)


def launch_on_ray(address: str, workers: int, max_restarts: int, run: Run) -> dict:
    """Run worker_main(run) in `workers` processes on the Ray cluster at `address` (see the module's docstring).
    -> {rank: what worker_main returned}."""
    ray, started = connect(address)
    agents = []
    try:
        device_type, resources = _placement(ray, workers, run.config.device)
        agents = [ray.remote(Agent).options(**resources).remote() for _ in range(workers)]
        ready, _ = ray.wait([agent.where.remote() for agent in agents], num_returns=workers, timeout=READY_SECONDS)
        if len(ready) < workers:
            raise DistributedError(f"the Ray cluster at {address} found room for {len(ready)} of {workers} workers "
                                   f"({resources}) in {READY_SECONDS} s: use fewer --workers, or add machines")
        host, port = ray.get(agents[0].where.remote())
        shared = ray.put(dataclasses.replace(run, progress=False))  # rank 0's bar would print on its machine
        threads, run_id = max(1, int(resources["num_cpus"])), f"ttlib-{uuid.uuid4().hex[:12]}"  # one run: one id
        refs = [agent.run.remote(shared, device_type, workers, f"{host}:{port}", i == 0, max_restarts, run_id,
                                 threads) for i, agent in enumerate(agents)]
        returned = _wait_with_progress(ray, refs, run)
    finally:
        for agent in agents:
            ray.kill(agent)
        if started:
            ray.shutdown()
    failed = [r["failed"] for r in returned if "failed" in r]
    if failed:
        raise TrainingError(failed[0])
    return {rank: value for r in returned for rank, value in r.items()}


def _placement(ray, workers: int, device: str) -> tuple[str, dict]:
    """("cuda" or "cpu", what each worker's actor asks Ray for): a GPU each where the cluster has one per worker
    (unless --device cpu), else an equal share of its CPUs."""
    gpus = ray.cluster_resources().get("GPU", 0)
    if device == "cuda" and gpus < workers:
        raise DistributedError(f"{workers} workers on GPUs need {workers} GPUs; the cluster has {gpus:g}")
    if device in ("cuda", "auto") and gpus >= workers:
        return "cuda", {"num_gpus": 1, "num_cpus": 1}
    cpus = ray.cluster_resources().get("CPU", 1)
    return "cpu", {"num_cpus": max(1, int(cpus // workers))}


def _wait_with_progress(ray, refs: list, run: Run) -> list:
    """ray.get(refs), with a progress bar that follows the steps of the checkpoint rank 0 writes."""
    bar = tqdm(total=run.config.steps, desc=f"training on {len(refs)} Ray workers", disable=not run.progress)
    pending, seen = refs, run.fresh
    while pending:
        _, pending = ray.wait(refs, num_returns=len(refs), timeout=2.0)
        if run.out is not None and file_identity(run.out) not in (None, seen):  # a new checkpoint
            seen = file_identity(run.out)
            with contextlib.suppress(CheckpointError):
                bar.n = read_checkpoint(run.out)["step"]
                bar.refresh()
    bar.close()
    return ray.get(refs)
