"""The graders' hidden tests, in a process of their own: a submission's answers run on fresh random trials here, and
the grader compares what they return with ttlib's answer in its own process (`judge_records`).

    python -m ttlib.exercises.hidden RELEASED.ipynb SUBMITTED.ipynb --exercises 01-sdpa,01-mask --seed 123456 \\
        --records-fd 3

What runs here, in this order:
1. the released notebook's cells tagged `setup` (the instructor's imports and settings, not the student's);
2. the submission's *definitions* only: from every code cell, its imports, functions, classes and assignments of
   literal constants. Every other top-level statement is left out: code that would rebind ttlib, install hooks or
   read the checker's state never runs, and neither do the notebook's demos;
3. for each exercise, on trials made from `--seed` (the grader's secret, different in every run), the answer runs
   under the strict guard (ttlib.exercises.refuse): the reference it rebuilds refuses to run under any name, and so
   does what could undo the guard or compute elsewhere.

One JSON line per trial is written to the records file descriptor (a pipe the grader reads), and one per refusal
as soon as it happens: what is written to a pipe cannot be taken back by code that runs afterwards. Nothing here
decides a grade: there is no expected answer in this process to read or to overwrite.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import signal
import sys

__all__ = ["build_namespace", "definitions", "judge_records", "main", "run"]


def definitions(source: str) -> tuple[ast.Module | None, int]:
    """(the definitions of a cell as a module, how many other top-level statements were left out). IPython's
    syntax (magics, `!commands`) is turned into Python first; a cell that does not parse gives (None, 0)."""
    try:
        from IPython.core.inputtransformer2 import TransformerManager

        source = TransformerManager().transform_cell(source)
    except Exception:  # noqa: BLE001 (no IPython, or a cell it cannot transform: try the source as it is)
        pass
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return None, 0
    kept = [node for node in tree.body if _is_definition(node)]
    return ast.Module(body=kept, type_ignores=[]), len(tree.body) - len(kept)


def _is_definition(node: ast.stmt) -> bool:
    if isinstance(node, (ast.Import, ast.ImportFrom, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return True
    if isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        if all(isinstance(t, ast.Name) for t in targets):
            try:
                ast.literal_eval(node.value)  # SCALE = 2.0, NAMES = ("a", "b"): constants only
                return True
            except ValueError:
                return False
    return False


def _cells(path: str) -> list[dict]:
    with open(path, encoding="utf-8") as f:
        return json.load(f)["cells"]


def _source(cell: dict) -> str:
    source = cell.get("source", "")
    return "".join(source) if isinstance(source, list) else source


def build_namespace(released: str, submitted: str, write) -> dict:
    """The namespace the answers run in: the release's setup cells, then the submission's definitions."""
    from ttlib.exercises.refuse import guard

    namespace = {"__name__": "__main__", "__builtins__": __builtins__}
    for index, cell in enumerate(_cells(released)):
        if cell.get("cell_type") == "code" and "setup" in cell.get("metadata", {}).get("tags", []):
            exec(compile(_source(cell), f"<released notebook, cell {index}>", "exec"), namespace)
    setup = {_source(c) for c in _cells(released) if "setup" in c.get("metadata", {}).get("tags", [])}
    dropped = 0
    for index, cell in enumerate(_cells(submitted)):
        meta = cell.get("metadata", {}).get("nbgrader", {})
        if cell.get("cell_type") != "code" or meta.get("grade") or _source(cell) in setup:
            continue
        module, left_out = definitions(_source(cell))
        dropped += left_out
        if module is None or not module.body:
            continue
        code = compile(module, f"<submission, cell {index}>", "exec")
        try:
            with guard(strict=True, report=lambda what: write({"refused": what, "while": "definitions"})):
                exec(code, namespace)
        except Exception as error:  # noqa: BLE001 (a definition that fails: the exercises that need it say so)
            write({"definition_error": f"cell {index}: {type(error).__name__}: {error}"[:500]})
    write({"left_out_statements": dropped})
    return namespace


def _stop_after(cpu_seconds: float, exercise_id: str, write) -> None:
    """After `cpu_seconds` more CPU seconds of this process, say that `exercise_id` ran out of them and end the
    process (a handler that exits: an answer's `except` cannot catch it). 0: never."""
    def stop(signum, frame):
        write({"exercise": exercise_id, "stopped": "cpu time"})
        os._exit(3)

    if cpu_seconds > 0:
        signal.signal(signal.SIGPROF, stop)
    signal.setitimer(signal.ITIMER_PROF, cpu_seconds)


def run(exercise_ids: list[str], seed: int, namespace: dict, write, exercise_cpu: float = 0.0) -> None:
    from ttlib.exercises import find, hidden_seeds

    for exercise_id in exercise_ids:
        exercise = find(exercise_id)
        if exercise is None:
            write({"exercise": exercise_id, "unknown": True})
            continue
        write({"exercise": exercise_id, "started": True})
        missing = [name for name in exercise.names if name not in namespace]
        if missing:
            write({"exercise": exercise_id, "error": f"{', '.join(missing)} is not defined in your notebook"})
            continue
        foreign = [name for name in exercise.names if getattr(namespace[name], "__module__", None) != "__main__"]
        if foreign:
            write({"exercise": exercise_id, "error": f"your {foreign[0]} was not written in your notebook (it "
                                                     f"comes from `{namespace[foreign[0]].__module__}`)"})
            continue
        _stop_after(exercise_cpu, exercise_id, write)
        with exercise.lending(namespace):
            for trial_seed in hidden_seeds(exercise.hidden_trials, seed):
                trial = exercise.make_trial(trial_seed)

                def report(what, exercise_id=exercise_id, trial_seed=trial_seed):
                    write({"exercise": exercise_id, "seed": trial_seed, "refused": what})

                outcome = exercise.outcome(exercise.learner(namespace), trial, learner=True, strict=True,
                                           report=report)
                from ttlib.exercises import encode

                write({"exercise": exercise_id, "seed": trial_seed, "record": encode(outcome)})
        _stop_after(0, exercise_id, write)
        write({"exercise": exercise_id, "finished": True})


def judge_records(lines, exercise_ids: list[str], seed: int) -> dict[str, str | None]:
    """The grader's side: {exercise id: None when it passed, else the message for the student}, from the runner's
    JSON lines. An exercise passes only when every one of its trials came back and is ttlib's answer, and nothing
    was refused while it (or the notebook's definitions) ran."""
    from ttlib.exercises import find, hidden_seeds

    records: dict[tuple[str, int], list[dict]] = {}
    refused: dict[str, str] = {}
    errors: dict[str, str] = {}
    finished = set()
    for line in lines:
        try:
            entry = json.loads(line)
        except (ValueError, TypeError):
            continue  # not a record (the answers cannot make one count by printing garbage)
        if not isinstance(entry, dict):
            continue
        exercise_id = entry.get("exercise")
        if "refused" in entry:
            refused.setdefault(exercise_id if isinstance(exercise_id, str) else "*", str(entry["refused"]))
        elif "error" in entry and isinstance(exercise_id, str):
            errors.setdefault(exercise_id, str(entry["error"]))
        elif "record" in entry and isinstance(exercise_id, str) and isinstance(entry.get("seed"), int):
            records.setdefault((exercise_id, entry["seed"]), []).append(entry["record"])
        elif entry.get("finished") and isinstance(exercise_id, str):
            finished.add(exercise_id)
    verdicts = {}
    for exercise_id in exercise_ids:
        exercise = find(exercise_id)
        what = refused.get(exercise_id) or refused.get("*")
        if exercise is None:
            verdicts[exercise_id] = f"no hidden tests are known for {exercise_id}"
        elif what is not None:
            verdicts[exercise_id] = (f"Exercise {exercise.number} is not right yet: your code called {what}: this "
                                     "exercise asks you to write that yourself, so here it refuses to run.")
        elif exercise_id in errors:
            verdicts[exercise_id] = f"Exercise {exercise.number} is not right yet: {errors[exercise_id]}"
        else:
            verdicts[exercise_id] = _judge_trials(exercise, records, hidden_seeds(exercise.hidden_trials, seed),
                                                  exercise_id in finished)
    return verdicts


def _judge_trials(exercise, records: dict, seeds: list[int], finished: bool) -> str | None:
    from ttlib.exercises import decode

    for trial_seed in seeds:
        got = records.get((exercise.id, trial_seed))
        if not got:
            return (f"Exercise {exercise.number}: the hidden tests did not finish (your code ran out of time or "
                    "stopped the process), so they could not pass.")
        trial = exercise.make_trial(trial_seed)
        for record in got:
            try:
                outcome = decode(record)
            except Exception:  # noqa: BLE001 (a record the runner did not write)
                return f"Exercise {exercise.number}: a hidden test's result could not be read."
            message = exercise.judge(trial, outcome, where="a hidden test")
            if message is not None:
                return message
    if not finished:
        return f"Exercise {exercise.number}: the hidden tests did not finish."
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ttlib.exercises.hidden", description=__doc__.splitlines()[0])
    parser.add_argument("released", help="the released (student) version of the notebook: its setup cells run")
    parser.add_argument("submitted", help="the submission: its definitions are loaded")
    parser.add_argument("--exercises", required=True, help="comma-separated grade_ids of the exercises to run")
    parser.add_argument("--seed", type=int, required=True, help="the first hidden trial's seed (the grader's)")
    parser.add_argument("--records-fd", type=int, default=1, help="file descriptor the JSON lines go to")
    parser.add_argument("--exercise-cpu", type=float, default=0.0,
                        help="CPU seconds an exercise may use; past them the process ends (0: no limit)")
    args = parser.parse_args(argv)
    channel = os.fdopen(os.dup(args.records_fd), "w", buffering=1, encoding="utf-8")
    if args.records_fd == 1:  # the answers' own prints must not land among the records
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115 (for the life of the process)

    def write(record: dict) -> None:
        channel.write(json.dumps(record) + "\n")
        channel.flush()

    namespace = build_namespace(args.released, args.submitted, write)
    run([e for e in args.exercises.split(",") if e], args.seed, namespace, write, args.exercise_cpu)
    write({"done": True})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
