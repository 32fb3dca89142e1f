"""The README's figure: what the agents score, drawn from docs/RESULTS.md (the one source of the figures).

    python -m tools.readme_figure        # writes assets/results.png

The numbers are read from RESULTS.md's table "What the agents score" and written into the PNG's metadata too, so a
test can tell when the picture no longer shows what RESULTS.md says (tests/test_readme.py).
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "docs" / "RESULTS.md"
FIGURE = ROOT / "assets" / "results.png"

# (label on the figure, the start of its row in RESULTS.md's first table)
ROWS = [
    ("dataset mean", "| the dataset's mean / the scripted expert"),
    ("scripted expert", "| the dataset's mean / the scripted expert"),
    ("TT, no search", "| the same model without search"),
    ("TT, value-token planner", "| the same model, value-token planner"),
    ("TT, critic planner", "| Trajectory Transformer, critic planner"),
    ("Decision Transformer", "| Decision Transformer, target"),
]


def scores(text: str | None = None) -> dict[str, dict]:
    """{label: {"mean": return, "stderr": standard error or None}} from RESULTS.md."""
    text = RESULTS.read_text(encoding="utf-8") if text is None else text
    found = {}
    for label, start in ROWS:
        row = next((line for line in text.splitlines() if line.startswith(start)), None)
        if row is None:
            raise ValueError(f"docs/RESULTS.md has no row starting {start!r}")
        cell = row.split("|")[2]
        if label == "dataset mean" or label == "scripted expert":
            mean, expert = (float(x) for x in re.findall(r"-?\d+\.\d+", cell)[:2])
            found[label] = {"mean": mean if label == "dataset mean" else expert, "stderr": None}
            continue
        match = re.search(r"(-?\d+\.\d+)(?: \+- (\d+\.\d+))?", cell)
        found[label] = {"mean": float(match.group(1)),
                        "stderr": float(match.group(2)) if match.group(2) else None}
    return found


def draw(path: Path = FIGURE) -> dict:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    data = scores()
    labels = list(data)
    means = [data[k]["mean"] for k in labels]
    errors = [data[k]["stderr"] or 0.0 for k in labels]
    colors = ["0.6", "0.3", "tab:gray", "tab:blue", "tab:purple", "tab:green"]
    fig, ax = plt.subplots(figsize=(8, 3.4))
    ax.barh(labels, means, xerr=errors, color=colors, capsize=3)
    for y, (value, error) in enumerate(zip(means, errors, strict=True)):
        ax.text(value + (8 + error if value >= 0 else -8 - error), y, f"{value:.1f}", va="center",
                ha="left" if value >= 0 else "right", fontsize=9)
    ax.axvline(0, color="black", lw=0.8)
    ax.invert_yaxis()
    ax.set(xlabel="return per episode, LunarLanderContinuous-v3 (agents: 60 episodes each, +- standard error; "
                  "the dataset: its 420 episodes)",
           title="Offline RL on a mixed dataset: what the course's agents score")
    ax.set_xlim(min(means) - 60, max(means) + 60)
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
