"""Data-parallel training (ttlib.training.data_parallel): 2 worker processes make the parameters of one process, the
mean of the workers' mean losses does not, a worker killed mid-run ends in a resume from the last checkpoint, a
worker's sums cannot hang the end of its run, and a run that cannot be split says so in one line. Real processes
under torchrun's elastic agent, gloo on the CPU."""

import os
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np
import psutil
import pytest
import torch

from ttlib.cli.main import main
from ttlib.data.examples.pendulum_dataset import collect, write_dataset
from ttlib.evaluation import ray_cluster
from ttlib.training import data_parallel, ray_training
from ttlib.training.checkpoints import read_checkpoint
from ttlib.training.data_parallel import random_dataset
from ttlib.training.train import TrainConfig, train

pytestmark = pytest.mark.slow


# a few steps of a tiny model, on random episodes of 3 to 29 steps: with windows of 4 transitions many windows run past
# an episode's end, so the slices of a batch hold different numbers of real targets. Without dropout (one process
# draws its masks for the whole batch: slices cannot)
EXACT = dict(n_layer=1, n_head=2, n_embd=16, n_transitions=4, n_bins=10, dropout=0.0, batch_size=8, steps=6,
             eval_every=3, eval_batches=2, warmup_steps=2, val_fraction=0.2, device="cpu")


def mean_of_means(loss_sum, n_real, world_size, all_reduce):
    """The naive split: every worker backpropagates its own mean loss, and DDP averages the gradients."""
    mean = loss_sum / n_real.clamp(min=1)
    batch = mean.detach().clone()
    all_reduce(batch)
    return mean, batch / world_size


def largest_difference(a: torch.nn.Module, b: torch.nn.Module) -> float:
    theirs = b.state_dict()
    return max((v - theirs[k]).abs().max().item() for k, v in a.state_dict().items())


@pytest.fixture(scope="module")
def one_process():
    data = random_dataset(12, obs_dim=3, act_dim=1, lengths=(3, 30))
    return data, train(TrainConfig.from_settings(EXACT), data=data, progress=False, dtype=torch.float64)


def test_two_workers_make_the_parameters_of_one_process(one_process, tmp_path):
    data, one = one_process
    out = tmp_path / "two.pt"
    two = data_parallel.train(TrainConfig.from_settings(EXACT), out=str(out), data=data, workers=2,
                              dtype=torch.float64, progress=False)
    assert two.model.pos_emb.dtype == torch.float64
    assert largest_difference(one.model, two.model) < 1e-10  # float64: the sums differ in order only
    assert [row["step"] for row in two.history] == [row["step"] for row in one.history] == [0, 3, 5]
    np.testing.assert_allclose([r["val_loss"] for r in two.history], [r["val_loss"] for r in one.history],
                               rtol=1e-12)
    assert two.best["step"] == one.best["step"]
    payload = read_checkpoint(str(out))  # rank 0's checkpoint, in the usual format
    assert payload["step"] == 6 and all(torch.equal(v, payload["model"][k]) for k, v in two.model.state_dict().items())


def test_the_mean_of_the_workers_means_is_not_the_batchs_loss(one_process):
    data, one = one_process
    config = TrainConfig.from_settings(EXACT)
    # the first batch's two slices hold different numbers of real targets ...
    _, mask = train_windows(data, config)
    index = torch.randint(0, mask.shape[0], (config.batch_size,), generator=torch.Generator().manual_seed(0))
    counts = [float(mask[part, 1:].sum()) for part in index.tensor_split(2)]
    assert counts[0] != counts[1], counts
    # ... so the mean of the workers' means takes other steps than one process on the whole batch
    naive = data_parallel.train(config, data=data, workers=2, dtype=torch.float64, objective=mean_of_means,
                                progress=False)
    assert largest_difference(one.model, naive.model) > 1e-6


def test_on_a_ray_cluster_the_workers_make_the_parameters_of_one_process(one_process, tmp_path):
    """`--ray ADDRESS`: Ray places the two workers (here on a local 2-CPU cluster), torchrun's agents run them."""
    import ray

    data, one = one_process
    temp_dir = tempfile.mkdtemp(prefix="ttray-")  # short: Ray's socket paths must stay under 107 characters
    try:
        ray_module, started = ray_cluster.connect(num_cpus=2, temp_dir=temp_dir)
        address = ray_module.get_runtime_context().gcs_address
        two = data_parallel.train(TrainConfig.from_settings(EXACT), out=str(tmp_path / "two.pt"), data=data,
                                  workers=2, launch=ray_training.on_cluster(address), dtype=torch.float64,
                                  progress=False)
        assert ray.is_initialized() and not ray.util.list_named_actors()
    finally:
        ray.shutdown()
        shutil.rmtree(temp_dir, ignore_errors=True)
    assert largest_difference(one.model, two.model) < 1e-10
    assert read_checkpoint(str(tmp_path / "two.pt"))["step"] == 6


def test_the_exercises_workers_average_to_the_gradient_of_one_process():
    """Notebook 08's exercise 3 is checked on workers simulated by threads (ttlib.exercises.ray.run_shards):
    ttlib's answer there is one process's gradient on the whole batch, and the mean of the means is not."""
    from ttlib.exercises import Pieces
    from ttlib.exercises.ray import run_shards, slices_add_up

    for seed in range(4):
        model, inputs, targets, mask, sizes = trial = slices_add_up.make_trial(seed)
        outputs = list(run_shards(Pieces(slices_add_up.reference, "ttlib"), trial).values())
        naive = list(run_shards(Pieces({"shard_objective": mean_of_means}, "naive"), trial).values())
        model.zero_grad()
        _, loss = model(inputs, targets, mask)
        loss.backward()
        gradient = torch.cat([p.grad.flatten() for p in model.parameters()])
        torch.testing.assert_close(outputs[-1], gradient, rtol=1e-9, atol=1e-12)
        for batch_loss in outputs[:-1]:  # the same on every worker
            torch.testing.assert_close(batch_loss, loss.detach(), rtol=1e-9, atol=1e-12)
        counts = [int(part.sum()) for part in mask.split(sizes)]
        assert len(set(counts)) > 1, counts  # slices of unequal padding ...
        assert (naive[-1] - gradient).abs().max() > 1e-3 * gradient.abs().max()  # ... where the means do not add up


def test_a_worker_leaves_its_process_group_after_summing_a_tensor_it_dropped():
    """torch 2.4's gloo lets go of a summed tensor on its own thread; when Python has dropped the tensor, freeing it
    there takes the interpreter lock, which destroy_process_group holds while it waits for the thread. That hung the
    end of a run now and then; with torch.distributed.all_reduce in place of all_reduce_sum, this loop of one-worker
    groups hangs on torch 2.4.1 within its first hundred rounds."""
    rounds = (
        "import torch, torch.distributed as dist\n"
        "from ttlib.training.data_parallel import all_reduce_sum\n"
        "for _ in range(300):\n"
        "    dist.init_process_group('gloo', store=dist.HashStore(), rank=0, world_size=1)\n"
        "    all_reduce_sum(torch.ones(2, 4))  # dropped as soon as it is summed\n"
        "    dist.destroy_process_group()\n"
        "print('done')\n")
    try:
        done = subprocess.run([sys.executable, "-c", rounds], capture_output=True, text=True, timeout=180)
    except subprocess.TimeoutExpired:
        pytest.fail("destroy_process_group hung after an all_reduce_sum of a dropped tensor")
    assert done.returncode == 0 and done.stdout.strip() == "done", done.stderr[-2000:]


def train_windows(data, config):
    from ttlib.model.tokenizer import TrajectoryTokenizer
    from ttlib.training.train import load_and_split, window_tokens

    _, train_data, _ = load_and_split(config, data, config.gamma, progress=False)
    tokenizer = TrajectoryTokenizer.fit_dataset(train_data, config.model.n_bins, config.strategy)
    return window_tokens(train_data, tokenizer, config.model.n_transitions)


# ---- a worker killed mid-run -------------------------------------------------------------------------------------
TINY = ["--n-layer", "1", "--n-embd", "16", "--n-head", "2", "--n-transitions", "2", "--batch-size", "8",
        "--eval-batches", "1", "--n-bins", "10"]


def workers_of(launcher: subprocess.Popen) -> list[psutil.Process]:
    """The worker processes torchrun's agent started (multiprocessing's spawned children), newest first."""
    children = psutil.Process(launcher.pid).children(recursive=True)
    return sorted((c for c in children if "spawn_main" in " ".join(c.cmdline())), key=lambda c: -c.pid)


def test_a_killed_worker_ends_in_a_resume_from_the_last_checkpoint(minari_root, tmp_path):
    buffers, env, means = collect(6)  # 6 Pendulum episodes of 200 steps
    write_dataset("user/pendulum-v0", buffers, env, ref_min=means["random"], ref_max=means["expert"])
    out = tmp_path / "run" / "tt.pt"
    launcher = subprocess.Popen(
        [sys.executable, "-m", "ttlib", "train", "--dataset", "user/pendulum-v0", "--out", str(out), "--workers", "2",
         "--steps", "600", "--eval-every", "20", *TINY], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "OMP_NUM_THREADS": "1"})
    killed_at, deadline = None, time.monotonic() + 300
    while killed_at is None and launcher.poll() is None and time.monotonic() < deadline:
        if out.exists() and read_checkpoint(str(out))["step"] > 20:  # the second checkpoint is written
            killed_at = read_checkpoint(str(out))["step"]
            workers_of(launcher)[0].kill()  # SIGKILL: no clean-up, as when a machine goes away
        time.sleep(0.05)
    stdout, stderr = launcher.communicate(timeout=300)
    assert killed_at is not None and killed_at < 600, f"the run ended before a worker could be killed\n{stderr[-3000:]}"
    assert launcher.returncode == 0, stderr[-3000:]
    resumed = stdout.strip().splitlines()[-1]
    assert "a worker died: the workers started again 1 time(s)" in resumed, stdout
    assert int(resumed.split("from step ")[1].rstrip(")")) >= killed_at  # not from the start
    payload = read_checkpoint(str(out))
    assert payload["step"] == 600 and [p.name for p in out.parent.iterdir()] == ["tt.pt"]  # nothing half-written
    steps = [row["step"] for row in payload["history"]]
    assert steps == sorted(set(steps)) and steps[0] == 0 and steps[-1] == 599  # one history, no step twice
    evaluated = subprocess.run([sys.executable, "-m", "ttlib", "evaluate", "--checkpoint", str(out), "--episodes", "1",
                                "--max-steps", "2", "--beam-width", "2", "--horizon", "1", "--context", "1",
                                "--expand", "1", "--top-k", "0"], capture_output=True, text=True, timeout=300)
    assert evaluated.returncode == 0, evaluated.stderr[-2000:]


# ---- runs that cannot be split -----------------------------------------------------------------------------------
@pytest.mark.parametrize("args, says", [
    (["--workers", "0"], "--workers must be at least 1"),
    (["--workers", "3", "--batch-size", "2"], "a batch of 2 windows cannot be split over 3 workers"),
    (["--workers", "2", "--model", "dt"], "the Decision Transformer trains in one process"),
])
def test_a_run_that_cannot_be_split_says_why_in_one_line(args, says, tmp_path, capsys):
    assert main(["train", "--out", str(tmp_path / "x.pt"), *args]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and says in lines[0], lines
