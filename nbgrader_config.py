# nbgrader configuration of the course: every `nbgrader ...` and `ttlib grade ...` command run from the repository's
# root reads it (so does the formgrader of a JupyterLab started here). See README.md, "For instructors".
import os

c = get_config()  # noqa: F821 (nbgrader provides get_config)

c.CourseDirectory.course_id = "trajectory-transformer"
# The course folder: nbgrader's source/, release/, submitted/, autograded/, feedback/ and gradebook.db live here.
# `grading/` next to this file (ignored by git) unless TTLIB_COURSE_DIR names another folder.
c.CourseDirectory.root = os.path.abspath(os.environ.get("TTLIB_COURSE_DIR")
                                         or os.path.join(os.path.dirname(os.path.abspath(__file__)), "grading"))

# Autograding runs each submission with ttlib.grading.execute.BoundedExecute in place of nbgrader's Execute (see
# docs/GRADING.md). The kernel runs the release's setup cells, the answers and the test cells, and only
# the definitions of every other cell; the hidden tests then run in a process of their own and decide the points; a
# static scan flags what an instructor should read. Each kernel runs in ttlib.grading.sandbox (Linux; `ttlib grade
# doctor` says what holds on this machine): it writes only a scratch folder of its own, reads no other student's
# files, nor the gradebook, nor the sources, and nothing it starts outlives it. Time is counted in CPU seconds of
# the kernel and every process it started, so a busy grading machine does not cut a correct submission short:
# - a cell that uses more than Execute.timeout CPU seconds is interrupted and counts as an error; the whole kernel
#   run gets BoundedExecute.notebook_timeout CPU seconds, kernel start included (a correct submission uses 5-9);
# - the hidden tests get 60 CPU seconds to start and BoundedExecute.exercise_cpu an exercise: a looping answer is
#   stopped there, and the exercises after it still run;
# - a submission that only sleeps or waits is stopped by the clock's idle seconds (no thread of it running or
#   waiting for a CPU, so a loaded machine adds none): BoundedExecute.cell_idle a cell (then the kernel run ends),
#   notebook_idle in all its cells, exercise_idle an exercise's hidden tests; the plain clock (wall_factor times the
#   CPU budgets) is the last backstop, where Linux does not report idle time;
# - the kernel (with every process it started) may use BoundedExecute.memory_limit bytes of memory, and so may the
#   hidden tests; beyond that they are killed and the exercises they could not finish score 0;
# - output is capped (BoundedExecute.output_limit a cell, notebook_output_limit a notebook), the rest dropped.
# TTLIB_GRADE_CELL_TIMEOUT, TTLIB_GRADE_NOTEBOOK_TIMEOUT, TTLIB_GRADE_EXERCISE_CPU (CPU seconds),
# TTLIB_GRADE_CELL_IDLE, TTLIB_GRADE_NOTEBOOK_IDLE, TTLIB_GRADE_EXERCISE_IDLE (idle seconds),
# TTLIB_GRADE_WALL_FACTOR and TTLIB_GRADE_MEMORY_GB override these (`ttlib grade autograde` carries them to its
# workers, on this machine or on a Ray cluster).
c.Execute.timeout = 300
c.BoundedExecute.notebook_timeout = 600
c.BoundedExecute.memory_limit = 6 * 2**30
c.BoundedExecute.exercise_cpu = 120
c.BoundedExecute.cell_idle = 60
c.BoundedExecute.notebook_idle = 120
c.BoundedExecute.exercise_idle = 20
c.Autograde.autograde_preprocessors = [
    "ttlib.grading.execute.BoundedExecute",  # instead of nbgrader's Execute; the rest is nbgrader's default list
    "nbgrader.preprocessors.IgnorePattern",
    "nbconvert.preprocessors.ClearMetadataPreprocessor",
    "nbgrader.preprocessors.LimitOutput",
    "ttlib.grading.plugins.SaveAutoGrades",  # nbgrader's; a submission it cannot book gets 0 with the reason
    "nbgrader.preprocessors.AssignLatePenalties",
    "nbgrader.preprocessors.CheckCellMetadata",
]
# A deleted test cell is put back before grading (and reported by `ttlib grade collect`): deleting it gains nothing.
# ttlib.grading.plugins.OverwriteCells is nbgrader's, with a log that warns only about test cells a student edited
# (nbgrader's own warns "checksum has changed" for every test cell of every student: its hidden tests differ from
# the release).
c.OverwriteCells.add_missing_cells = True
c.Autograde.sanitize_preprocessors = [
    "nbgrader.preprocessors.ClearOutput",
    "nbgrader.preprocessors.DeduplicateIds",
    "nbgrader.preprocessors.OverwriteKernelspec",
    "ttlib.grading.plugins.OverwriteCells",
    "nbgrader.preprocessors.CheckCellMetadata",
]
# Feedback shows a student their own results: no hidden tests (nor the traceback lines quoting them), and no errors
# of demo cells that are not theirs to fix (ttlib.grading.plugins.StudentFeedback).
c.GenerateFeedback.preprocessors = [
    "nbgrader.preprocessors.GetGrades",
    "ttlib.grading.plugins.StudentFeedback",
    "nbconvert.preprocessors.CSSHTMLHeaderPreprocessor",
]
