"""ttlib.course.threads: torch uses the cores other programs leave free, the user's own choice wins, and `timed`
measures CPU time on one thread; the `ttlib` command fits the threads, a library function leaves them alone. Each
check runs in a fresh Python (torch's thread count is per process), with the CPU hog a real busy process beside it."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import psutil


def run(code: str, **env) -> str:
    clean = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          env={**clean, **env}, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout.strip()


def test_a_machine_whose_cores_are_all_busy_gets_one_thread():
    cores = psutil.cpu_count()
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(cores)]
    try:
        assert run("import ttlib.course.threads as t, torch; print(t.fit(), torch.get_num_threads())") == "1 1"
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()


def test_training_leaves_the_thread_count_alone_and_the_command_fits_it():
    """A library loop runs with the threads its caller chose, on a busy machine too; the `ttlib` command, an entry
    point, fits them before its work (here a command refused at once: the fitting comes first). The hogs start
    after the imports, which would take long beside them."""
    out = run("""
        import subprocess, sys, psutil, torch
        import ttlib.evaluation.rollout
        from ttlib.cli.main import main
        from ttlib.training.data_parallel import random_dataset
        from ttlib.training.train import TrainConfig, train
        torch.set_num_threads(2)
        config = TrainConfig.from_settings(dict(steps=3, eval_every=3, eval_batches=1, warmup_steps=1,
            batch_size=4, n_layer=1, n_head=1, n_embd=16, n_transitions=2, device="cpu"))
        data = random_dataset(6, obs_dim=2, act_dim=1, lengths=(20, 40))
        hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(psutil.cpu_count())]
        try:
            train(config, data=data, progress=False)
            print(torch.get_num_threads(), end=" ")
            print(main(["evaluate", "--episodes", "0"]), torch.get_num_threads())
        finally:
            for hog in hogs:
                hog.kill()""")
    assert out == "2 2 1", out


def test_the_users_choice_is_kept():
    assert run("""
        import ttlib.course.threads as t, torch
        print(t.fit(3), torch.get_num_threads(), end=" ")
        t.fit(); print(torch.get_num_threads())""") == "3 3 3"
    assert run("import ttlib.course.threads as t, torch; print(t.fit(), torch.get_num_threads())",
               OMP_NUM_THREADS="2") == "2 2"


def test_timed_counts_this_threads_cpu_and_restores_the_thread_count():
    out = run("""
        import time, torch, ttlib.course.threads as t
        torch.set_num_threads(2)
        slept, _ = t.timed(lambda: time.sleep(0.5))          # waiting is not CPU time
        spun, _ = t.timed(lambda: sum(range(3_000_000)))       # computing is
        print(f"{slept:.3f} {spun:.3f} {torch.get_num_threads()}")""")
    slept, spun, threads = out.split()
    assert float(slept) < 0.1 and float(spun) > 0.01 and threads == "2", out
