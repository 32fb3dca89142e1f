"""How long the README's test command takes, kept honest.

The README states the minutes its test command takes and the CPU they were measured on; docs/TESTING.md breaks
that run down by group (`--durations=0`). Three things keep the figure from drifting:

- every run of the README's whole command that passes is recorded by tests/conftest.py in pytest's cache
  (`.pytest_cache`: seconds on the clock, CPU, cores, the load average when it started), and its summary prints
  the comparison with the README's figure;
- tests/test_readme.py asserts that the README's minutes are docs/TESTING.md's measured run, and that the last
  recorded run on a machine like the README's (2 cores of its CPU family, quiet when it started) is within FACTOR
  of them;
- CI runs `python -m tools.suite_time --check` right after the command, on a fresh clone, and prints the run it
  just recorded beside the README's figure, judged the same way (printed, not enforced: CI's machine is not
  always the README's).

A run on more or fewer cores, on another CPU than the README names, or one that started beside other work (load
average >= QUIET_LOAD), is recorded and printed but not judged: its time says nothing about the README's machine,
and failing it would fail honest code.

    python -m tools.suite_time --check             # judge the last recorded run (exit 1 when off)
    python -m tools.suite_time --table run.txt     # docs/TESTING.md's table from a --durations=0 run's output
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CACHE_KEY = "ttlib/whole-run"  # pytest's cache entry (.pytest_cache/v/ttlib/whole-run)
FACTOR = 1.5  # the README's minutes may be off by this factor, either way, before a judged run fails
CORES = 2  # the README's figure is for a machine with this many cores
QUIET_LOAD = 1.0  # a run is judged only when the 1-minute load average was below this when it started
CLAIM = re.compile(r"about (\d+) minutes on 2 CPU cores \(([^)]+)\)")  # the README's test line
DOCUMENTED = re.compile(r"^Whole run: (\d+) passed in ([\d,]+) s", re.MULTILINE)  # docs/TESTING.md
GROUPS = {  # docs/TESTING.md's groups: the first whose pattern matches a test's path
    "notebooks (nbval)": r"^notebooks/",
    "grading": r"^tests/test_(grading|grading_sandbox|sandbox|idle_clock|challenge)\.py",
    "exercises": r"^tests/test_(exercises|cheats)\.py",
    "distributed": r"^tests/test_(distributed|data_parallel)\.py",
    "browser": r"^tests/test_(browser|lab|colab)\.py",
    "the rest": r".",
}
DURATION = re.compile(r"^([\d.]+)s (setup|call|teardown) +(\S+)", re.MULTILINE)
SUMMARY = re.compile(r"=+ (\d+) passed.* in ([\d.]+)s")


def readme_claim(readme: str | None = None) -> tuple[int, str]:
    """(minutes, CPU) the README's test line states."""
    readme = readme if readme is not None else (ROOT / "README.md").read_text(encoding="utf-8")
    found = CLAIM.search(readme)
    if not found:
        raise ValueError(f"the README's test line should say 'about N minutes on 2 CPU cores (CPU)': {CLAIM.pattern}")
    return int(found.group(1)), found.group(2)


def documented(text: str | None = None) -> tuple[int, float]:
    """(tests, seconds) of the whole run docs/TESTING.md reports."""
    text = text if text is not None else (ROOT / "docs" / "TESTING.md").read_text(encoding="utf-8")
    found = DOCUMENTED.search(text)
    if not found:
        raise ValueError(f"docs/TESTING.md should say '{DOCUMENTED.pattern}'")
    return int(found.group(1)), float(found.group(2).replace(",", ""))


def minutes(seconds: float) -> int:
    """A run's time as the README says it: whole minutes, rounded up."""
    return max(1, math.ceil(seconds / 60))


def is_whole_run(args: list[str], invocation_dir: Path, other_options: bool) -> bool:
    """Whether pytest ran the README's command: tests/ and notebooks/ of this repository in fast mode, and not
    `other_options` (tests deselected, or options other than the README's)."""
    paths = sorted((invocation_dir / a).resolve() for a in args if not a.startswith("-"))
    return paths == [ROOT / "notebooks", ROOT / "tests"] and not other_options and os.environ.get("TTLIB_FAST") == "1"


def cpu_name() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines() if Path("/proc/cpuinfo").exists() else []:
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return "unknown CPU"


def record(seconds: float, passed: int, load_at_start: float) -> dict:
    return {"seconds": round(seconds, 1), "passed": passed, "cpu": cpu_name(), "cores": os.cpu_count(),
            "load_at_start": round(load_at_start, 2), "date": time.strftime("%Y-%m-%d %H:%M")}


def same_cpu(model_name: str, stated_cpu: str) -> bool:
    """Whether /proc/cpuinfo's model name ("AMD EPYC", "AMD EPYC 7B13") is of the CPU family the README names ("AMD
    EPYC Zen 3"): the same maker and family, its first two words ("Intel(R) Xeon(R) Processor" is not)."""
    def family(name: str) -> list[str]:
        return re.sub(r"\((R|TM)\)|,", " ", name, flags=re.IGNORECASE).lower().split()[:2]
    model = family(model_name)
    return len(model) == 2 and model == family(stated_cpu)


def judged(run: dict, stated_cpu: str) -> bool:
    """Whether a run's time can be compared with the README's: the README's kind of machine (its cores and its
    CPU: another CPU is faster or slower by a factor of its own), quiet at the start."""
    return (run.get("cores") == CORES and same_cpu(run.get("cpu", ""), stated_cpu)
            and run.get("load_at_start", math.inf) < QUIET_LOAD)


def verdict(run: dict, stated_minutes: int, stated_cpu: str) -> tuple[bool, str]:
    """(ok, the line the summary prints): the run beside the README's figure."""
    ratio = run["seconds"] / (stated_minutes * 60)
    line = (f"the whole run: {run['seconds']:.0f} s ({run['seconds'] / 60:.1f} min, {run['passed']} passed) on "
            f"{run['cores']} x {run['cpu']}, load {run['load_at_start']:g} at the start; the README says about "
            f"{stated_minutes} minutes on {stated_cpu}: {ratio:.2f}x")
    if not judged(run, stated_cpu):
        return True, line + f" (not judged: only a quiet run on {CORES} cores of the README's CPU is)"
    ok = 1 / FACTOR <= ratio <= FACTOR
    return ok, line + ("" if ok else f" -- more than {FACTOR:g}x off: measure again and update the README's line "
                                     "and docs/TESTING.md")


def group_times(output: str) -> tuple[dict[str, float], tuple[int, float] | None]:
    """A `--durations=0` run's output -> ({group: seconds of its tests' setup, call and teardown}, (passed, seconds
    of the whole run) or None)."""
    groups = dict.fromkeys(GROUPS, 0.0)
    for seconds, _, test in DURATION.findall(output):
        path = test.split("::")[0]
        groups[next(g for g, pattern in GROUPS.items() if re.search(pattern, path))] += float(seconds)
    summary = SUMMARY.search(output)
    return groups, (int(summary.group(1)), float(summary.group(2))) if summary else None


def table(output: str) -> str:
    groups, whole = group_times(output)
    rows = ["| group | seconds (setup + call + teardown, summed over both workers) |", "|---|---|"]
    rows += [f"| {group} | {seconds:,.0f} |" for group, seconds in groups.items()]
    if whole:
        rows.append(f"\nWhole run: {whole[0]} passed in {whole[1]:,.0f} s")
    return "\n".join(rows)


def last_run(cache_dir: Path = ROOT / ".pytest_cache") -> dict | None:
    path = cache_dir / "v" / CACHE_KEY
    return json.loads(path.read_text()) if path.exists() else None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.suite_time", description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="judge the last recorded whole run; exit 1 when off")
    parser.add_argument("--table", metavar="OUTPUT", help="the per-group table of a --durations=0 run's output")
    args = parser.parse_args(argv)
    if args.table:
        print(table(Path(args.table).read_text(encoding="utf-8", errors="replace")))
    if args.check:
        run = last_run()
        if run is None:
            print("no whole run recorded: run the README's test command first", file=sys.stderr)
            return 1
        ok, line = verdict(run, *readme_claim())
        print(line)
        return 0 if ok else 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
