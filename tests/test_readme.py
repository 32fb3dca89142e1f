"""The README opens with what the course achieves; its numbers and its figure are docs/RESULTS.md's. Its test
command's minutes are docs/TESTING.md's measured run, and the last whole run recorded here agrees with them."""

import re
from pathlib import Path

from tools import readme_figure, suite_time

ROOT = Path(__file__).resolve().parents[1]


def opening() -> str:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    return readme.split("**What you end up with**", 1)[1].split("**For whom:**", 1)[0]


def test_the_figure_shows_what_results_md_says():
    assert (ROOT / "assets" / "results.png").is_file()
    assert readme_figure.drawn_scores() == readme_figure.scores(), (
        "docs/RESULTS.md changed since assets/results.png was drawn: run `python -m tools.readme_figure`")
    assert "![What the course's agents score](assets/results.png)" in opening()


def test_every_number_the_opening_quotes_is_in_results_md():
    results = (ROOT / "docs" / "RESULTS.md").read_text(encoding="utf-8")
    numbers = re.findall(r"\d+(?:\.\d+)?(?: \+- \d+\.\d+|-\d+x|x)?", opening().replace("\n  ", " "))
    quoted = [n for n in numbers if "." in n or "x" in n]  # returns and speed-ups, not counts of episodes
    assert len(quoted) >= 8, quoted
    for number in quoted:
        assert number in results, f"the README quotes {number!r}, which docs/RESULTS.md does not say"


def test_the_readme_states_how_long_the_test_command_takes_and_on_what():
    """The README's minutes are docs/TESTING.md's measured whole run (rounded up), on a named CPU; and the last whole
    run recorded on this machine (tests/conftest.py), when it was the README's kind of machine and quiet, took
    within tools/suite_time.FACTOR of them (tools/suite_time.py says why other runs are not judged)."""
    stated, cpu = suite_time.readme_claim()
    tests, seconds = suite_time.documented()
    assert stated == suite_time.minutes(seconds), (
        f"the README says about {stated} minutes; docs/TESTING.md's run took {seconds:.0f} s")
    assert cpu in (ROOT / "docs" / "TESTING.md").read_text(encoding="utf-8"), "the same CPU named in both"
    assert tests >= 700, "docs/TESTING.md's run is a whole run"
    last = suite_time.last_run()  # pytest's cache of this checkout (.pytest_cache)
    if last is not None:
        ok, line = suite_time.verdict(last, stated, cpu)
        assert ok, line


def test_a_run_far_from_the_readmes_minutes_is_judged_off():
    """The guard can fail: a quiet 2-core run twice the README's minutes is off, and so is one a third of them;
    a run on another machine (more cores, another CPU), or one that began beside other work, is shown but not
    judged."""
    run = {"seconds": 600.0, "passed": 718, "cpu": "AMD EPYC", "cores": 2, "load_at_start": 0.2}
    zen3 = "AMD EPYC Zen 3"
    assert all(suite_time.verdict(run, minutes, zen3)[0] for minutes in (7, 10, 14))
    assert not suite_time.verdict(run, 5, zen3)[0] and not suite_time.verdict(run, 30, zen3)[0]
    assert "more than 1.5x off" in suite_time.verdict(run, 5, zen3)[1]
    assert suite_time.verdict({**run, "cores": 16}, 5, zen3)[0]
    assert suite_time.verdict({**run, "load_at_start": 4}, 5, zen3)[0]
    assert not suite_time.verdict({**run, "cpu": "AMD EPYC 7B13"}, 5, zen3)[0]  # the same family, another name
    xeon = {**run, "cpu": "Intel(R) Xeon(R) Processor"}
    assert suite_time.verdict(xeon, 5, zen3)[0] and not suite_time.verdict(xeon, 5, "Intel Xeon")[0]
    assert "not judged" in suite_time.verdict(xeon, 5, zen3)[1]
    assert suite_time.readme_claim("(fast mode; about 14 minutes on 2 CPU cores (AMD EPYC, Zen 3))") == (
        14, "AMD EPYC, Zen 3")
