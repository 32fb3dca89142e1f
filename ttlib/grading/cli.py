"""`ttlib grade`: release the student versions, collect a class's submissions, grade them N at a time (here or on
a Ray cluster), rank the challenge's agents, and say what the sandbox guarantees on this machine. The rest is
nbgrader's own commands (docs/GRADING.md)."""

from __future__ import annotations

import re

from ttlib.errors import ConfigError, UnavailableError

__all__ = ["NBGRADER_OPTION", "add_grade", "run"]

NBGRADER_OPTION = re.compile(r"^--[A-Za-z_]\w*\.\w+=")  # --Class.trait=value: passed to nbgrader's configuration


def add_grade(sub) -> None:
    p = sub.add_parser("grade", help="hand out and grade the exercises with nbgrader (run from the repository root)")
    grade_sub = p.add_subparsers(dest="action", required=True)
    g = grade_sub.add_parser("release", help="nbgrader student versions of every graded notebook -> notebooks/student/")
    g.add_argument("--check", action="store_true", help="write nothing to notebooks/student/; fail if out of date")
    g = grade_sub.add_parser("collect", help="a flat folder of <student>.ipynb -> nbgrader's submitted/ folder")
    g.add_argument("assignment", help="the notebook's name without .ipynb, e.g. 01_attention")
    g.add_argument("folder", help="a folder holding one <student>.ipynb per student")
    g = grade_sub.add_parser("autograde", help="grade a class N submissions at a time (nbgrader's autograde, the "
                             "same plugins and sandbox), here or on a Ray cluster; --Class.trait=value as nbgrader's")
    g.add_argument("assignments", nargs="+", metavar="assignment", help="a notebook's name without .ipynb, e.g. "
                   "01_attention (several: graded in one run)")
    g.add_argument("--jobs", type=int, default=None, help="submissions graded at a time (default: what this machine "
                   "holds now: its free cores, and its memory at a submission's memory limit)")
    g.add_argument("--ray", metavar="ADDRESS", default=None, help="grade on the Ray cluster at ADDRESS (host:port, "
                   "ray://host:port, or auto), a task per submission; --jobs then caps the tasks in flight")
    g.add_argument("--force", action="store_true", help="grade every submission again, not only new or changed ones")
    g = grade_sub.add_parser("leaderboard", help="the challenge's graded agents (notebook 10), best mean return first, "
                             "as CSV")
    g.add_argument("--out", default=None, help="write the CSV here (atomically) instead of printing it")
    grade_sub.add_parser("doctor", help="what the grading sandbox guarantees on this machine (Landlock, namespaces)")
    p.set_defaults(func=run)


def run(args):
    from ttlib.grading.worker import skip_unused_imports

    skip_unused_imports()  # before nbgrader: 2 CPU s less in each `ttlib grade` command
    if args.action == "doctor":
        from ttlib.grading import sandbox

        print(sandbox.capabilities().report())
        return
    try:
        from ttlib.grading import assignments as grade
    except ImportError as e:
        raise UnavailableError(f'needs nbgrader ({e}): python -m pip install -e ".[dev]"') from e

    course = grade.open_course()
    if args.action == "leaderboard":
        from ttlib.grading.challenge import leaderboard

        return leaderboard(course.root, args.out)
    if args.action == "autograde":
        return _autograde(course, args)
    if args.action == "release":
        report = grade.release(course, check=args.check)
        for name in report.unchanged:
            print(f"notebooks/student/{name}: up to date")
        for name in report.written:
            print(f"notebooks/student/{name}: {'OUT OF DATE' if args.check else 'written'}")
        for name in report.stale:
            print(f"notebooks/student/{name}: {'' if args.check else 'removed, '}it has no solution notebook")
        print(f"nbgrader course folder: {course.root} (source/, release/, gradebook.db)")
        if args.check and (report.written or report.stale):
            raise grade.GradingError("student versions out of date: run `ttlib grade release` and commit "
                                     "notebooks/student/")
    else:
        report = grade.collect(course, args.assignment, args.folder)
        for student, problems in report.items():
            flag = "; ".join(problems) + " (nbgrader restores it before grading)" if problems else "ok"
            print(f"{student:20s} -> {course.submitted(student, args.assignment)}  {flag}")
        print(f"collected {len(report)} submissions; next: nbgrader autograde {args.assignment}")


def _autograde(course, args) -> None:
    from ttlib.grading.assignments import GradingError
    from ttlib.grading.autograde import autograde

    if args.jobs is not None and args.jobs < 1:
        raise ConfigError(f"--jobs {args.jobs}: grade at least one submission at a time")
    report = autograde(course, args.assignments, jobs=args.jobs, ray=args.ray, force=args.force,
                       options=getattr(args, "nbgrader_options", []))
    n = len(report.graded) + len(report.failed)
    rate = f" ({n / report.seconds * 60:.1f} a minute)" if n and report.seconds else ""
    where = f"{report.jobs} at a time on {report.where}" if report.jobs else f"on {report.where}"
    print(f"graded {len(report.graded)} submission{'s' * (len(report.graded) != 1)} of {' '.join(args.assignments)} "
          f"in {report.seconds:.0f} s, {where}{rate}; {len(report.up_to_date)} up to date"
          f"{' (--force grades them again)' * bool(report.up_to_date)}; full log: "
          + ", ".join(str(p) for p in report.logs))
    if report.failed:
        raise GradingError(f"{len(report.failed)} submission(s) could not be graded: "
                           + "; ".join(f"{a} {s}: {why}" for (a, s), why in report.failed.items()))
