"""How a grading kernel starts: jupyter_client's kernel manager, the kernel inside the submission's sandbox
(ttlib.grading.sandbox), forked from the grading process's zygote (ttlib.grading.zygote) where there is one.

A kernel started afresh spends its first seconds importing IPython, then the notebook's setup imports PyTorch and
ttlib: 4-7 CPU seconds a submission, most of a class's grading time. Forked from the zygote, which imported them
once, it starts in half a second. It is still a process of its own, used for one submission and then ended,
confined by the same wrapper as a fresh one; the zygote never runs a line of a submission.
"""

from __future__ import annotations

import os

from jupyter_client.manager import AsyncKernelManager

__all__ = ["SandboxedKernelManager"]


class SandboxedKernelManager(AsyncKernelManager):
    """jupyter_client's kernel manager, starting the kernel inside a ttlib.grading.sandbox.Sandbox (`sandbox`); with
    `preload`, forked in that sandbox from the grading process's zygote (ttlib.grading.zygote: PyTorch, ttlib and
    IPython already imported) rather than started afresh, where there is one (`forked`: its process, then)."""

    sandbox = None
    preload = False
    forked = None

    def format_kernel_cmd(self, extra_arguments=None):
        cmd = super().format_kernel_cmd(extra_arguments)
        return self.sandbox.command(cmd) if self.sandbox is not None else cmd

    async def _async_launch_kernel(self, kernel_cmd, **kw):
        from ttlib.grading import sandbox

        env, z = kw.get("env") or dict(os.environ), None
        if self.preload and self.sandbox is not None:  # kernel_cmd: python -m ttlib.grading.sandbox WRAPPER -- KERNEL
            kernel = kernel_cmd[kernel_cmd.index("--") + 1:]
            z = sandbox.zygote_for_run(self.sandbox, kernel, env)
        if z is None:
            return await super()._async_launch_kernel(kernel_cmd, **kw)
        # its stdout and stderr are ours, as a kernel started afresh inherits them; its wrapper leads its session
        self.forked = sandbox.fork(self.sandbox, z, kernel, env, 1, 2)
        p, pid = self.provisioner, self.forked.pid
        p.process, p.pid, p.pgid, p.cwd = self.forked, pid, pid, kw.get("cwd")
        self._reconcile_connection_info(p.connection_info)
