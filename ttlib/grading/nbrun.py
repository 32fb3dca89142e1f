"""Running a notebook with nbclient so that a widget cell's reply is never missed.

A cell that displays widgets sends comm messages on the shell socket while nbclient waits on that socket for the
cell's reply; the wait can miss the reply and sleep until the cell's whole timeout (jupyter/nbclient#312). Used by
grading (execute), the committed outputs (outputs) and the GPU check (gpu_check), which has no nbgrader.
"""

from __future__ import annotations

from nbclient import NotebookClient

__all__ = ["PollingNotebookClient", "poll_shell_in_steps"]


def poll_shell_in_steps(kc, give_up=lambda: False, step: float = 0.5) -> None:
    """Make nbclient's wait for a cell's reply poll the shell channel every `step` seconds, so that a reply missed
    once (the module docstring) is found at the next step. `give_up()` is asked at each step: True ends the wait
    as a timeout would."""
    import time
    from queue import Empty

    get_msg = kc.shell_channel.get_msg

    async def get_msg_in_steps(timeout=None):
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            wait = step if deadline is None else max(0.0, min(step, deadline - time.monotonic()))
            try:
                return await get_msg(timeout=wait)
            except Empty:
                if (deadline is not None and time.monotonic() >= deadline) or give_up():
                    raise

    kc.shell_channel.get_msg = get_msg_in_steps


class PollingNotebookClient(NotebookClient):
    """nbclient's NotebookClient, its wait for each reply polled in short steps (`poll_shell_in_steps`)."""

    async def async_start_new_kernel_client(self):
        kc = await super().async_start_new_kernel_client()
        poll_shell_in_steps(kc)
        return kc
