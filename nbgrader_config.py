# nbgrader configuration of the course: every `nbgrader ...` and `ttlib grade ...` command run from the repository's
# root reads it (so does the formgrader of a JupyterLab started here). See README.md, "For instructors".
import os

c = get_config()  # noqa: F821 (nbgrader provides get_config)

c.CourseDirectory.course_id = "trajectory-transformer"
# The course folder: nbgrader's source/, release/, submitted/, autograded/, feedback/ and gradebook.db live here.
# `grading/` next to this file (ignored by git) unless TTLIB_COURSE_DIR names another folder.
c.CourseDirectory.root = os.path.abspath(os.environ.get("TTLIB_COURSE_DIR")
                                         or os.path.join(os.path.dirname(os.path.abspath(__file__)), "grading"))

# Autograding runs each notebook top to bottom. A cell that runs longer than this (seconds) is interrupted and
# counts as an error, so a submission that loops forever loses that exercise and grading goes on. Notebook 04's
# live training cell is the slowest (about 4 minutes on a 2-core CPU; 30 s with TTLIB_FAST=1).
c.Execute.timeout = 600
# A deleted test cell is put back before grading (and reported by `ttlib grade collect`): deleting it gains nothing.
c.OverwriteCells.add_missing_cells = True
