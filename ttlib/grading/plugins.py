"""nbgrader plugins of the course, named in nbgrader_config.py: what autograding and feedback do differently.

    BoundedExecute     (ttlib.grading.execute) autograde's executor: each kernel in a sandbox, CPU-time bounds per
                       cell and per submission, memory and output bounds; the hidden tests decide the scores
    SaveAutoGrades     nbgrader's, but a submission whose grades nbgrader cannot record gets 0 with the reason
    OverwriteCells     puts test cells back as released, and warns only about cells a student edited
    StudentFeedback    feedback holds the student's own results: no hidden tests, no errors of demo cells, the
                       messages of failed exercises whole, and what the scan flagged
"""

from __future__ import annotations

import re

import nbformat
from nbconvert.preprocessors import Preprocessor as _Preprocessor
from nbgrader.preprocessors import OverwriteCells as _OverwriteCells
from nbgrader.preprocessors import SaveAutoGrades as _SaveAutoGrades

from ttlib.grading.execute import error_output

__all__ = ["ANSI", "CELL_FRAME", "HIDDEN_TESTS", "OverwriteCells", "SaveAutoGrades", "StudentFeedback",
           "WHOLE_MESSAGES"]


# ---- autograde: a submission nbgrader cannot book gets 0, with the reason ------------------------------------------
class SaveAutoGrades(_SaveAutoGrades):
    """nbgrader's SaveAutoGrades, which records each test cell's score in the gradebook. When that fails for one
    submission (nbgrader raises, e.g. "partial credit cannot be greater than maximum points"), nbgrader would log a
    traceback, delete the submission's autograded notebook and leave its grades half written. Here every test cell
    of that submission gets an error saying why (0 points), the grades are recorded again, and the autograded
    notebook and feedback say so; the other submissions are graded as usual. A failure of the gradebook itself (a
    database error) is no submission's doing: it still stops the run, as in nbgrader.

    A notebook's grades are recorded in one transaction (nbgrader commits after each cell): a grading process that
    dies while it books a submission leaves that submission's grades as they were, never half written."""

    def preprocess(self, nb, resources):
        from sqlalchemy.exc import SQLAlchemyError

        try:
            return self._record(nb, resources)
        except SQLAlchemyError:  # the gradebook itself (locked, out of date): nbgrader stops the run, rightly
            raise
        except Exception as e:
            reason = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
            student = resources.get("nbgrader", {}).get("student", "?")
            self.log.error("ttlib: nbgrader could not record %s's grades (%s): every test of this submission scores "
                           "0, and its notebook says why", student, reason)
            for cell in nb.cells:
                if cell.cell_type == "code" and cell.metadata.get("nbgrader", {}).get("grade"):
                    cell.outputs = [error_output("GradingFailed", f"nbgrader could not grade this submission "
                                                                  f"({reason}); every test scores 0. Ask your "
                                                                  "instructor to look at it.")]
            return self._record(nb, resources)

    def _record(self, nb, resources):
        """What nbgrader's SaveAutoGrades.preprocess does (its steps for each cell), with one commit at the end."""
        from nbgrader.api import Gradebook

        info = resources["nbgrader"]
        self.notebook_id, self.assignment_id = info["notebook"], info["assignment"]
        self.student_id, self.db_url = info["student"], info["db_url"]
        with Gradebook(self.db_url) as self.gradebook:
            session = self.gradebook.db
            session.commit = session.flush  # nbgrader's commit after each cell: written, not yet committed
            try:
                nb, resources = _Preprocessor.preprocess(self, nb, resources)  # the cells, one by one
            finally:
                del session.commit
            session.commit()
        return nb, resources


# ---- autograde's log: say "edited" only when a student edited a test cell ----------------------------------------
class OverwriteCells(_OverwriteCells):
    """nbgrader's OverwriteCells (puts every test cell back as the instructor wrote it, hidden tests included), with
    a log that means something. nbgrader compares each test cell with the instructor's version, which holds the
    hidden tests the student version lacks, so it warns "Attribute 'checksum' ... has changed!" for every test cell
    of every student. Here a test cell as released is put back quietly (debug level); one the student edited gets a
    warning that says so. `ttlib grade collect` and the `flagged` column of StudentTotals report the same cells."""

    def preprocess_cell(self, cell, resources, cell_index):
        self._as_released = cell.metadata.get("nbgrader", {}).get("checksum")  # what release wrote into it
        return super().preprocess_cell(cell, resources, cell_index)

    def report_change(self, name, attr, old, new) -> None:
        if attr != "checksum":
            return super().report_change(name, attr, old, new)
        if new == self._as_released:
            self.log.debug("test cell %s as released: hidden tests put back", name)
        else:
            self.log.warning("test cell %s was edited by the student: put back as released (see `ttlib grade "
                             "collect`)", name)


# ---- generate_feedback: what a student sees is theirs -------------------------------------------------------------
HIDDEN_TESTS = re.compile(r"^[ \t]*### BEGIN HIDDEN TESTS.*?^[ \t]*### END HIDDEN TESTS[^\n]*\n?", re.M | re.S)
ANSI = re.compile(r"\x1b\[[0-9;]*m")
CELL_FRAME = re.compile(r"Cell In\s*\[(\d+)\]")
# errors whose every line is the message (what is wrong, then the details): kept whole
WHOLE_MESSAGES = {"ExerciseFailed", "HiddenTestFailed", "NotRun", "KernelDied", "GradingFailed"}


class StudentFeedback(_Preprocessor):
    """generate_feedback's view of an autograded notebook, for the student:
    - test cells show what the student version showed: the hidden tests' source is left out, and so are the
      traceback lines of the test cell itself (they quote it); the message of a failure stays, and so do the lines
      of the student's own code it went through;
    - errors in cells that are neither an exercise nor a test (demos that ran during grading) are left out: they
      cost no points and need not be the student's doing."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.enabled = True  # nbconvert's preprocessors are off unless enabled; nbgrader's are on

    def preprocess(self, nb, resources):
        own = {c.get("execution_count") for c in nb.cells
               if c.cell_type == "code" and c.metadata.get("nbgrader", {}).get("solution")} - {None}
        for cell in nb.cells:
            if cell.cell_type != "code":
                continue
            meta = cell.metadata.get("nbgrader", {})
            if meta.get("grade"):
                cell.source = HIDDEN_TESTS.sub("# (hidden tests: not shown)\n", cell.source)
                for output in cell.outputs:
                    if output.output_type == "error" and output.get("ename") not in WHOLE_MESSAGES:
                        output.traceback = self._own_frames(output.traceback, own)
            elif not meta.get("solution"):
                cell.outputs = [o for o in cell.outputs if o.output_type != "error"]
        flags = nb.metadata.get("ttlib", {}).get("flags") or []
        if flags:
            nb.cells.insert(0, nbformat.v4.new_markdown_cell(
                "**Flagged for your instructor to read** (this decides no points; the hidden tests did): lines of "
                "your code that do something the exercises never need --\n\n"
                + "\n".join(f"- {flag}" for flag in flags)))
        return nb, resources

    @staticmethod
    def _own_frames(traceback: list[str], own: set[int]) -> list[str]:
        """The last line (the message) and the frames in the student's own exercise cells."""
        if not traceback:
            return traceback
        keep = []
        for entry in traceback[:-1]:
            frame = CELL_FRAME.search(ANSI.sub("", entry))
            if frame and int(frame.group(1)) in own:
                keep.append(entry)
        return keep + traceback[-1:]
