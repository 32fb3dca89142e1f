"""The instructor's grader: what grades strangers' code, apart from the library learners import.

    assignments   `ttlib grade release` and `collect`, and the one-row-per-student CSV export (nbgrader plugins)
    plugins       nbgrader's autograding steps: every kernel in a sandbox, CPU budgets, hidden tests decide points
    sandbox       a process tree with its own scratch folder, limits, and no way out (Linux); `ttlib grade doctor`
    hidden_tests  the hidden tests, run in a sandboxed process of their own on a submission's definitions
    scan          the static scan that flags what an instructor should read
    nbrun         running a notebook's cells with a client that does not miss a kernel's last messages

A learner's code never imports this package; a submission that does is flagged (scan).
"""
