"""The instructor's grader: what grades strangers' code, apart from the library learners import.

    assignments   `ttlib grade release` and `collect`, and the one-row-per-student CSV export (nbgrader plugins)
    autograde     `ttlib grade autograde`: a class graded N submissions at a time, here or on a Ray cluster, and
                  booked by one process; layouts runs the grading on this machine's pool or a Ray cluster (the
                  pool's processes forked from a fork server that imported pool_preload once); worker grades one
                  submission in a course folder of its own
    execute       autograde's executor (BoundedExecute): every kernel in a sandbox, CPU and idle budgets
    output        a submission's output, capped in the kernel and again in the grader
    plugins       nbgrader's other autograding and feedback steps of the course
    hidden_tests  the hidden tests, run in a sandboxed process of their own on a submission's definitions
    zygote        the fork server those processes start from: PyTorch and ttlib imported once per grading process
    scan          the static scan that flags what an instructor should read
    sandbox       a process tree with its own scratch folder, limits, and no way out (Linux); built from
                  linux (the system calls, and what this machine offers: `ttlib grade doctor`), processes (trees,
                  limits, idle time, the watchdog) and wrapper (the process that confines a command)
    nbrun         running a notebook's cells with a client that does not miss a kernel's last messages

A learner's code never imports this package; a submission that does is flagged (scan).
"""

__all__: list[str] = []
