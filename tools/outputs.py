"""The solution notebooks are committed with their outputs, so that GitHub, nbviewer and Colab's preview show the
figures and results before anyone runs a cell. This runs them and stores what they printed and drew.

    python -m tools.outputs                    # every notebook, in full mode (not TTLIB_FAST), one by one
    python -m tools.outputs 03_trajectory_gpt  # one notebook
    python -m tools.outputs --beside-hog       # time them beside a busy process per core (kept beside the run)
    python -m tools.outputs --check            # the stale cells (what tests/test_notebooks.py asserts)

Each code cell keeps, in its metadata, a hash of the source that made its outputs (`ttlib.source`): a cell edited
since then is stale, and the test says which. The notebook keeps how long the run took and on what (`ttlib.run`,
with `busy_seconds` from a run beside a busy process per core): the header's "Time" line quotes both. A notebook is
written only when its run finished without an error, through a temporary file (a failed run leaves the committed
version as it was).
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import math
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

import nbformat

from ttlib.course.notebooks import NOTEBOOKS

ROOT = Path(__file__).resolve().parents[1]
FOLDER = ROOT / "notebooks"
KEY = "ttlib"


def source_hash(source: str) -> str:
    return hashlib.sha256(source.encode("utf-8")).hexdigest()[:16]


def minutes(seconds: float) -> int:
    """A run's time as the header says it: whole minutes, rounded up."""
    return max(1, math.ceil(seconds / 60))


def stale_cells(nb) -> list[int]:
    """Indices of the code cells whose outputs were not made by their current source (or never made)."""
    return [i for i, cell in enumerate(nb.cells) if cell.cell_type == "code"
            and cell.metadata.get(KEY, {}).get("source") != source_hash(cell.source)]


def _cpu_name() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


@contextlib.contextmanager
def cpu_hog(processes: int):
    """`processes` busy Python processes for the duration (the load of a laptop doing other work); yields them."""
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(processes)]
    try:
        yield hogs
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()


@contextlib.contextmanager
def one_core_beside_a_hog():
    """This thread, every process it starts meanwhile, and one busy process, on one core of their own: what runs here
    gets at most half a core (a laptop doing other work), while the machine's other cores stay free for the rest --
    a test suite's other worker, which busy processes on every core would slow as much. Yields the hog (its CPU
    seconds show that it ran). The core: a pytest-xdist worker's own (gw0 the first), else the last one."""
    allowed = sorted(os.sched_getaffinity(0))
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    core = allowed[int(worker[2:]) % len(allowed)] if worker[2:].isdigit() else allowed[-1]
    os.sched_setaffinity(0, {core})  # this thread's mask; children inherit it
    try:
        with cpu_hog(1) as hogs:
            yield hogs[0]
    finally:
        os.sched_setaffinity(0, allowed)


def execute(name: str, timeout: int = 1800) -> tuple[nbformat.NotebookNode, float]:
    """(the notebook run top to bottom in full mode in notebooks/, seconds on the clock)."""
    from ttlib.grading.nbrun import PollingNotebookClient  # a widget cell's reply is not missed (jupyter/nbclient#312)

    nb = nbformat.read(FOLDER / name, as_version=4)
    env_fast = os.environ.pop("TTLIB_FAST", None)  # full mode: what a learner runs
    start = time.monotonic()
    try:
        PollingNotebookClient(nb, timeout=timeout, kernel_name="python3",
                              resources={"metadata": {"path": str(FOLDER)}}, record_timing=False).execute()
    finally:
        if env_fast is not None:
            os.environ["TTLIB_FAST"] = env_fast
    return nb, time.monotonic() - start


def store(name: str, nb, seconds: float) -> None:
    import torch

    for cell in nb.cells:
        if cell.cell_type == "code":
            cell.metadata[KEY] = {"source": source_hash(cell.source)}
    nb.metadata[KEY] = {"run": {"seconds": round(seconds), "cpu": _cpu_name(), "cores": os.cpu_count(),
                                "torch": torch.__version__.split("+")[0], "mode": "full"}}
    path = FOLDER / name
    tmp = path.with_suffix(".ipynb.tmp")
    nbformat.write(nb, tmp)
    os.replace(tmp, path)


def record_busy_run(name: str, seconds: float) -> None:
    """Keep beside the committed run the time the same notebook took beside a busy process per core (the header
    quotes it); outputs untouched."""
    path = FOLDER / name
    nb = nbformat.read(path, as_version=4)
    if stale_cells(nb) or "run" not in nb.metadata.get(KEY, {}):
        raise SystemExit(f"{name}: run it alone first (its committed outputs are stale or missing)")
    nb.metadata[KEY]["run"]["busy_seconds"] = round(seconds)
    tmp = path.with_suffix(".ipynb.tmp")
    nbformat.write(nb, tmp)
    os.replace(tmp, path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.outputs", description=__doc__.splitlines()[0])
    parser.add_argument("notebooks", nargs="*", help="names or prefixes (03, 03_trajectory_gpt); default: all")
    parser.add_argument("--check", action="store_true", help="list stale cells; exit 1 if any")
    parser.add_argument("--beside-hog", action="store_true", help="time the runs beside a busy process per core "
                                                                  "and keep the time beside the committed run's")
    args = parser.parse_args(argv)
    names = [n for n in NOTEBOOKS if not args.notebooks or any(n.startswith(p) for p in args.notebooks)]
    if args.check:
        stale = {n: stale_cells(nbformat.read(FOLDER / n, as_version=4)) for n in names}
        for name, cells in stale.items():
            print(f"{name}: " + (f"stale cells {cells}" if cells else "up to date"))
        return 1 if any(stale.values()) else 0
    for name in names:
        with cpu_hog(os.cpu_count() or 2) if args.beside_hog else contextlib.nullcontext():
            try:
                nb, seconds = execute(name)
            except Exception as e:  # noqa: BLE001 (say which notebook failed, go on with the others)
                print(f"{name}: failed ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})",
                      flush=True)
                continue
        if args.beside_hog:
            record_busy_run(name, seconds)
            print(f"{name}: {seconds:.0f} s beside {os.cpu_count()} busy processes (the time recorded beside the "
                  "committed run's)", flush=True)
        else:
            store(name, nb, seconds)
            print(f"{name}: {seconds:.0f} s, outputs written", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
