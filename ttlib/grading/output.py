"""A submission's output, bounded on both sides of the kernel's sockets: what a test cell may show, and how much.

    limit_kernel_output(per_cell, per_kernel)   run inside the kernel when it starts: its stdout and stderr carry
                                                at most so many characters a cell and in all (the first line)
    OutputCap(per_cell, per_notebook)           the grader's side: what it keeps of the messages it receives (the
                                                second line, which a submission cannot undo)
    reads_as_score(output)                      whether nbgrader would read an output of a test cell as its score
"""

from __future__ import annotations

import sys
import threading

__all__ = ["KERNEL_OUTPUT_NOTE", "OUTPUT_NOTE", "OutputCap", "SLACK", "limit_kernel_output", "mib", "reads_as_score",
           "size"]

OUTPUT_NOTE = "[ttlib: output over the grading limit ({}): the rest was dropped]\n"
KERNEL_OUTPUT_NOTE = "\n" + OUTPUT_NOTE
SLACK = 64 * 2**10  # the kernel drops its own excess first, with its note: the grader's cap is the second line


def size(content) -> int:
    """About how much text an output message holds (characters)."""
    if isinstance(content, str):
        return len(content)
    if isinstance(content, dict):
        return sum(len(k) + size(v) for k, v in content.items())
    if isinstance(content, (list, tuple)):
        return sum(size(v) for v in content)
    return 8


def reads_as_score(output) -> bool:
    """Whether nbgrader would take this output of a test cell for the cell's score: an execute_result (nbgrader
    reads the first one as partial credit, before any error after it), or a display of a number."""
    if output.get("output_type") == "execute_result":
        return True
    if output.get("output_type") != "display_data":
        return False
    text = output.get("data", {}).get("text/plain", "")
    text = "".join(text) if isinstance(text, list) else str(text)
    try:
        float(text)
        return True
    except ValueError:
        return False


def mib(n: float) -> str:
    return f"{n / 2**20:g} MiB"


class OutputCap:
    """The grader's count of a kernel's output: at most `per_cell` characters a cell and `per_notebook` in all are
    kept, then one note; an error past them keeps its name and message (it decides a test cell's score)."""

    def __init__(self, per_cell: int, per_notebook: int):
        self.per_cell, self.per_notebook = per_cell, per_notebook
        self.in_notebook = 0
        self.new_cell()

    def new_cell(self) -> None:
        self.in_cell, self.noted = 0, False

    def admit(self, msg: dict, cell) -> bool:
        """Whether to process `msg` (a message of `cell`): False drops it; an error over the limits is cut short."""
        import nbformat

        kind = msg.get("msg_type")
        if kind == "clear_output":
            self.in_cell = 0
        if kind not in ("stream", "display_data", "execute_result", "update_display_data", "error", "comm_open",
                        "comm_msg"):
            return True
        n = size(msg.get("content"))
        self.in_cell += n
        self.in_notebook += n
        limit = None
        if self.in_cell > self.per_cell + SLACK:
            limit = f"{mib(self.per_cell)} a cell"
        elif self.in_notebook > self.per_notebook + SLACK:
            limit = f"{mib(self.per_notebook)} a notebook"
        if limit is None:
            return True
        if kind == "error":
            content = msg["content"]
            content["evalue"] = str(content.get("evalue", ""))[:1000]
            content["traceback"] = [line[:1000] for line in list(content.get("traceback", []))[-1:]]
            return True
        if not self.noted:
            self.noted = True
            cell.outputs.append(nbformat.v4.new_output("stream", name="stdout", text=OUTPUT_NOTE.format(limit)))
        return False


def limit_kernel_output(per_cell: int, per_kernel: int) -> None:
    """Run inside an IPython kernel when it starts (BoundedExecute passes it as an exec_line): the stream messages
    its stdout and stderr send (print, and what the kernel reads back from its file descriptors 1 and 2) carry at
    most `per_cell` characters for each cell and `per_kernel` in all, the excess dropped with one note, so printing
    gigabytes sends only small messages. A submission can undo this; the grader caps again what it receives, and
    stops a kernel whose output grows the grading process."""
    session = getattr(sys.stdout, "session", None)
    if session is None:  # not an ipykernel stream
        return
    state = {"cell": None, "in_cell": 0, "in_all": 0, "noted": False}
    lock = threading.Lock()
    send = session.send

    def send_capped(stream, msg_or_type, *args, **kwargs):
        content = msg_or_type.get("content") if isinstance(msg_or_type, dict) else None
        if isinstance(msg_or_type, dict) and msg_or_type.get("msg_type") == "stream" and content:
            text = content.get("text", "")
            with lock:
                cell = (msg_or_type.get("parent_header") or {}).get("msg_id")
                if cell != state["cell"]:
                    state.update(cell=cell, in_cell=0, noted=False)
                left_cell, left_all = per_cell - state["in_cell"], per_kernel - state["in_all"]
                part = text[:max(0, min(left_cell, left_all))]
                if len(part) < len(text):
                    if not state["noted"]:
                        which = f"{per_cell / 2**20:g} MiB a cell" if left_cell <= left_all else \
                            f"{per_kernel / 2**20:g} MiB in all"
                        part += KERNEL_OUTPUT_NOTE.format(which)
                        state["noted"] = True
                    if not part:
                        return None
                    content["text"] = part
                state["in_cell"] += len(part)
                state["in_all"] += len(part)
        return send(stream, msg_or_type, *args, **kwargs)

    session.send = send_capped
