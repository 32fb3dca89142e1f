"""The README's figure: what the agents score on both course datasets, drawn from docs/RESULTS.md (the one source
of the figures).

    python -m tools.readme_figure        # writes assets/results.png

The numbers are read from RESULTS.md's table "What the agents score" (one column per dataset) and written into the
PNG's metadata too, so a test can tell when the picture no longer shows what RESULTS.md says (tests/test_readme.py).
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "docs" / "RESULTS.md"
FIGURE = ROOT / "assets" / "results.png"

DATASETS = ("with the expert", "without the expert")  # RESULTS.md's columns 2 and 3: mixed-v0, no-expert-v0
# (label on the figure, the start of its row in RESULTS.md's first table, its colour); the first row holds two
# numbers per dataset, the data's mean and its best 10% of episodes
ROWS = [
    ("the data's mean", "| the data's mean / its best 10% of episodes", "0.7"),
    ("the data's best 10% of episodes", "| the data's mean / its best 10% of episodes", "0.45"),
    ("BC, every episode", "| BC, every episode", "tab:gray"),
    ("%BC, best 10%", "| %BC, best 10%", "tab:olive"),
    ("IQL's policy (AWR)", "| IQL's policy", "tab:cyan"),
    ("TT, critic planner", "| Trajectory Transformer, critic planner", "tab:purple"),
    ("TT, imitation mode (seeds 0-19)", "| Trajectory Transformer, imitation", "tab:pink"),
    ("Decision Transformer", "| Decision Transformer", "tab:green"),
]
NUMBER = re.compile(r"(-?\d+\.\d+)(?: \+- (\d+\.\d+))?")


def scores(text: str | None = None) -> dict[str, dict[str, dict]]:
    """{dataset: {label: {"mean": return, "stderr": standard error or None}}} from RESULTS.md; a cell without a
    number ("not measured") leaves its agent out of that dataset's panel."""
    text = RESULTS.read_text(encoding="utf-8") if text is None else text
    found: dict[str, dict[str, dict]] = {name: {} for name in DATASETS}
    for label, start, _ in ROWS:
        row = next((line for line in text.splitlines() if line.startswith(start)), None)
        if row is None:
            raise ValueError(f"docs/RESULTS.md has no row starting {start!r}")
        for dataset, cell in zip(DATASETS, row.split("|")[2:4], strict=True):
            numbers = NUMBER.findall(cell)
            if start == ROWS[0][1]:  # "mean / best 10%"
                which = 0 if label == ROWS[0][0] else 1
                found[dataset][label] = {"mean": float(numbers[which][0]), "stderr": None}
            elif numbers:
                mean, stderr = numbers[0]
                found[dataset][label] = {"mean": float(mean), "stderr": float(stderr) if stderr else None}
    return found


def draw(path: Path = FIGURE) -> dict:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    data = scores()
    colors = {label: color for label, _, color in ROWS}
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.9), sharey=True)
    labels = [label for label, _, _ in ROWS]
    for ax, dataset in zip(axes, DATASETS, strict=True):
        shown = data[dataset]
        y = [labels.index(label) for label in shown]
        means = [shown[label]["mean"] for label in shown]
        errors = [shown[label]["stderr"] or 0.0 for label in shown]
        ax.barh(y, means, xerr=errors, color=[colors[label] for label in shown], capsize=3)
        for row, value, error in zip(y, means, errors, strict=True):
            ax.text(value + (8 + error if value >= 0 else -8 - error), row, f"{value:.1f}", va="center",
                    ha="left" if value >= 0 else "right", fontsize=8)
        ax.axvline(0, color="black", lw=0.8)
        ax.set_xlim(min(means) - 90, max(means) + 80)
        ax.set_title(f"LunarLander, {dataset}", fontsize=10)
        ax.set_xlabel("return per episode (agents: seeds 0-59, +- standard error)", fontsize=8)
    axes[0].set_yticks(range(len(labels)), labels, fontsize=9)
    axes[0].invert_yaxis()
    fig.suptitle("What the course's agents score, beside copying the data (%BC)", fontsize=11)
    fig.tight_layout()
    tmp = path.with_suffix(".tmp.png")
    fig.savefig(tmp, dpi=110, metadata={"Description": json.dumps(data, sort_keys=True)})
    plt.close(fig)
    os.replace(tmp, path)
    return data


def drawn_scores(path: Path = FIGURE) -> dict:
    """The numbers the committed figure was drawn from (its PNG metadata)."""
    from PIL import Image

    with Image.open(path) as image:
        return json.loads(image.text["Description"])


if __name__ == "__main__":
    print(json.dumps(draw(), indent=1))
