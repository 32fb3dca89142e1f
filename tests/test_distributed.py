"""Distributed evaluation on a real local Ray cluster: the same returns as one process, complete results when an
actor dies, and clear errors. One cluster for the whole module (Ray takes seconds to start), shut down in the
fixture's finalizer whatever the tests do."""

import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest
import ray
from commands import in_process, one_line_error, ttlib  # tests/ is on sys.path

from ttlib.agents.critic import load_critic
from ttlib.evaluation import ray_cluster, rollout
from ttlib.evaluation import ray_evaluation as distributed
from ttlib.planning import beam as planning
from ttlib.training.checkpoints import default_checkpoint, load_checkpoint

SEEDS = [20, 21, 22, 23, 24]
MAX_STEPS = 12  # short episodes: the point is equality and completeness, not return quality
TOKEN = Path.home() / ".ray" / "auth_token"


@pytest.fixture(scope="module")
def course():
    """The shipped checkpoint in float64 (bit-for-bit comparisons across batch shapes), its environment, and the
    course planner with a smaller beam."""
    model, tokenizer, payload = load_checkpoint(default_checkpoint(), device="cpu")
    info = payload["dataset"]
    return model.double(), tokenizer, info["env_id"], info["env_kwargs"], planning.course_planner(beam_width=4)


@pytest.fixture(scope="module")
def reference(course):
    """The single-process vectorized evaluation of the same seeds."""
    model, tokenizer, env_id, env_kwargs, planner = course
    return rollout.evaluate(model, tokenizer, env_id, SEEDS, planner, env_kwargs=env_kwargs, max_steps=MAX_STEPS,
                            progress=False)


@pytest.fixture(scope="module")
def cluster():
    """A local 2-CPU Ray cluster with its files in a temporary folder; shut down and removed even on failure."""
    token_before = TOKEN.exists()
    temp_dir = tempfile.mkdtemp(prefix="ttray-")  # short: Ray's socket paths must stay under 107 characters
    try:
        ray_module, started = ray_cluster.connect(num_cpus=2, temp_dir=temp_dir)
        assert started
        yield {"address": ray_module.get_runtime_context().gcs_address, "token_before": token_before}
    finally:
        ray.shutdown()
        shutil.rmtree(temp_dir, ignore_errors=True)


def assert_same(result, reference):
    assert result.seeds == reference.seeds
    np.testing.assert_array_equal(result.returns, reference.returns)
    np.testing.assert_array_equal(result.lengths, reference.lengths)


def test_the_local_cluster_is_loopback_only_and_leaves_no_token(cluster):
    assert cluster["address"].startswith("127.0.0.1:"), cluster["address"]
    assert ray.cluster_resources()["CPU"] == 2
    if not cluster["token_before"]:
        assert not TOKEN.exists(), "starting the cluster wrote an auth token into the home folder"
    assert os.environ.get("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER") is None  # the start-up settings were restored


def eventually_dead(actor, seconds=60.0) -> bool:
    """ray.kill is asynchronous: a call right after it may still be answered."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            ray.get(actor.ping.remote(), timeout=seconds)
        except ray.exceptions.RayActorError:
            return True
        time.sleep(0.2)
    return False


def test_local_inference_same_returns_and_survives_a_dead_worker(cluster, course, reference):
    model, tokenizer, env_id, env_kwargs, planner = course
    too_long = planning.course_planner(beam_width=2, context=8, horizon=8)
    with pytest.raises(ValueError, match="do not fit the model's window"):  # the last evaluation below
        with distributed.RayEvaluator(model, tokenizer, env_id, workers=2, env_kwargs=env_kwargs) as evaluator:
            weights, handles = evaluator.weights, list(evaluator.workers)
            pids = ray.get([w.ping.remote() for w in handles])
            result = evaluator.evaluate(SEEDS, planner, max_steps=MAX_STEPS, progress=False)
            assert_same(result, reference)
            assert result.layout == "local" and result.actor_deaths == 0 and result.reruns == 0
            # worker 1 (seeds 23, 24) exits abruptly at step 5 of its slice: Ray restarts it, the slice runs again
            result = evaluator.evaluate(SEEDS, planner, max_steps=MAX_STEPS, progress=False, kill_worker_at=(1, 5))
            assert_same(result, reference)
            assert result.actor_deaths == 1 and result.reruns == 2
            after = ray.get([w.ping.remote() for w in handles])
            assert after[0] == pids[0] and after[1] != pids[1], "worker 1 is a new process, worker 0 the same one"
            assert evaluator.weights is weights  # put into the object store once, not per call or restart
            evaluator.evaluate(SEEDS, too_long, progress=False)
    assert eventually_dead(handles[0]), "the failed evaluation should still stop its actors"
    assert ray.is_initialized()  # and left the cluster it did not start running


def test_central_inference_same_returns_with_dead_workers_and_planner(cluster, course, reference):
    model, tokenizer, env_id, env_kwargs, planner = course
    with pytest.warns(UserWarning, match="3 workers on a cluster of 2 CPUs"):
        evaluator = distributed.RayEvaluator(model, tokenizer, env_id, workers=3, central=True,
                                             env_kwargs=env_kwargs)
    with evaluator:
        result = evaluator.evaluate(SEEDS, planner, max_steps=MAX_STEPS, progress=False)
        assert_same(result, reference)
        assert result.layout == "central" and result.workers == 3 and result.actor_deaths == 0
        # environment worker 1 (seeds 22, 23) dies at step 4: its unfinished episodes run again
        result = evaluator.evaluate(SEEDS, planner, max_steps=MAX_STEPS, progress=False, kill_worker_at=(1, 4))
        assert_same(result, reference)
        assert result.actor_deaths == 1 and result.reruns == 2
        # the planner dies at step 3: Ray restarts it and the step is planned again; no episode is lost
        result = evaluator.evaluate(SEEDS, planner, max_steps=MAX_STEPS, progress=False, kill_planner_at=3)
        assert_same(result, reference)
        assert result.actor_deaths == 1 and result.reruns == 0


def test_local_inference_with_the_critic_equals_one_process(cluster, course):
    """`evaluate --workers N` with a checkpoint's critic: each worker plans its slice of episodes with the critic
    that travelled with the weights, and the returns are the single process's (float64 model and critic)."""
    model, tokenizer, env_id, env_kwargs, _ = course
    critic = load_critic(default_checkpoint(), device="cpu").double()
    planner = planning.critic_planner(beam_width=4)
    one = rollout.evaluate(model, tokenizer, env_id, SEEDS, planner, env_kwargs=env_kwargs, max_steps=MAX_STEPS,
                           progress=False, critic=critic)
    with distributed.RayEvaluator(model, tokenizer, env_id, workers=2, env_kwargs=env_kwargs,
                                  critic=critic) as evaluator:
        result = evaluator.evaluate(SEEDS, planner, max_steps=MAX_STEPS, progress=False)
    assert_same(result, one)
    assert result.layout == "local" and result.workers == 2


def test_cli_evaluate_on_an_existing_cluster_equals_one_process(cluster):
    """`ttlib evaluate --workers 2 --central --address` joins the module's cluster as a second driver; the
    central planner batches exactly what the single process batches, so even float32 returns are identical. Both
    rank actions with the checkpoint's critic (the default), which travels to the actor with the weights."""
    args = ["evaluate", "--episodes", "3", "--seed", "5", "--max-steps", "6", "--beam-width", "4", "--horizon", "2",
            "--context", "1", "--json"]
    one = ttlib(*args)
    assert one.returncode == 0, one.stderr
    many = ttlib(*args, "--workers", "2", "--central", "--address", cluster["address"])
    assert many.returncode == 0, many.stderr
    one, many = json.loads(one.stdout), json.loads(many.stdout)
    assert many["returns"] == one["returns"] and many["steps"] == one["steps"] == 18
    assert many["workers"] == 2 and many["layout"] == "central"
    assert many["planner"]["value"] == "critic"  # the shipped checkpoint's critic, sent to the planner actor


def test_unreachable_address_fails_fast_with_the_address():
    start = time.monotonic()
    result = ttlib("evaluate", "--workers", "2", "--address", "127.0.0.1:1", "--episodes", "1", timeout=120)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "no Ray cluster answers at 127.0.0.1:1" in lines[0], result.stderr
    assert time.monotonic() - start < 60


BLOCK_RAY = textwrap.dedent("""
    import sys
    from importlib.abc import MetaPathFinder

    class NoRay(MetaPathFinder):  # as if Ray were not installed
        def find_spec(self, name, path=None, target=None):
            if name == "ray" or name.startswith("ray."):
                raise ModuleNotFoundError(f"No module named {name!r}", name=name)

    sys.meta_path.insert(0, NoRay())
    from ttlib.cli.main import main
    sys.exit(main(["evaluate", "--workers", "2", "--episodes", "1"]))
""")


def test_without_ray_the_message_names_the_extra():
    result = subprocess.run([sys.executable, "-c", BLOCK_RAY], capture_output=True, text=True, timeout=120,
                            env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "`ray` extra" in lines[0] and "pip install 'ttlib[ray]'" in lines[0], result.stderr


@pytest.mark.parametrize("args, message", [
    (["--workers", "0"], "--workers must be >= 1"),
    (["--central"], "--central and --address need --workers"),
    (["--workers", "2", "--sequential"], "--sequential plays in one process"),
])
def test_cli_refuses_contradictory_options(args, message):
    one_line_error(in_process("evaluate", "--episodes", "1", *args), message)
