"""`ttlib grade`: release the student versions, collect a class's submissions, and say what the sandbox
guarantees on this machine. The rest is nbgrader's own commands (docs/GRADING.md)."""

from __future__ import annotations


def add_grade(sub) -> None:
    p = sub.add_parser("grade", help="hand out and grade the exercises with nbgrader (run from the repository root)")
    grade_sub = p.add_subparsers(dest="action", required=True)
    g = grade_sub.add_parser("release", help="nbgrader student versions of every graded notebook -> notebooks/student/")
    g.add_argument("--check", action="store_true", help="write nothing to notebooks/student/; fail if out of date")
    g = grade_sub.add_parser("collect", help="a flat folder of <student>.ipynb -> nbgrader's submitted/ folder")
    g.add_argument("assignment", help="the notebook's name without .ipynb, e.g. 01_attention")
    g.add_argument("folder", help="a folder holding one <student>.ipynb per student")
    grade_sub.add_parser("doctor", help="what the grading sandbox guarantees on this machine (Landlock, namespaces)")
    p.set_defaults(func=run)


def run(args):
    if args.action == "doctor":
        from . import sandbox

        print(sandbox.capabilities().report())
        return
    try:
        from . import assignments as grade
    except ImportError as e:
        raise ValueError(f'needs nbgrader ({e}): python -m pip install -e ".[dev]"') from e

    course = grade.open_course()
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
