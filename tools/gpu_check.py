"""The course on a GPU: one command that checks all of it on a bare, offline GPU machine in a few minutes.

    python3 tools/gpu-check --out DIR                      # on the GPU machine, in the repository root
    python3 tools/gpu-check --out DIR --device cpu --smoke  # anywhere: tiny sizes, one notebook (the tests run it)

The machine has Python and PyTorch but not Gymnasium, Minari or a Jupyter kernel, and no network: `tools/gpu-wheels`
fills `.whl/` beforehand, and the folder travels with the checkout. In order of what they are worth, each part in
its own process (`gpu_parts.py`) and under its own time limit, drawn from one budget (--budget, default 480 s):

    install    the carried wheels of what the machine lacks, into a site folder (pip --no-index: no network);
               then which device PyTorch sees
    exactness  the tests marked `exactness` (docs/RESULTS.md, "What is exact"), on the device: the static search
               replayed as CUDA graphs makes the fused decoder's plans (float64) and the model's logits (float32)
    planning   one plan at faster-TT's HalfCheetah setting, float32, batch 1, 25 and 100: the static search as CUDA
               graphs, the same launched kernel by kernel, and the fused decoder, side by side, each with its share
               of the GPU's matmul rate and what recording the graphs cost (`ttlib bench planning`)
    rollouts   25 episodes of 1,000 steps in HalfCheetah-v5 with a random model of that preset's shape, vectorized;
               steps per second and the projected total are saved as it goes, so a cut-off run still says something
    compiled   the static search with its step fused by torch.compile before its graphs are recorded, beside the
               graphs alone, batch 1 and 25 -- only when asked for (--parts ... compiled): a compile takes a minute
    triton     the static search with its decoding step one Triton kernel, replayed as CUDA graphs, beside the graphs
               and the fused decoder at batch 1, 25 and 100, with each one's kernels per plan (torch.profiler) --
               only when asked for (--parts ... triton); on a CPU (a smoke run) under Triton's interpreter
    dataset    `ttlib make-dataset`, if the course dataset is missing (the notebooks read it)
    notebooks  every notebook of ttlib.course.notebooks.NOTEBOOKS in full mode, as on Colab, with nbclient, several at
               a time; each picks the device itself, reports its time, and, stopped at the limit, the cell it was in
    training   training tokens/s, on the device and on the CPU -- only when asked for (--parts ... training)

The timed parts run alone, before the notebooks. What a part measured survives its time limit. DIR gets
gpu-check.json (every figure, every check, and the targets of `gpu_report.py` as met or not) and gpu-check.log
(everything the parts printed); a run on a GPU that is not a smoke run also leaves a copy of gpu-check.json in
--runs (default docs/gpu-runs/), named by its date and device, to be committed. The exit status is 0 when every part
ran and every check and notebook passed; a notebook that needs a package gpu-wheels leaves out (Ray) is reported as
not run. Targets are measurements: met or not, they do not change the exit status.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import threading
import time
import uuid
import xml.etree.ElementTree as ElementTree
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timezone
from pathlib import Path

from ttlib.course.notebooks import NOTEBOOKS
from ttlib.files import atomic_path

from .gpu_parts import PART_FUNCTIONS, ROOT, SMOKE_DATASET_EPISODES
from .gpu_report import figures, notebook_status, summary, targets
from .gpu_wheels import normalize, wheel_metadata

__all__ = ["SMOKE_DATASET_EPISODES", "notebook_status", "targets"]  # (re-exported: the tests read them here)
DEFAULT_WHEELS = ROOT / ".whl"
DEFAULT_SITE = Path(tempfile.gettempdir()) / "ttlib-gpu-check-site"  # kept: a second run installs nothing again
DEFAULT_RUNS = ROOT / "docs" / "gpu-runs"  # every GPU run's report, committed

# Seconds of the default 480-s budget for each part, in the order they run. A part may use what is left of the
# budget but half the share of every part after it: time a part does not use goes to the later ones, and a slow
# part eats into them only so far. Expected on an H100 (docs/GPU.md): install 10 s, exactness 30-40 s, planning
# 30-50 s, rollouts 40-70 s (cut off at its limit with a projection if slower), dataset 20-30 s, notebooks the rest.
SHARES = {"install": 30, "exactness": 60, "planning": 70, "rollouts": 110, "compiled": 60, "triton": 90,
          "dataset": 30, "notebooks": 180, "training": 25}
CAPS = {"exactness": 150, "planning": 100, "rollouts": 120, "compiled": 110, "triton": 150}  # seconds at most (a
# slow part says enough by then: the rollouts save their steps per second and projected total as they go), the rest
# to the notebooks
SMOKE_SHARES = {"install": 15, "exactness": 60, "planning": 25, "rollouts": 20, "compiled": 15, "triton": 20,
                "dataset": 10, "notebooks": 0, "training": 15}  # the notebooks run beside the rest, to the budget's end
PARTS = tuple(SHARES)
DEFAULT_PARTS = tuple(p for p in PARTS if p not in ("training", "compiled", "triton"))  # those only when asked for
SMOKE_NOTEBOOK = "01_attention.ipynb"  # the cheapest notebook in fast mode (about 20 s on 2 CPU cores)


def run_part_here(args) -> int:
    """`--part NAME --result FILE`: run one part in this process and write what it returns (or has saved so far)."""
    def save(result):
        with atomic_path(args.result) as tmp:
            Path(tmp).write_text(json.dumps(result))

    save(PART_FUNCTIONS[args.part](args, save))
    return 0


# ---- the orchestrator ----------------------------------------------------------------------------------------
class Run:
    """One check: the log, the report and the time left."""

    def __init__(self, args):
        self.args, self.started = args, time.monotonic()
        self.out = Path(args.out)
        self.out.mkdir(parents=True, exist_ok=True)
        self.log_path, self.json_path = self.out / "gpu-check.log", self.out / "gpu-check.json"
        self.log = open(self.log_path, "w", buffering=1)
        self.scratch = Path(tempfile.mkdtemp(prefix="gpu-check-"))
        self.lock = threading.Lock()
        self.report = {"tool": "gpu-check", "smoke": args.smoke, "budget_s": args.budget,
                       "started": datetime.now(timezone.utc).isoformat(timespec="seconds"), "parts": {}}

    def left(self) -> float:
        return self.args.budget - (time.monotonic() - self.started)

    def limit(self, part: str, parts_left: list[str]) -> float:
        """What is left, less half the share of every part after this one (parts_left: this one, then those), and no
        more than the part's cap (CAPS, scaled with the budget)."""
        shares = SMOKE_SHARES if self.args.smoke else SHARES
        scale = self.args.budget / sum(shares.values())
        limit = max(1.0, self.left() - sum(shares[p] * scale / 2 for p in parts_left[1:]))
        capped = part in CAPS and not self.args.smoke
        return min(limit, CAPS[part] * self.args.budget / 480) if capped else limit

    def say(self, line: str) -> None:
        print(line, flush=True)
        self.log.write(line + "\n")

    def record(self, part: str, result: dict) -> None:
        with self.lock:  # (a smoke run's notebooks record from their own thread)
            self.report["parts"][part] = result
            self.report["seconds"] = round(time.monotonic() - self.started, 1)
            with atomic_path(str(self.json_path)) as tmp:
                Path(tmp).write_text(json.dumps(self.report, indent=1) + "\n")

    def subprocess(self, command: list[str], limit: float, env: dict | None = None, log=None) -> tuple[int, float]:
        """Run `command` in the repository root, its output into the log; kill it and everything it started
        (kernels included) at `limit` seconds. -> (exit status, or None if killed; seconds)."""
        start = time.monotonic()
        process = subprocess.Popen(command, cwd=ROOT, stdout=log or self.log, stderr=subprocess.STDOUT,
                                   env={**os.environ, **(env or {})}, start_new_session=True)
        try:
            code = process.wait(timeout=limit)
        except subprocess.TimeoutExpired:
            kill_tree(process.pid)
            process.wait()
            code = None
        return code, time.monotonic() - start

    def part(self, name: str, limit: float, extra: list[str] = (), env: dict | None = None, log=None) -> dict:
        """Run one of PART_FUNCTIONS in its own process: -> what it returned or saved, and how it went."""
        result_file = self.scratch / f"{name}-{uuid.uuid4().hex}.json"
        command = [sys.executable, "-m", "tools.gpu_check", "--part", name, "--result", str(result_file),
                   "--device", self.args.device, *(["--smoke"] if self.args.smoke else []), *extra]
        code, seconds = self.subprocess(command, limit, env, log)
        result = json.loads(result_file.read_text()) if result_file.exists() else {}
        status = "ok" if code == 0 else "timed out" if code is None else f"failed (exit status {code})"
        return {"status": status, "seconds": round(seconds, 1), "limit_s": round(limit, 1), **result}


def kill_tree(pid: int) -> None:
    """End a process and all its descendants (a notebook's kernel runs in a session of its own)."""
    try:
        import psutil

        processes = psutil.Process(pid).children(recursive=True) + [psutil.Process(pid)]
        for process in processes:
            process.kill()
    except ImportError:
        os.killpg(pid, 9)
    except Exception:  # psutil.NoSuchProcess: it ended meanwhile
        pass


def install(run: Run, limit: float) -> dict:
    """Install the wheels of the projects this Python lacks into the site folder, with no index and no network;
    a project it already has (the image's, or installed by an earlier run) keeps its version."""
    from importlib import metadata

    site, start = Path(run.args.site), time.monotonic()
    site.mkdir(parents=True, exist_ok=True)
    sys.path.insert(0, str(site))
    os.environ["PYTHONPATH"] = os.pathsep.join([str(site), str(ROOT), os.environ.get("PYTHONPATH", "")]).strip(
        os.pathsep)  # for every process started from here on, notebook kernels included
    wheels = sorted(p for folder in run.args.wheels for p in Path(folder).glob("*.whl"))
    left_out = {}
    for folder in run.args.wheels:
        manifest = Path(folder) / "manifest.json"
        if manifest.exists():
            left_out.update(json.loads(manifest.read_text()).get("left_out", {}))
    missing, present = [], {}
    for wheel in wheels:
        name, version, _ = wheel_metadata(wheel)
        try:
            present[name] = {"wheel": version, "here": metadata.version(name)}
        except metadata.PackageNotFoundError:
            missing.append(wheel)
    result = {"wheels": len(wheels), "wheel_folders": [str(f) for f in run.args.wheels], "site": str(site),
              "already_present": present, "left_out": left_out}
    if missing:
        code, _ = run.subprocess([sys.executable, "-m", "pip", "install", "--quiet", "--no-index", "--no-deps",
                                  "--no-compile", "--no-cache-dir", "--disable-pip-version-check", "--upgrade",
                                  "--target", str(site), *map(str, missing)], limit)
        if code != 0:
            return {**result, "status": "timed out" if code is None else f"failed (pip exit status {code})",
                    "seconds": round(time.monotonic() - start, 1), "limit_s": round(limit, 1)}
    result["installed"] = {wheel_metadata(w)[0]: wheel_metadata(w)[1] for w in missing}
    importlib.invalidate_caches()
    result["unmet_requirements"] = unmet_requirements(wheels)
    probe = run.part("probe", max(1.0, limit - (time.monotonic() - start)))
    if probe["status"] != "ok":
        return {**result, "status": f"probe {probe['status']}", "seconds": round(time.monotonic() - start, 1),
                "limit_s": round(limit, 1)}
    run.report["environment"] = {k: v for k, v in probe.items() if k not in ("status", "seconds", "limit_s")}
    return {**result, "status": "ok", "seconds": round(time.monotonic() - start, 1), "limit_s": round(limit, 1)}


def unmet_requirements(wheels) -> list[str]:
    """What the carried wheels require of this Python that its installed versions do not satisfy."""
    from importlib import metadata

    from .gpu_wheels import needed, target_environment

    unmet, environment = [], target_environment(platform.python_version())
    for wheel in wheels:
        name, _, requires = wheel_metadata(wheel)
        for requirement in needed(requires, environment):
            try:
                version = metadata.version(requirement.name)
            except metadata.PackageNotFoundError:
                if normalize(requirement.name) not in _dropped():
                    unmet.append(f"{name} needs {requirement}: not installed")
                continue
            if requirement.specifier and not requirement.specifier.contains(version, prereleases=True):
                unmet.append(f"{name} needs {requirement}: {version} is installed")
    return sorted(set(unmet))


def _dropped() -> set[str]:
    from .gpu_wheels import DROPPED, LEFT_OUT

    return {*DROPPED, *LEFT_OUT}


def exactness(run: Run, limit: float) -> dict:
    """The tests marked `exactness`, on the device: the claims of docs/RESULTS.md's "What is exact"."""
    files = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "tests").glob("test_*.py")
                   if "mark.exactness" in p.read_text())
    junit = run.scratch / "exactness.xml"
    code, seconds = run.subprocess([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m",
                                    "exactness", f"--junitxml={junit}", *files], limit,
                                   env={"TTLIB_TEST_DEVICE": run.args.device,
                                        "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"})  # none needed; they cost seconds
    tests, failed, skipped = [], [], []
    if junit.exists():
        for case in ElementTree.parse(junit).iter("testcase"):
            name = f"{case.get('classname', '').split('.')[-1]}::{case.get('name')}"
            tests.append(name)
            for problem in (*case.iter("failure"), *case.iter("error")):
                failed.append(f"{name}: {(problem.get('message') or '').splitlines()[0][:300]}")
            skipped += [name for _ in case.iter("skipped")]
    ok = code == 0 and tests and not failed and not skipped
    return {"status": "ok" if ok else "timed out" if code is None else "failed", "seconds": round(seconds, 1),
            "limit_s": round(limit, 1), "device": run.args.device, "files": files, "tests": tests,
            "passed": len(tests) - len(failed) - len(skipped), "failed": failed, "skipped": skipped}


def notebooks(run: Run, limit: float) -> dict:
    """Every notebook at once, `--jobs` at a time, each in its own process with its own kernel, in full mode (as
    learners run them) unless --fast-notebooks."""
    names, deadline = run.args.notebooks, time.monotonic() + limit
    jobs = max(1, min(len(names), run.args.jobs))
    threads = "1" if run.args.smoke else str(max(1, (os.cpu_count() or 1) // jobs))
    left_out = run.report["parts"].get("install", {}).get("left_out", {})
    lock, results, mode = threading.Lock(), {}, "fast" if run.args.fast_notebooks else "full"

    def one(name):
        remaining = deadline - time.monotonic()
        if remaining < 1:
            return name, {"status": "not run: out of time"}
        with tempfile.TemporaryFile("w+") as output:
            env = {"TTLIB_FAST": "1" if mode == "fast" else "0", "OMP_NUM_THREADS": threads,
                   **({"CUDA_VISIBLE_DEVICES": ""} if run.args.device == "cpu" else {})}  # the notebooks pick it
            result = run.part("notebook", remaining, ["--notebook", name, "--cell-timeout", str(int(remaining))],
                              env=env, log=output)
            output.seek(0)
            with lock:
                run.log.write(f"---- notebook {name}: {result.get('status')} ----\n{output.read()}")
        result["status"] = notebook_status(result, left_out)
        return name, result

    with ThreadPoolExecutor(jobs) as pool:
        for name, result in pool.map(one, names):
            results[name] = result
            run.say(f"  notebook {name}: {result['status']} ({result.get('seconds', 0):.0f} s)")
    fine = [n for n, r in results.items() if r["status"] == "passed" or r["status"].startswith("not run: needs")]
    return {"status": "ok" if len(fine) == len(results) else "failed", "limit_s": round(limit, 1), "mode": mode,
            "seconds": round(limit - (deadline - time.monotonic()), 1), "jobs": jobs,
            "threads_per_kernel": int(threads), "results": results}


def check(args) -> int:
    """Every part in turn, each under its share of the budget, then the targets and the summary. A smoke run
    times nothing that matters, so there the notebooks run beside the other parts instead of after them."""
    run = Run(args)
    if args.smoke:  # parts and the notebook share the cores: one thread each, or OpenMP threads spin-wait on each other
        os.environ["OMP_NUM_THREADS"] = "1"
    run.say(f"gpu-check: {ROOT}, budget {args.budget:g} s, parts {', '.join(args.parts)}, log {run.log_path}")
    parts = [p for p in PARTS if p in args.parts]
    beside = args.smoke and "notebooks" in parts
    timed = [p for p in parts if not (beside and p == "notebooks")]
    if beside and "dataset" in timed:  # the notebook reads the dataset: made first, then the notebook starts
        timed.insert(1, timed.pop(timed.index("dataset")))
    start_beside = "dataset" if "dataset" in timed else "install"
    background, stopped = None, None
    for i, name in enumerate(timed):
        if stopped or run.left() < 1:
            run.record(name, {"status": f"not run: {stopped or 'out of budget'}"})
            continue
        limit = run.limit(name, timed[i:])
        run.say(f"[{args.budget - run.left():5.0f} s] {name} (limit {limit:.0f} s)")
        special = {"install": install, "exactness": exactness, "notebooks": notebooks}
        interpret = {"TRITON_INTERPRET": "1"} if name == "triton" and args.device == "cpu" else None  # (slow)
        result = special[name](run, limit) if name in special else run.part(name, limit, env=interpret)
        run.record(name, result)
        run.say(f"  {name}: {result['status']} in {result.get('seconds', 0):.1f} s {figures(name, result)}")
        if name == "install" and result["status"] != "ok":
            stopped = "the install failed"
        elif name == "install":
            args.device = run.report["environment"]["device"]
        if beside and name == start_beside and not stopped:  # from now on, beside the rest
            background = threading.Thread(target=lambda: run.record("notebooks", notebooks(run, run.left())))
            background.start()
    if background:
        background.join()
    elif beside:
        run.record("notebooks", {"status": f"not run: {stopped}"})
    run.report["targets"] = targets(run.report)
    run.report["ok"] = all(part["status"] == "ok" for part in run.report["parts"].values())
    run.record("install", run.report["parts"]["install"])  # the report, now with its targets
    for line in summary(run.report):
        run.say(line)
    on_gpu = run.report.get("environment", {}).get("device", "").startswith("cuda")
    runs = args.runs or (DEFAULT_RUNS if on_gpu and not args.smoke else None)  # (by default: a GPU's full runs)
    if runs:
        run.say(f"gpu-check: the report kept as {keep_report(run.report, Path(runs))}")
    run.log.close()
    return 0 if run.report["ok"] else 1


def keep_report(report: dict, folder: Path) -> Path:
    """A copy of the report in folder, named by its date and device (2026-11-27-nvidia-h100-80gb-hbm3.json; a
    second run that day gets -2, -3, ...): docs/RESULTS.md's GPU section reads the newest."""
    device = report.get("environment", {}).get("device_name") or "unknown-device"
    stem = f"{report['started'][:10]}-{re.sub(r'[^a-z0-9]+', '-', device.lower()).strip('-')}"
    folder.mkdir(parents=True, exist_ok=True)
    path, n = folder / f"{stem}.json", 1
    while path.exists():
        n += 1
        path = folder / f"{stem}-{n}.json"
    with atomic_path(str(path)) as tmp:
        Path(tmp).write_text(json.dumps(report, indent=1) + "\n")
    return path


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gpu-check", description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", help="the folder for gpu-check.json and gpu-check.log")
    parser.add_argument("--device", default="auto", help="auto (cuda if PyTorch sees one, else cpu), cuda or cpu")
    parser.add_argument("--smoke", action="store_true", help=f"tiny sizes and one notebook ({SMOKE_NOTEBOOK}): "
                        "checks that every part runs; measures nothing worth keeping")
    parser.add_argument("--budget", type=float, help="seconds for the whole check (default 480; smoke 300)")
    parser.add_argument("--parts", nargs="+", choices=PARTS, default=list(DEFAULT_PARTS),
                        help=f"run only these (the install always runs; default: {' '.join(DEFAULT_PARTS)})")
    parser.add_argument("--fast-notebooks", action="store_true", help="the notebooks in fast mode (TTLIB_FAST=1; "
                        "smoke: always) instead of the full mode learners run")
    parser.add_argument("--notebooks", nargs="+", help="these notebooks of the course's NOTEBOOKS (default: all; "
                        f"smoke: {SMOKE_NOTEBOOK})")
    parser.add_argument("--jobs", type=int, help="notebooks run at a time (default: half the CPU cores)")
    parser.add_argument("--wheels", nargs="+", default=[str(DEFAULT_WHEELS)], help="wheel folders (default .whl)")
    parser.add_argument("--site", default=str(DEFAULT_SITE), help=f"where wheels are installed ({DEFAULT_SITE})")
    parser.add_argument("--runs", help="where a copy of the report goes, named by date and device (default: "
                        f"{DEFAULT_RUNS.relative_to(ROOT)} for a run on a GPU that is not a smoke run, else nowhere)")
    # one part in this process (what the orchestrator starts)
    parser.add_argument("--part", choices=PART_FUNCTIONS, help=argparse.SUPPRESS)
    parser.add_argument("--result", help=argparse.SUPPRESS)
    parser.add_argument("--notebook", help=argparse.SUPPRESS)
    parser.add_argument("--cell-timeout", type=int, default=600, help=argparse.SUPPRESS)
    return parser


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.part:
        return run_part_here(args)
    if not args.out:
        parser.error("--out DIR is required: where gpu-check.json and gpu-check.log go")
    if args.smoke and SMOKE_NOTEBOOK not in NOTEBOOKS:
        parser.error(f"the smoke notebook {SMOKE_NOTEBOOK} is not in NOTEBOOKS: update SMOKE_NOTEBOOK")
    args.notebooks = args.notebooks or ([SMOKE_NOTEBOOK] if args.smoke else list(NOTEBOOKS))
    unknown = [n for n in args.notebooks if n not in NOTEBOOKS]
    if unknown:
        parser.error(f"not course notebooks: {', '.join(unknown)} (ttlib.course.notebooks.NOTEBOOKS lists them)")
    args.budget = args.budget or (300.0 if args.smoke else 480.0)
    args.jobs = args.jobs or max(1, (os.cpu_count() or 2) // 2)
    args.parts = ["install", *args.parts] if "install" not in args.parts else args.parts
    args.fast_notebooks = args.fast_notebooks or args.smoke
    return check(args)


if __name__ == "__main__":
    sys.exit(main())
