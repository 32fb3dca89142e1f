# nbgrader configuration of the course: every `nbgrader ...` and `ttlib grade ...` command run from the repository's
# root reads it (so does the formgrader of a JupyterLab started here). See README.md, "For instructors".
import os

c = get_config()  # noqa: F821 (nbgrader provides get_config)

c.CourseDirectory.course_id = "trajectory-transformer"
# The course folder: nbgrader's source/, release/, submitted/, autograded/, feedback/ and gradebook.db live here.
# `grading/` next to this file (ignored by git) unless TTLIB_COURSE_DIR names another folder.
c.CourseDirectory.root = os.path.abspath(os.environ.get("TTLIB_COURSE_DIR")
                                         or os.path.join(os.path.dirname(os.path.abspath(__file__)), "grading"))

# Autograding runs each notebook top to bottom, with ttlib.tools.grade_plugins.BoundedExecute in place of nbgrader's
# Execute. Each kernel runs in ttlib.tools.sandbox (Linux; `ttlib grade doctor` says what holds on this machine): it
# writes only a scratch folder of its own, reads no other student's files, nor the gradebook, nor the sources, and
# nothing it starts outlives it. Time is counted in CPU seconds of the kernel and every process it started, so a
# busy grading machine does not cut a correct submission short:
# - a cell that uses more than Execute.timeout CPU seconds is interrupted and counts as an error, so a submission
#   that loops forever loses that exercise and grading goes on. With TTLIB_FAST=1 (as the README grades) the slowest
#   cell, notebook 06's evaluation, takes about 90 s on a 2-core CPU (notebook 03's live training: 4 minutes
#   without TTLIB_FAST, 30 s with it);
# - the whole notebook gets BoundedExecute.notebook_timeout CPU seconds, kernel start included: each cell may use at
#   most what is left, and the cells after the limit are not run (their tests score 0). A submission whose looping
#   function later cells call again therefore costs at most this much, never a timeout per call. A clock backstop
#   (BoundedExecute.wall_factor times these) ends a submission that only sleeps;
# - the kernel (with every process it started) may use BoundedExecute.memory_limit bytes of memory; beyond that it
#   is killed. A kernel that dies costs only the tests that had not run yet: the ones above keep their points;
# - output is capped (BoundedExecute.output_limit a cell, notebook_output_limit a notebook), the rest dropped.
# TTLIB_GRADE_CELL_TIMEOUT, TTLIB_GRADE_NOTEBOOK_TIMEOUT (CPU seconds), TTLIB_GRADE_WALL_FACTOR and
# TTLIB_GRADE_MEMORY_GB override these.
c.Execute.timeout = 300
c.BoundedExecute.notebook_timeout = 600
c.BoundedExecute.memory_limit = 6 * 2**30
c.Autograde.autograde_preprocessors = [
    "ttlib.tools.grade_plugins.BoundedExecute",  # instead of nbgrader's Execute; the rest is nbgrader's default list
    "nbgrader.preprocessors.IgnorePattern",
    "nbconvert.preprocessors.ClearMetadataPreprocessor",
    "nbgrader.preprocessors.LimitOutput",
    "ttlib.tools.grade_plugins.SaveAutoGrades",  # nbgrader's; a submission it cannot book gets 0 with the reason
    "nbgrader.preprocessors.AssignLatePenalties",
    "nbgrader.preprocessors.CheckCellMetadata",
]
# A deleted test cell is put back before grading (and reported by `ttlib grade collect`): deleting it gains nothing.
# ttlib.tools.grade_plugins.OverwriteCells is nbgrader's, with a log that warns only about test cells a student edited
# (nbgrader's own warns "checksum has changed" for every test cell of every student: its hidden tests differ from
# the release).
c.OverwriteCells.add_missing_cells = True
c.Autograde.sanitize_preprocessors = [
    "nbgrader.preprocessors.ClearOutput",
    "nbgrader.preprocessors.DeduplicateIds",
    "nbgrader.preprocessors.OverwriteKernelspec",
    "ttlib.tools.grade_plugins.OverwriteCells",
    "nbgrader.preprocessors.CheckCellMetadata",
]
# Feedback shows a student their own results: no hidden tests (nor the traceback lines quoting them), and no errors
# of demo cells that are not theirs to fix (ttlib.tools.grade_plugins.StudentFeedback).
c.GenerateFeedback.preprocessors = [
    "nbgrader.preprocessors.GetGrades",
    "ttlib.tools.grade_plugins.StudentFeedback",
    "nbconvert.preprocessors.CSSHTMLHeaderPreprocessor",
]
