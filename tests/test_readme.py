"""The README opens with what the course achieves; its numbers and its figure are docs/RESULTS.md's."""

import re
from pathlib import Path

from tools import readme_figure

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
