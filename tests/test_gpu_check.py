"""tools/gpu-check, kept alive without a GPU: `--device cpu --smoke` runs every part for real at tiny sizes --
an offline install from a wheel folder, the dataset, the exactness tests, the benchmarks, a notebook -- and its
report holds what they measured."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
import time
import zipfile
from importlib import metadata
from pathlib import Path

import nbformat
import pytest
import torch

from tools import gpu_check, gpu_wheels
from ttlib.bench.decoding import decoders_for
from ttlib.course.notebooks import NOTEBOOKS
from ttlib.planning import decoders

ROOT = Path(__file__).resolve().parents[1]
TOOL = ROOT / "tools" / "gpu-check"


def make_wheel(folder: Path, name: str, version: str, source: str) -> Path:
    """A minimal pure-Python wheel (PEP 427) holding one module."""
    path = folder / f"{name}-{version}-py3-none-any.whl"
    info = f"{name}-{version}.dist-info"
    files = {f"{name}/__init__.py": source,
             f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\nRequires-Dist: tqdm\n",
             f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    files[f"{info}/RECORD"] = "".join(f"{f},,\n" for f in files) + f"{info}/RECORD,,\n"
    with zipfile.ZipFile(path, "w") as wheel:
        for file, text in files.items():
            wheel.writestr(file, text)
    return path


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    """One smoke run: a wheel folder with one missing project and one this Python has, a fresh Minari folder."""
    tmp = tmp_path_factory.mktemp("gpu-check")
    wheels = tmp / "wheels"
    wheels.mkdir()
    make_wheel(wheels, "ttlib_gpu_check_probe", "1.0", "VALUE = 42\n")
    make_wheel(wheels, "tqdm", "0.0.1", "")  # tqdm is installed: its wheel must not shadow it
    (wheels / "manifest.json").write_text(json.dumps({"left_out": {"ray": "too big to carry"}}))
    env = {**os.environ, "MINARI_DATASETS_PATH": str(tmp / "minari")}
    start = time.monotonic()
    result = subprocess.run([sys.executable, str(TOOL), "--device", "cpu", "--smoke", "--out", str(tmp / "out"),
                             "--wheels", str(wheels), "--site", str(tmp / "site"), "--runs", str(tmp / "runs"),
                             "--parts", *gpu_check.PARTS],
                            env=env, capture_output=True, text=True, timeout=600)  # training too: every part
    report = json.loads((tmp / "out" / "gpu-check.json").read_text())
    return result, report, tmp, time.monotonic() - start


def test_the_smoke_run_passes_every_part_within_its_budget(smoke):
    result, report, tmp, seconds = smoke
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    assert report["ok"] is True and report["smoke"] is True
    assert set(report["parts"]) == set(gpu_check.PARTS) and "training" not in gpu_check.DEFAULT_PARTS
    for name, part in report["parts"].items():
        assert part["status"] == "ok", (name, part)
        assert 0 < part["seconds"] <= part["limit_s"] + 5, (name, part)
    assert report["seconds"] <= report["budget_s"] + 10 and seconds < report["budget_s"] + 30
    log = (tmp / "out" / "gpu-check.log").read_text()
    for name in gpu_check.PARTS:
        assert f"] {name} (limit" in log or name == "notebooks"
    assert "every part ran and every check passed" in result.stdout and "---- notebook" in log
    assert sorted(os.listdir(tmp / "out")) == ["gpu-check.json", "gpu-check.log"]  # nothing else, nothing half


def test_the_install_adds_only_what_this_python_lacks(smoke):
    _, report, tmp, _ = smoke
    install = report["parts"]["install"]
    assert install["installed"] == {"ttlib-gpu-check-probe": "1.0"}
    assert install["already_present"] == {"tqdm": {"wheel": "0.0.1", "here": metadata.version("tqdm")}}
    assert install["left_out"] == {"ray": "too big to carry"} and install["unmet_requirements"] == []
    site = tmp / "site"
    probe = subprocess.run([sys.executable, "-c", "import ttlib_gpu_check_probe as p; print(p.VALUE)"],
                           env={**os.environ, "PYTHONPATH": str(site)}, capture_output=True, text=True)
    assert probe.stdout.strip() == "42", probe.stderr
    assert not list(site.glob("tqdm*"))
    env = report["environment"]
    assert env["device"] == "cpu" and env["torch"] == torch.__version__ and env["cpu_count"] == os.cpu_count()


def test_the_dataset_is_built_where_minari_keeps_them(smoke):
    _, report, tmp, _ = smoke
    dataset = report["parts"]["dataset"]
    assert dataset["built"] is True and dataset["episodes"] == gpu_check.SMOKE_DATASET_EPISODES
    assert dataset["steps"] > dataset["episodes"]
    assert (tmp / "minari" / "ttlib" / "lunarlander").is_dir()


def test_the_exactness_claims_run_as_the_marked_tests(smoke):
    _, report, _, _ = smoke
    exactness = report["parts"]["exactness"]
    marked = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "tests").glob("test_*.py")
                    if "mark.exactness" in p.read_text())
    assert exactness["files"] == marked and exactness["device"] == "cpu"
    assert exactness["passed"] == len(exactness["tests"]) and not exactness["failed"] and not exactness["skipped"]
    names = " ".join(exactness["tests"])
    for claim in ("test_both_decoders_compute_the_same_logits_along_a_float32_plan",  # the cache: to 1e-4
                  "test_all_three_decoders_make_the_same_plan_in_float64",  # float64 plans, token for token
                  "test_the_static_search_makes_the_fused_plan_in_float64",  # ... and the static search's
                  "test_the_static_step_gives_the_models_logits_in_float32",  # its logits, step by step
                  "test_vectorized_and_sequential_rollouts_give_the_same_returns"):  # float64 returns
        assert claim in names


def test_planning_times_every_decoder_side_by_side(smoke):
    _, report, _, _ = smoke
    runs = report["parts"]["planning"]["runs"]
    assert [(r["dtype"], r["batch"]) for r in runs] == [("float32", 1), ("float32", 2)]
    for r in runs:
        assert r["device"] == "cpu" and r["preset"] == "tiny" and list(r["decoders"]) == list(decoders_for("cpu"))
        assert r["default_decoder"] == decoders_for("cpu")[0]
        default = r["decoders"][r["default_decoder"]]
        assert r["ms_per_plan_cached"] == default["ms_per_plan"]["median"] > 0
        assert r["share_of_matmul_rate"] == default["share_of_matmul_rate"]
        static, fused = r["decoders"]["static"], r["decoders"]["fused"]
        assert static["speedup_vs_fused"]["median"] == pytest.approx(
            fused["ms_per_plan"]["median"] / static["ms_per_plan"]["median"])  # (one plan each: no median to mix)
        assert r["speedup"] == pytest.approx(r["ms_per_plan_uncached"] / r["ms_per_plan_cached"])
        assert r["max_logit_gap"] < 1e-4 * (1 + r["max_abs_logit"])  # the float32 tolerance
        assert "graphs" not in r  # no CUDA graphs on a CPU


def test_the_triton_step_is_timed_beside_the_static_search(smoke):
    """On a CPU, under Triton's interpreter (slow: a one-layer model, one step ahead): the Triton step beside the
    static search launched kernel by kernel, the same plan, and each one's kernels (none on a GPU here)."""
    _, report, _, _ = smoke
    part = report["parts"]["triton"]
    assert "triton" not in gpu_check.DEFAULT_PARTS and part["decoders"] == ["triton", "static"]
    (run,) = part["runs"]
    assert run["device"] == "cpu" and run["batch"] == 1 and list(run["decoders"]) == ["triton", "static"]
    assert run["default_decoder"] == "triton" and run["ms_per_plan_cached"] > 0
    assert run["same_plan"]["static"]["bins"] and run["same_plan"]["static"]["max_score_gap"] < 1e-4
    assert set(run["kernels_per_plan"]) == {"triton", "static"}
    assert all(k["gpu_kernels"] == 0 and k["graph_launches"] == 0 and k["aten_ops"] > 0
               for k in run["kernels_per_plan"].values())


def test_a_run_keeps_its_report_by_date_and_device(smoke, tmp_path):
    """--runs gets a copy of the report named by its date and device; a second one that day does not overwrite it."""
    _, report, tmp, _ = smoke
    (kept,) = (tmp / "runs").iterdir()
    device = report["environment"]["device_name"].lower()
    assert kept.name.startswith(report["started"][:10] + "-") and kept.suffix == ".json"
    assert kept.stem[11:] == "".join(c if c.isalnum() else "-" for c in device).strip("-")
    assert json.loads(kept.read_text()) == json.loads((tmp / "out" / "gpu-check.json").read_text())
    named = {"started": "2026-11-28T01:02:03+00:00", "environment": {"device_name": "NVIDIA H100 80GB HBM3"}}
    first, second = (gpu_check.keep_report(named, tmp_path) for _ in range(2))
    assert first.name == "2026-11-28-nvidia-h100-80gb-hbm3.json"
    assert second.name == "2026-11-28-nvidia-h100-80gb-hbm3-2.json"


def test_training_and_rollouts_report_consistent_figures(smoke):
    _, report, _, _ = smoke
    training = report["parts"]["training"]
    figures = training["device"]
    assert figures["device"] == "cpu" and "cpu" not in training  # no baseline when the device is the CPU
    assert figures["tokens_per_s"] == pytest.approx(figures["batch_size"] * figures["seq_len"]
                                                    / (figures["ms_per_step"] / 1000))
    rollouts = report["parts"]["rollouts"]
    assert rollouts["env_id"] == "HalfCheetah-v5" and rollouts["preset"] == "smoke"
    assert rollouts["episodes"] == 3 and rollouts["max_steps"] == 10
    assert rollouts["steps"] == rollouts["planned_steps"] == 30  # HalfCheetah never ends early
    assert rollouts["steps_per_s"] == pytest.approx(30 / rollouts["seconds"])
    assert rollouts["projected_s"] == pytest.approx(rollouts["seconds"])  # (finished: the projection is the time)
    assert rollouts["vectorized_s"] == rollouts["seconds"]
    assert len(rollouts["returns"]) == 3  # the static planners kept (on a CPU: the fused decoder, none kept)
    assert rollouts["graphs"] == ([{"runner": "eager"}] if decoders.AUTO_ON_CPU == "static" else [])


def test_the_smoke_notebook_ran_with_nbclient(smoke):
    _, report, _, _ = smoke
    notebooks = report["parts"]["notebooks"]
    assert list(notebooks["results"]) == [gpu_check.SMOKE_NOTEBOOK]
    result = notebooks["results"][gpu_check.SMOKE_NOTEBOOK]
    assert result["status"] == "passed" and result["cells"] > 10 and result["seconds"] > 1
    assert notebooks["mode"] == "fast"  # (a smoke run's; learners' full mode otherwise)


def test_targets_are_read_off_the_report(smoke):
    """In a smoke run the sizes are not the targets': each target shows what was measured, and no verdict. At the
    targets' sizes the same report meets or misses them; a rollout cut off at its limit is not measured."""
    _, report, _, _ = smoke
    rows = {row["key"]: row for row in report["targets"]}
    runs = report["parts"]["planning"]["runs"]
    assert rows["plan_ms_1"]["measured"] == runs[0]["ms_per_plan_cached"]
    assert rows["plan_ms_25"]["measured"] is None and rows["plan_ms_100"]["measured"] is None  # (batch 2 here)
    assert rows["rollouts_s"]["measured"] == report["parts"]["rollouts"]["vectorized_s"]
    assert rows["notebooks_not_passed"]["measured"] == 0
    assert all(row["applies"] is False and row["met"] is None for row in rows.values())

    full = copy.deepcopy(report)
    full["parts"]["rollouts"].update(preset="halfcheetah", episodes=25, max_steps=1000, vectorized_s=19.0)
    for run, ms in zip(runs := full["parts"]["planning"]["runs"], (6.0, 11.0), strict=True):
        run.update(preset="halfcheetah", ms_per_plan_cached=ms)
    runs[1]["batch"] = 25
    full["parts"]["notebooks"]["mode"] = "full"
    full["parts"]["notebooks"]["results"]["00_offline_rl.ipynb"] = {"status": "timed out in cell 9"}
    met = {row["key"]: row["met"] for row in gpu_check.targets(full)}
    assert met == {"plan_ms_1": False, "plan_ms_25": True, "plan_ms_100": None, "rollouts_s": True,
                   "notebooks_not_passed": False}
    del full["parts"]["rollouts"]["vectorized_s"]  # cut off: steps/s and a projection, no verdict
    (rollouts,) = [row for row in gpu_check.targets(full) if row["key"] == "rollouts_s"]
    assert rollouts["met"] is None and rollouts["at"]["projected_s"] == report["parts"]["rollouts"]["projected_s"]


def test_a_notebook_needing_a_package_left_out_is_not_run_rather_than_failed(tmp_path):
    """A real kernel fails on the import; the status says which package and why it was left out."""
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell("x = 1"), nbformat.v4.new_code_cell("import ttlib_no_such_package.sub")]
    path = tmp_path / "needs.ipynb"
    nbformat.write(nb, path)
    out = tmp_path / "result.json"
    result = subprocess.run([sys.executable, "-m", "tools.gpu_check", "--part", "notebook", "--notebook",
                             str(path), "--result", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    reported = json.loads(out.read_text())
    assert reported["outcome"] == "failed" and reported["cell"] == 1 and reported["ename"] == "ModuleNotFoundError"
    assert reported["missing_module"] == "ttlib_no_such_package"
    left_out = {"ttlib_no_such_package": "too big"}
    assert gpu_check.notebook_status(dict(reported, status="ok"), left_out) == \
        "not run: needs ttlib_no_such_package (too big)"
    assert gpu_check.notebook_status(dict(reported, status="ok"), {}) == "failed"
    # ttlib's own words for a missing package count too (ray_cluster.connect when Ray is missing)
    said = {"outcome": "failed", "status": "ok", "ename": "DistributedError",
            "evalue": "distributed evaluation needs Ttlib_No_Such_Package, which is not installed: pip install it"}
    assert gpu_check.notebook_status(dict(said), left_out).startswith("not run: needs ttlib_no_such_package")
    assert gpu_check.notebook_status(dict(said), {"numpy": "installed here"}) == "failed"


def test_a_notebook_stopped_at_its_limit_says_which_cell_was_running(tmp_path):
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_markdown_cell("# a slow notebook"), nbformat.v4.new_code_cell("x = 1"),
                nbformat.v4.new_code_cell("import time\ntime.sleep(600)")]
    nbformat.write(nb, tmp_path / "slow.ipynb")
    out = tmp_path / "result.json"
    process = subprocess.Popen([sys.executable, "-m", "tools.gpu_check", "--part", "notebook", "--notebook",
                                str(tmp_path / "slow.ipynb"), "--result", str(out)], cwd=ROOT, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not (out.exists() and json.loads(out.read_text())["cell"] == 2):
            time.sleep(0.2)
    finally:
        gpu_check.kill_tree(process.pid)
        process.wait()
    reported = json.loads(out.read_text())
    assert reported["outcome"] == "running" and reported["source"] == ["import time"]
    assert list(reported["slowest_cells_s"]) == [f"1 {nb.cells[1].id}"]
    status = gpu_check.notebook_status(dict(reported, status="timed out"), {})
    assert status == f"timed out in cell 2 ({nb.cells[2].id})"


@pytest.mark.parametrize("args, message", [
    (["--smoke"], "--out DIR is required"),
    (["--out", "x", "--notebooks", "99_nothing.ipynb"], "not course notebooks: 99_nothing.ipynb"),
])
def test_bad_arguments_give_one_clear_line(args, message):
    result = subprocess.run([sys.executable, str(TOOL), *args], capture_output=True, text=True)
    assert result.returncode == 2 and message in result.stderr.strip().splitlines()[-1]


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_asking_for_cuda_without_one_stops_after_the_probe(tmp_path):
    result = subprocess.run([sys.executable, str(TOOL), "--device", "cuda", "--out", str(tmp_path), "--wheels",
                             str(tmp_path / "none"), "--site", str(tmp_path / "site")], capture_output=True,
                            text=True, timeout=300)
    report = json.loads((tmp_path / "gpu-check.json").read_text())
    assert result.returncode == 1 and report["ok"] is False
    assert report["parts"]["install"]["status"].startswith("probe failed")
    assert "PyTorch sees no CUDA device" in (tmp_path / "gpu-check.log").read_text()
    assert {p["status"] for n, p in report["parts"].items() if n != "install"} == {"not run: the install failed"}


def test_the_smoke_notebook_and_the_wheel_lists_are_in_step():
    """The smoke runs a course notebook; the wheel folder leaves out nothing the course lists as needed."""
    assert gpu_check.SMOKE_NOTEBOOK in NOTEBOOKS
    needed = {gpu_wheels.normalize(line.split("[")[0].split(">")[0]) for line in gpu_wheels.course_requirements()}
    assert not needed & set(gpu_wheels.DROPPED) and "jupyterlab" not in needed
    assert {"gymnasium", "minari", "ipykernel", "nbclient", "nbformat"} <= needed
