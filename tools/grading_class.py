"""A generated class of one graded notebook -- honest, buggy, cheating and abusive submissions -- and the time
`ttlib grade autograde` takes to grade it at each number of jobs, beside `nbgrader autograde` (one at a time).
For sizing a grading machine, and for docs/GRADING.md's figures.

    python -m tools.grading_class make --students 200 --out class01/      # class01/<student>.ipynb (notebook 01)
    python -m tools.grading_class time --students 200 --jobs 1,2,4,8,16 --work /tmp/gradings [--sequential]
    python -m tools.grading_class time --class tests --sequential --jobs 2 --repeats 2    # tests/' class of 01

`time` grades the same class once per layout, each in a course folder of its own under --work (release, collect,
grade), in the order given, --repeats times round (alternating, so that a machine's changing load falls on every
layout alike). It prints a row a run -- seconds, submissions a minute, speedup over the first layout, CPU seconds,
the load average -- and fails unless every layout gives every student the same points, errors and flags, cell by
cell, and every student the points their kind predicts (`Student.expected`). --limits fast grades with shorter
budgets (60 CPU s a cell, 120 a notebook, 30 an exercise, 2 GiB): a looping submission then costs 2.5 CPU minutes,
not 12. Run it from the repository root, with the course installed (`pip install -e ".[dev]"`).

The class, for every 20 students: 10 honest (the solution's answers), 5 buggy (one plausible slip from
tests/wrong_answers/: that exercise lost), 2 cheating (notebook 01: a way of cheating from tests/wrong_answers/
cheats.py, one exercise lost; other notebooks: one exercise handed to the reference it rebuilds), 1 delegating, and
2 abusive, in turn: a loop, a sleep that ignores SIGTERM and interrupts, a memory hog (each loses the exercise it is
in), an output flood, a vandal that attacks the course folder and leaves a process behind (both keep full marks).
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import os
import re
import resource
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK = "01_attention"
REFUSED = "refuses to run"
PATTERN = ["honest"] * 10 + ["buggy"] * 5 + ["cheating"] * 2 + ["delegating"] + ["abusive"] * 2
ABUSES = ["loop", "sleep", "hog", "flood", "vandal"]
FAST = {"TTLIB_GRADE_CELL_TIMEOUT": "60", "TTLIB_GRADE_NOTEBOOK_TIMEOUT": "120", "TTLIB_GRADE_EXERCISE_CPU": "30",
        "TTLIB_GRADE_MEMORY_GB": "2"}
MARK = "ttlib-grading-class-vandal"
VANDAL = f'''import glob, os, subprocess, sys
for _path in glob.glob(os.path.join(os.environ.get("TTLIB_COURSE_DIR", "/nonexistent"), "*", "*", "*", "*")):
    try:
        open(_path, "w").write("vandalized")
    except OSError:
        pass
subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)", "{MARK}"], start_new_session=True)
'''
FLOOD = "for _ in range(64):\n    print('x' * (1 << 20))\n"


@dataclass
class Student:
    name: str
    kind: str  # honest, buggy, cheating, delegating, or abusive:<loop|sleep|hog|flood|vandal>
    notebook: nbformat.NotebookNode
    lost: list[str] = field(default_factory=list)  # the test cells it should lose

    def expected(self, points: dict[str, float]) -> dict[str, float]:
        return {g: 0.0 if g in self.lost else p for g, p in points.items()}


def test_class(notebook: str = NOTEBOOK) -> list[Student]:
    """The class tests/test_grading.py grades on `notebook` (its students, and the points it expects of each)."""
    sys.path.insert(0, str(ROOT / "tests"))
    import test_grading

    expected = test_grading.EXPECTED
    return [Student(name, "tests", nb, [g for g, p in expected[name][notebook].items() if p == 0])
            for name, nb in test_grading.submissions(notebook).items()]


def _module(path: Path):
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _solutions(notebook: str) -> dict[str, str]:
    """{exercise grade_id: the solution notebook's answer, without nbgrader's markers}."""
    nb = nbformat.read(ROOT / "notebooks" / f"{notebook}.ipynb", as_version=4)
    return {c.metadata["nbgrader"]["grade_id"]: "\n".join(line for line in c.source.splitlines() if "### " not in line)
            for c in nb.cells if c.metadata.get("nbgrader", {}).get("solution")}


def _filled(notebook: str, answers: dict[str, str]):
    """The student version, its exercise cells answered (`answers`: the ones not given stay as released)."""
    nb = nbformat.read(ROOT / "notebooks" / "student" / f"{notebook}.ipynb", as_version=4)
    for c in nb.cells:
        if c.metadata.get("nbgrader", {}).get("grade_id") in answers:
            c.source = answers[c.metadata["nbgrader"]["grade_id"]]
    return nb


def _misbehaving(solution: str, body: str) -> str:
    """The answer with its first function's body replaced by `body` (same signature)."""
    signature = re.search(r"^def \w+\(.*?\):\n", solution, re.M | re.S)
    return solution + "\n\n" + signature.group(0) + body


ABUSIVE_BODIES = {
    "loop": "    while True:\n        pass\n",
    "sleep": ("    import signal, time\n    signal.signal(signal.SIGTERM, signal.SIG_IGN)\n    while True:\n"
              "        try:\n            time.sleep(1)\n        except BaseException:\n            pass\n"),
    "hog": "    held = []\n    while True:\n        held.append(bytearray(100 << 20))\n",
}


def make_class(students: int, notebook: str = NOTEBOOK) -> list[Student]:
    """The class (see the module's docstring), the same every time for the same arguments."""
    solutions = _solutions(notebook)
    exercises = list(solutions)
    wrong = _module(ROOT / "tests" / "wrong_answers" / f"{notebook}.py").ANSWERS
    slips = [a for a in wrong if isinstance(a[2], tuple) and a[3] != REFUSED]
    delegations = [a for a in wrong if a[3] == REFUSED]
    cheats = list(_module(ROOT / "tests" / "wrong_answers" / "cheats.py").CHEATS.items()) \
        if notebook == "01_attention" else []
    out, counts = [], dict.fromkeys(PATTERN + ABUSES, 0)
    for i in range(students):
        kind = PATTERN[i % len(PATTERN)]
        n = counts[kind]
        counts[kind] += 1
        answers, lost = dict(solutions), []
        if kind == "honest":
            pass
        elif kind == "buggy" or (kind == "cheating" and not cheats) or kind == "delegating":
            choices = slips if kind == "buggy" else delegations
            grade_id, _, answer, *_ = choices[n % len(choices)]
            old, new = answer if isinstance(answer, tuple) else (None, answer)
            answers[grade_id] = solutions[grade_id].replace(old, new, 1) if old else new
            lost = [f"{grade_id}-test"]
        elif kind == "cheating":
            name, (_, source) = cheats[n % len(cheats)]
            answers = {} if name == "ipython_hook" else answers  # a blank notebook with the hook: nothing earned
            answers[exercises[0]] = source
            lost = [f"{g}-test" for g in exercises] if name == "ipython_hook" else [f"{exercises[0]}-test"]
        else:
            abuse = ABUSES[n % len(ABUSES)]
            kind, n = f"abusive:{abuse}", counts[abuse]
            counts[abuse] += 1
            target = exercises[n % len(exercises)]
            if abuse in ABUSIVE_BODIES:
                answers[target] = _misbehaving(solutions[target], ABUSIVE_BODIES[abuse])
                lost = [f"{target}-test"]
            else:
                answers[exercises[0]] = (FLOOD if abuse == "flood" else VANDAL) + "\n" + solutions[exercises[0]]
        out.append(Student(f"{kind.split(':')[-1]}{n:03d}", kind, _filled(notebook, answers), lost))
    return out


# ---- grading it, layout by layout -----------------------------------------------------------------------------------
def _run(args: list[str], env: dict, timeout: float) -> str:
    done = subprocess.run([sys.executable, "-m", *args], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=timeout)
    if done.returncode != 0:
        raise RuntimeError(f"`{' '.join(args)}` failed ({done.returncode}):\n{(done.stdout + done.stderr)[-4000:]}")
    return done.stdout


def _become_subreaper() -> None:
    """Processes the grading command leaves to end after it (its pool's fork server, whose children the pool
    processes are) become this process's children, so that their CPU seconds are counted (`_reap_orphans`)."""
    from ttlib.grading.linux import LINUX, PR_SET_CHILD_SUBREAPER, prctl

    if LINUX:
        prctl(PR_SET_CHILD_SUBREAPER, 1)


def _reap_orphans(timeout: float) -> None:
    """Wait for this process's children that are not ours to wait for (orphans adopted as a subreaper)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            time.sleep(0.05)


def _course(work: Path, folder: Path, notebook: str, env: dict) -> dict:
    """A course folder of its own under `work`: the notebook released and the class collected -> its environment."""
    from ttlib.grading.assignments import source_version

    env = {**env, "TTLIB_COURSE_DIR": str(work / "grading")}
    source = work / "grading" / "source" / notebook / f"{notebook}.ipynb"
    source.parent.mkdir(parents=True)
    solution = nbformat.read(ROOT / "notebooks" / f"{notebook}.ipynb", as_version=4)
    nbformat.write(source_version(solution, f"{notebook}.ipynb"), source)
    _run(["nbgrader", "generate_assignment", notebook, "--force"], env, 600)
    _run(["ttlib", "grade", "collect", notebook, str(folder)], env, 600)
    return env


def verdicts(root: Path, notebook: str) -> dict:
    """{student: {test cell: (points, the errors it shows)} and its flags}: what must not depend on the layout."""
    from nbgrader.api import Gradebook

    out = {}
    with Gradebook(f"sqlite:///{root / 'gradebook.db'}") as gb:
        for submission in gb.assignment_submissions(notebook):
            student = submission.student.id
            nb = nbformat.read(root / "autograded" / student / notebook / f"{notebook}.ipynb", as_version=4)
            shown = {c.metadata["nbgrader"]["grade_id"]: [o.ename for o in c.outputs if o.output_type == "error"]
                     for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade")}
            out[student] = {"cells": {g.name: (g.score, shown.get(g.name)) for g in submission.notebooks[0].grades},
                            "flags": nb.metadata.get("ttlib", {}).get("flags")}
    return out


def _hashes(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted((root / "submitted").rglob("*")) if p.is_file()}


def grade_layout(layout: str, folder: Path, work: Path, notebook: str, env: dict, timeout: float) -> dict:
    """Grade the class in `folder` once: layout "sequential" (nbgrader autograde) or "jobs=N" -> a row."""
    env = _course(work, folder, notebook, env)
    root = Path(env["TTLIB_COURSE_DIR"])
    before, load = _hashes(root), os.getloadavg()[0]
    cpu0, start = resource.getrusage(resource.RUSAGE_CHILDREN), time.monotonic()
    args = ["nbgrader", "autograde", notebook] if layout == "sequential" else \
        ["ttlib", "grade", "autograde", notebook, "--jobs", layout.removeprefix("jobs=")]
    _run(args, env, timeout)
    _reap_orphans(timeout=30)  # the pool's fork server, which ends just after the grading process
    seconds, cpu1 = time.monotonic() - start, resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = cpu1.ru_utime + cpu1.ru_stime - cpu0.ru_utime - cpu0.ru_stime
    return {"layout": layout, "seconds": seconds, "cpu_seconds": cpu, "load_before": load,
            "load_after": os.getloadavg()[0], "verdicts": verdicts(root, notebook),
            "submissions_untouched": _hashes(root) == before}


def _left_behind() -> list[int]:
    """Processes the vandals started that are still alive."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if MARK.encode() in Path(f"/proc/{pid}/cmdline").read_bytes():
                found.append(int(pid))
        except OSError:
            pass
    return found


def check(rows: list[dict], students: list[Student], notebook: str) -> list[str]:
    """What is wrong: layouts that disagree, students without the points their kind predicts, touched files."""
    from ttlib.grading.assignments import points

    expected = {s.name: s.expected(points(s.notebook)) for s in students}
    problems = []
    for row in rows:
        got = {name: {g: p for g, (p, _) in v["cells"].items()} for name, v in row["verdicts"].items()}
        wrong = {n: (got.get(n), e) for n, e in expected.items() if got.get(n) != e}
        problems += [f"{row['layout']}: {n} got {g}, expected {e}" for n, (g, e) in sorted(wrong.items())]
        if row["verdicts"] != rows[0]["verdicts"]:
            differ = [n for n in row["verdicts"] if row["verdicts"][n] != rows[0]["verdicts"].get(n)]
            problems.append(f"{row['layout']} differs from {rows[0]['layout']} for {differ}")
        if not row["submissions_untouched"]:
            problems.append(f"{row['layout']}: a submitted file changed while grading")
    if _left_behind():
        problems.append(f"processes the vandals started are alive: {_left_behind()}")
    return problems


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m tools.grading_class", description=__doc__.splitlines()[0])
    p.add_argument("action", choices=["make", "time"])
    p.add_argument("--students", type=int, default=200)
    p.add_argument("--class", dest="klass", choices=["generated", "tests"], default="generated",
                   help="tests: the class tests/test_grading.py grades on the notebook, instead of a generated one")
    p.add_argument("--notebook", default=NOTEBOOK)
    p.add_argument("--out", type=Path, help="make: the folder for <student>.ipynb")
    p.add_argument("--work", type=Path, default=Path("/tmp/ttlib-grading-class"), help="time: course folders here")
    p.add_argument("--jobs", default="2", help="time: comma-separated numbers of jobs, e.g. 1,2,4,8,16")
    p.add_argument("--sequential", action="store_true", help="time: nbgrader autograde too, first")
    p.add_argument("--repeats", type=int, default=1, help="time: rounds over the layouts")
    p.add_argument("--limits", choices=["course", "fast"], default="course")
    p.add_argument("--timeout", type=float, default=6 * 3600, help="time: seconds a layout may take")
    p.add_argument("--json", type=Path, help="time: also write the rows here")
    args = p.parse_args(argv)
    students = make_class(args.students, args.notebook) if args.klass == "generated" else test_class(args.notebook)
    if args.action == "make":
        args.out.mkdir(parents=True, exist_ok=True)
        for s in students:
            nbformat.write(s.notebook, args.out / f"{s.name}.ipynb")
        print(f"{len(students)} submissions of {args.notebook} in {args.out}")
        return 0
    _become_subreaper()
    folder = args.work / "class"
    folder.mkdir(parents=True, exist_ok=True)
    for s in students:
        nbformat.write(s.notebook, folder / f"{s.name}.ipynb")
    env = {**os.environ, "OMP_NUM_THREADS": "1", **(FAST if args.limits == "fast" else {})}
    layouts = ["sequential"] * args.sequential + [f"jobs={n}" for n in args.jobs.split(",") if n]
    rows = []
    print(f"{len(students)} submissions of {args.notebook}, {os.cpu_count()} cores, limits: {args.limits}")
    print(f"{'layout':>12} {'seconds':>9} {'per minute':>10} {'speedup':>8} {'CPU s':>9} {'load':>11}")
    for round_ in range(args.repeats):
        for layout in layouts:
            row = grade_layout(layout, folder, args.work / f"{layout}-{round_}", args.notebook, env, args.timeout)
            rows.append(row)
            first = next(r for r in rows if r["layout"] == layouts[0])
            print(f"{layout:>12} {row['seconds']:9.0f} {len(students) / row['seconds'] * 60:10.1f} "
                  f"{first['seconds'] / row['seconds']:7.2f}x {row['cpu_seconds']:9.0f} "
                  f"{row['load_before']:5.1f}-{row['load_after']:<5.1f}", flush=True)
    if args.json:
        args.json.write_text(json.dumps([{k: v for k, v in r.items() if k != "verdicts"} for r in rows], indent=1))
    problems = check(rows, students, args.notebook)
    print("\n".join(problems) or "every layout: the same points, errors and flags for every student; the points "
          "each kind predicts; no submitted file touched; nothing left running")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
