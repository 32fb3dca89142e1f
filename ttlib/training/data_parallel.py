"""Data-parallel training: one batch split over several processes, and the loss of the whole batch on every one.

Every worker holds a copy of the model, and PyTorch's DistributedDataParallel (DDP) keeps the copies equal: during
backward it averages the workers' gradients, so every copy takes the same step. Every step, every worker draws the
same batch of windows and keeps its own slice of it (ttlib.training.train.get_batch's `shard`): N workers see exactly
the batch one process sees.

The loss needs care. The Trajectory GPT's loss is a weighted mean over the batch's *real* targets, and windows
padded at an episode's end have fewer of them. Each worker's slice holds its own count, so if every worker
backpropagated its own mean, DDP's average would follow the mean of the workers' means -- which weighs a target on
a half-empty slice more than one on a full slice: not the batch's loss, nor its gradient. `shard_objective` makes
the slices add up: each worker's sum of weighted losses over the count of real targets of the WHOLE batch (the
workers' counts summed by an all-reduce), times the number of workers, which DDP's average divides out again.

Who runs what. `train(config, workers=N)` loads and checks the data, and the checkpoint it resumes from, in this
process -- a bad input is said here, once -- then hands N worker processes on this machine to torchrun's elastic
agent (torch.distributed.launcher, PyTorch's own launcher): gloo on CPUs, nccl on GPUs (one GPU per worker).
Each worker runs ttlib.training.train.train as one `Worker` of the run; rank 0 writes the checkpoints (atomically, in
the usual format) and shows the progress bar. When a worker dies, the agent stops the others and starts them all
again (up to `max_restarts` times), and they go on from the run's last checkpoint. With
`launch=ray_training.on_cluster(ADDRESS)` the same workers run on the machines of a Ray cluster
(ttlib.training.ray_training).
"""

from __future__ import annotations

import os
import signal
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.distributed as dist

from ttlib.course import threads
from ttlib.data import trajectories as ttdata
from ttlib.errors import ConfigError, TTLibError
from ttlib.model.gpt import GPTConfig, TrajectoryGPT
from ttlib.model.tokenizer import TrajectoryTokenizer
from ttlib.training.checkpoints import check_resume, pick_device, read_checkpoint
from ttlib.training.train import Shard, TrainConfig, TrainingError, TrainResult, fit_recipe, kind_sums, load_and_split
from ttlib.training.train import train as train_one

__all__ = ["Run", "SUM_BUFFERS", "Worker", "all_reduce_sum", "bench", "check_workers", "failure_message",
           "file_identity", "join_group", "launch_here", "portable", "random_dataset", "resume_point",
           "shard_objective", "shard_sums", "train", "worker_main"]


# ---- the piece that makes slices add up -------------------------------------------------------------------------
def shard_objective(loss_sum: torch.Tensor, n_real: torch.Tensor, world_size: int, all_reduce):
    """One worker's part of the whole batch's loss -> (what it backpropagates, the whole batch's loss).

    loss_sum: () this worker's sum of weighted losses over its real targets (with its gradient); n_real: () its
    count of real targets; all_reduce(t): sums the tensor t over the workers, in place (torch.distributed's).
    DDP averages the workers' gradients, so `world_size * loss_sum / (the batch's count)` averages to the gradient
    of the batch's loss, sum over workers of loss_sum / the batch's count. A batch without one real target has
    loss 0 (as the model's own loss: its count counts as 1)."""
    totals = torch.stack([loss_sum.detach(), n_real.to(loss_sum.dtype)])  # (2,): this worker's sum and count
    all_reduce(totals)  # (2,): the whole batch's
    batch_real = totals[1].clamp(min=1)
    return loss_sum * (world_size / batch_real), totals[0] / batch_real


def shard_sums(mean_loss: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(sum of weighted losses over the real targets, their count) of a slice, from the model's loss -- their ratio,
    with the count taken as at least 1 -- and the slice's target mask (B, T)."""
    n_real = mask.sum()
    return mean_loss * n_real.clamp(min=1), n_real


# torch.distributed sums a tensor on a thread of its own, which lets go of it a moment after the sum. On torch 2.4
# (gloo), when Python has dropped the tensor by then, freeing it takes Python's interpreter lock, which
# destroy_process_group holds while it waits for that thread: a worker hung at the end of its run, now and then.
# So every sum goes through a buffer that lives as long as the process (one per shape and dtype: a few tiny ones).
SUM_BUFFERS: dict[tuple, torch.Tensor] = {}


@torch.no_grad()
def all_reduce_sum(tensor: torch.Tensor) -> None:
    """Sums `tensor` over the workers, in place, as torch.distributed.all_reduce does -- through SUM_BUFFERS."""
    key = (tuple(tensor.shape), tensor.dtype, tensor.device)
    if key not in SUM_BUFFERS:
        SUM_BUFFERS[key] = torch.empty(tensor.shape, dtype=tensor.dtype, device=tensor.device)
    buffer = SUM_BUFFERS[key]
    buffer.copy_(tensor)
    dist.all_reduce(buffer)  # the default operation is the sum
    tensor.copy_(buffer)


@dataclass
class Worker(Shard):
    """One worker of a data-parallel run (see ttlib.training.train.Shard): it computes its slice of every batch through
    DDP and backpropagates `objective`'s part of the batch's loss (notebook 08 trains with the learner's)."""
    objective: Callable = shard_objective  # (loss_sum, n_real, world_size, all_reduce) -> (objective, batch loss)
    ddp: torch.nn.Module | None = field(default=None, repr=False)  # the model inside DDP (after `wrap`)

    def wrap(self, model: torch.nn.Module, seed: int) -> None:
        if self.rank:  # dropout: other random masks on every slice, as one process draws them for its batch
            torch.manual_seed(seed + self.rank)
        ids = [self.device] if self.device is not None and self.device.type == "cuda" else None
        self.ddp = torch.nn.parallel.DistributedDataParallel(model, device_ids=ids)

    def step_loss(self, model, batch) -> tuple[torch.Tensor, float]:
        inputs, targets, mask = batch  # this worker's slice: (B / world_size, T) each
        _, mean_loss = self.ddp(inputs, targets, mask)  # through DDP: backward averages the gradients
        objective, batch_loss = self.objective(*shard_sums(mean_loss, mask), self.world_size, all_reduce_sum)
        return objective, float(batch_loss)

    def eval_loss(self, model, batch) -> float:
        _, mean_loss = model(*batch)  # the model itself: there is no gradient to share
        return float(shard_objective(*shard_sums(mean_loss, batch[2]), self.world_size, all_reduce_sum)[1])

    def eval_kinds(self, model, batch) -> torch.Tensor:
        sums = kind_sums(model, *batch)  # (2, kinds) of this worker's slice
        all_reduce_sum(sums)  # every worker's: the whole batch's, the same on every worker
        return sums


# ---- one worker process -------------------------------------------------------------------------------------------
@dataclass
class Run:
    """What every worker of a run is handed (pickled into its process)."""
    config: TrainConfig  # with the settings fitted to the data already
    data: ttdata.OfflineDataset  # loaded and checked by the launching process
    out: str | None  # the checkpoint rank 0 writes
    resume: str | None  # the checkpoint to go on from, if any
    fresh: tuple | None  # what was at `out` when the run was launched (file_identity): not the run's own
    dtype: torch.dtype = torch.float32  # the model's
    objective: Callable | bytes | None = None  # see Worker; bytes: by value (`portable`)
    progress: bool = True  # rank 0 shows a progress bar


def worker_main(run: Run, device_type: str) -> dict | None:
    """What every worker process runs (torchrun's agent sets RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE and
    where to meet). Rank 0 returns what the launching process needs; errors that every worker meets alike (bad
    data, a checkpoint that does not fit, a diverged loss) come back as {"error": ...}: a restart would not help."""
    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank, local_size = int(os.environ["LOCAL_RANK"]), int(os.environ["LOCAL_WORLD_SIZE"])
    if device_type == "cuda":
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
        threads.fit(None if os.environ.get("OMP_NUM_THREADS") else max(1, (os.cpu_count() or 1) // local_size))
    join_group("nccl" if device_type == "cuda" else "gloo")
    try:
        objective = run.objective
        if isinstance(objective, bytes):  # written in a notebook: it came by value (see `portable`)
            import cloudpickle

            objective = cloudpickle.loads(objective)
        go_on_from = resume_point(run.out, run.resume, run.fresh)
        resumed_from = read_checkpoint(go_on_from)["step"] if go_on_from is not None and rank == 0 else None
        result = train_one(run.config, out=run.out, resume=go_on_from, data=run.data, progress=run.progress,
                           dtype=run.dtype, shard=Worker(rank, world_size, device, objective or shard_objective))
    except TTLibError as error:  # TrainingError, CheckpointError, DatasetError among them: not a bug
        return {"error": error} if rank == 0 else None
    finally:
        dist.destroy_process_group()
    if rank:
        return None
    return {"model_config": result.model.config_dict(), "model": result.model.cpu().state_dict(),
            "last_weights": result.last_weights, "tokenizer": result.tokenizer.state_dict(),
            "history": result.history, "tokens_per_second": result.tokens_per_second, "config": result.config,
            "best": result.best, "restarts": int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")),
            "resumed_from": resumed_from}


def join_group(backend: str) -> None:
    """Join the run's process group where torchrun's agent says (MASTER_ADDR, MASTER_PORT), under keys of this
    start of the workers: after a restart the agent's store still holds the last start's addresses, and gloo
    would try to reach the dead workers at them. (The agents start their workers again together, each counting
    the start: a dead worker's peers fail in their next all-reduce.)"""
    store, rank, world_size = next(dist.rendezvous("env://"))
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    dist.init_process_group(backend, store=dist.PrefixStore(f"ttlib/start-{attempt}", store), rank=rank,
                            world_size=world_size)


def resume_point(out: str | None, resume: str | None, fresh: tuple | None) -> str | None:
    """Where a worker goes on from: the run's own last checkpoint at `out`, once the run has written one (the
    workers were started again: `fresh` is what was at `out` when the run was launched), else `resume` (or None)."""
    if out is not None and file_identity(out) not in (None, fresh):
        return out
    return resume


def file_identity(path: str | None) -> tuple | None:
    """What tells one version of a file from another (a checkpoint is written anew and renamed into place)."""
    try:
        info = os.stat(path)
    except (OSError, TypeError):
        return None
    return info.st_ino, info.st_mtime_ns, info.st_size


# ---- launching the workers --------------------------------------------------------------------------------------
def train(config: TrainConfig | None = None, out: str | None = None, resume: str | None = None,
          data: ttdata.OfflineDataset | None = None, workers: int = 2, *, launch: Callable | None = None,
          max_restarts: int = 3, dtype: torch.dtype = torch.float32, objective: Callable | None = None,
          progress: bool = True) -> TrainResult:
    """ttlib.training.train.train on `workers` processes of this machine (or, with
    launch=ray_training.on_cluster(ADDRESS), of a Ray cluster), each computing a slice of every batch; the same result
    as one process. A worker that dies makes all of them start again from the last checkpoint at `out`, up to
    `max_restarts` times. objective: what turns a worker's slice into its part of the batch's loss (default
    `shard_objective`)."""
    config = config or TrainConfig()
    device_type = pick_device(config.device).type
    check_workers(workers, config.batch_size, device_type, local=launch is None)
    data, train_data, _ = load_and_split(config, data, config.gamma, progress)  # bad data: said here, once
    config, note = fit_recipe(config, train_data.n_steps)
    if note and progress:
        print(f"{data.dataset_id}: {note}")
    if resume is not None:
        check_resume(config, read_checkpoint(resume), resume)
    run = Run(config, data, out, resume, file_identity(out), dtype, portable(objective), progress)
    if launch is not None:  # elsewhere (ray_training.on_cluster)
        returned = launch(workers, max_restarts, run)
    else:
        returned = launch_here(workers, max_restarts, (run, device_type))
    summary = next(r for r in returned.values() if r is not None)  # rank 0's
    if "error" in summary:
        raise summary["error"]
    model = TrajectoryGPT(GPTConfig(**summary["model_config"])).to(dtype)
    model.load_state_dict(summary["model"])
    return TrainResult(model.eval(), TrajectoryTokenizer.from_state_dict(summary["tokenizer"]), summary["history"],
                       summary["tokens_per_second"], summary["config"], summary["best"], summary["last_weights"],
                       restarts=summary["restarts"], resumed_from=summary["resumed_from"])


def check_workers(workers: int, batch_size: int, device_type: str, local: bool = True) -> None:
    """A clear error for a run that cannot be split: no workers, fewer windows than workers, too few GPUs."""
    if workers < 1:
        raise ConfigError(f"--workers must be at least 1, got {workers}")
    if batch_size < workers:
        raise ConfigError(f"a batch of {batch_size} windows cannot be split over {workers} workers: give every "
                          f"worker at least one (--batch-size {workers} or more, or fewer --workers)")
    if local and device_type == "cuda" and torch.cuda.device_count() < workers:
        raise ConfigError(f"{workers} workers on the GPU need {workers} GPUs (one each); this machine has "
                          f"{torch.cuda.device_count()}: use fewer --workers, or --device cpu")


def portable(function: Callable | None):
    """`function` as it can travel to a worker process: itself when the worker can import it, else by value -- a
    function written in a notebook lives in no module a new process can import (cloudpickle, which gymnasium
    brings, carries its code)."""
    if function is None or getattr(function, "__module__", "__main__") != "__main__":
        return function
    import cloudpickle

    return cloudpickle.dumps(function)


def launch_here(workers: int, max_restarts: int, args: tuple) -> dict:
    """Run worker_main(*args) in `workers` processes of this machine under torchrun's elastic agent (what
    `torchrun --standalone --nproc-per-node N` does, called as a function); meeting on the loopback interface.
    -> {rank: what worker_main returned}."""
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    launch = LaunchConfig(min_nodes=1, max_nodes=1, nproc_per_node=workers, run_id=f"ttlib-{uuid.uuid4().hex[:12]}",
                          rdzv_backend="c10d", rdzv_endpoint="127.0.0.1:0", max_restarts=max_restarts,
                          monitor_interval=0.5, start_method="spawn", local_addr="127.0.0.1")
    try:
        return elastic_launch(launch, worker_main)(*args)
    except ChildFailedError as failure:
        raise TrainingError(failure_message(failure, max_restarts, args[0].out)) from None
    except SignalException as stop:  # Ctrl-C reaches the agent, which stops the workers
        if stop.sigval == signal.SIGINT:
            raise KeyboardInterrupt from None
        raise


def failure_message(failure, max_restarts: int, out: str | None) -> str:
    """What to say when the workers failed more often than they may be started again."""
    rank, first = min(failure.failures.items())
    how = f"was stopped by {first.signal_name()}" if first.signal_name() != "<N/A>" else \
        f"ended with exit code {first.exitcode}"
    where = f"; the last checkpoint, {out}, is whole: go on with --resume {out}" if file_identity(out) else ""
    return (f"the training workers failed {max_restarts + 1} time(s), the last time worker {rank} {how} "
            f"(see its messages above){where}")


# ---- measured: tokens per second on 1 and more workers -------------------------------------------------------
def random_dataset(n_episodes: int, obs_dim: int, act_dim: int, lengths: tuple[int, int] = (100, 300),
                   seed: int = 0) -> ttdata.OfflineDataset:
    """Episodes of random numbers, of random lengths in [lengths[0], lengths[1]): data of a given shape for a
    benchmark or a test, without building or downloading a dataset."""
    rng = np.random.default_rng(seed)
    steps = rng.integers(*lengths, size=n_episodes)
    rewards = [rng.normal(size=T).astype(np.float32) for T in steps]
    return ttdata.OfflineDataset(
        f"random/{obs_dim}x{act_dim}-v0", None, {}, 0.99,
        [rng.normal(size=(T, obs_dim)).astype(np.float32) for T in steps],
        [rng.uniform(-1, 1, size=(T, act_dim)).astype(np.float32) for T in steps], rewards,
        [np.zeros(T, bool) for T in steps], [np.r_[np.zeros(T - 1, bool), True] for T in steps],
        [ttdata.discounted_values(r, 0.99) for r in rewards], None, None, None)


def bench(workers=(1, 2, 4), steps: int = 40, batch_size: int = 64, devices: tuple[str, ...] | None = None) -> dict:
    """Training tokens/s of the course's model (GPTConfig's defaults, LunarLander's 8 + 2 dimensions, batches of 64
    windows) on random episodes, side by side: one process (ttlib.training.train.train) and `workers` worker processes,
    on the CPU (every worker an equal share of its cores) and on the GPUs, one worker each (as many as there are).
    Throughput is the training loop's, as `ttlib train` reports it (start-up, data and tokenizer not counted)."""
    devices = devices or (("cpu", "cuda") if torch.cuda.is_available() else ("cpu",))
    data = random_dataset(60, obs_dim=8, act_dim=2)
    out = {"benchmark": "data-parallel", "steps": steps, "batch_size": batch_size, "cpu_cores": os.cpu_count(),
           "gpus": torch.cuda.device_count()}
    for device in devices:
        config = TrainConfig.from_settings(dict(steps=steps, eval_every=steps, eval_batches=1, warmup_steps=10,
                                                batch_size=batch_size, device=device))
        for k in workers:
            if device == "cuda" and k > torch.cuda.device_count():
                continue
            if k == 1:  # one process, as `ttlib train` without --workers (threads: as `ttlib bench` fitted them)
                result = train_one(config, data=data, progress=False)
            else:
                result = train(config, data=data, workers=k, progress=False)
            out[f"{device}_{k}_tokens_per_s"] = round(result.tokens_per_second)
    if torch.cuda.is_available():
        out["gpu"] = torch.cuda.get_device_name()
    return out
