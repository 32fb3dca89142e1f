"""The challenge's band cells (notebook 10, ttlib.course.challenge): decided by playing the agent file handed in
beside the notebook, in a sandbox, on the course's secret seeds, beside %BC on the same seeds.

What a band's points rest on:
- the agent file is data (safetensors and JSON, read by ttlib's checkpoint loader): the sandboxed process that plays
  it runs ttlib's code only, so no code of the submission's runs, and the returns it reports are the agent's;
- the seeds are the course's secret (`course_secret`: made once, in the instructor's course folder, which no
  submission's sandbox can read; `ttlib grade autograde` hands it to its workers), the same for every student, so
  the returns can be ranked (`ttlib grade leaderboard`);
- the kernel's run decides nothing: every band cell's outputs are replaced by this verdict (hidden_tests
  .apply_verdicts), and the result is kept in the notebook's metadata (`ttlib.challenge`) for the leaderboard;
- an agent file that holds the weights of one of the course's own shipped checkpoints (re-saved or not) earns
  nothing: it was not trained by the student.
"""

from __future__ import annotations

import json
import os
import secrets
import sys

import numpy as np

from ttlib.course.challenge import BANDS, FILE, HIDDEN_EPISODES, MAX_BYTES, Band, bands_reached, shipped_name
from ttlib.files import atomic_path

__all__ = ["SECRET_FILE", "band_cells", "course_secret", "decide", "judge_bands", "leaderboard", "leaderboard_rows",
           "secret_seeds"]

SECRET_FILE = os.path.join(".ttlib", "challenge-seed")  # in the course folder: the seeds' secret


def band_cells(nb) -> dict[str, Band]:
    """{grade_id: its band} for the notebook's graded test cells that award a challenge band."""
    bands = {band.grade_id: band for band in BANDS}
    return {meta["grade_id"]: bands[meta["grade_id"]] for cell in nb.cells
            if (meta := cell.get("metadata", {}).get("nbgrader", {})).get("grade") and meta.get("grade_id") in bands}


def course_secret(root: str) -> int:
    """The course's challenge secret, from <root>/.ttlib/challenge-seed, made (atomically) the first time."""
    path = os.path.join(root, SECRET_FILE)
    try:
        with open(path, encoding="utf-8") as f:
            return int(f.read().strip())
    except (OSError, ValueError):
        secret = secrets.randbelow(2**62)
        with atomic_path(path) as tmp, open(tmp, "w", encoding="utf-8") as f:
            f.write(f"{secret}\n")
        return secret


def secret_seeds(secret: int, n: int = HIDDEN_EPISODES) -> list[int]:
    """n distinct episode seeds from the secret, far from the public ones."""
    rng = np.random.default_rng(secret)
    seeds: list[int] = []
    while len(seeds) < n:
        seed = int(rng.integers(100_000, 2**31 - 1))
        if seed not in seeds:
            seeds.append(seed)
    return seeds


def _fail(bands: dict[str, Band], why: str) -> dict[str, str]:
    return {grade_id: f"Challenge, band \"{band.says}\": no points: {why}" for grade_id, band in bands.items()}


def decide(nb, resources, executor, limits, cpu_seconds: float) -> None:
    """BoundedExecute's step, after the hidden tests: the band cells' verdicts replace the kernel's outputs."""
    from nbgrader.coursedir import CourseDirectory

    from ttlib.grading.hidden_tests import apply_verdicts

    if not band_cells(nb):
        return
    secret = executor.challenge_seed or course_secret(CourseDirectory(config=executor.config).root)
    folder = (resources.get("metadata") or {}).get("path")
    verdicts = judge_bands(nb, folder, secret, limits, executor._box_protected, cpu_seconds)
    apply_verdicts(nb, verdicts)
    _say_reached(nb, verdicts)
    executor.log.info("ttlib: the challenge: %s", nb.metadata.get("ttlib", {}).get("challenge", verdicts))


def _say_reached(nb, verdicts: dict[str, str | None]) -> None:
    """A band reached says so in its cell too (a stream output: never read as a score)."""
    import nbformat

    played, bands = nb.metadata.get("ttlib", {}).get("challenge"), band_cells(nb)
    for cell in nb.cells if played else []:
        grade_id = cell.get("metadata", {}).get("nbgrader", {}).get("grade_id")
        if grade_id in verdicts and verdicts[grade_id] is None:
            cell.outputs.append(nbformat.v4.new_output("stream", name="stdout", text=(
                f"Challenge, band \"{bands[grade_id].says}\": reached: your agent's mean return on the "
                f"{played['episodes']} hidden episodes was {played['return']:.1f}, %BC's {played['pbc']:.1f}\n")))


def judge_bands(nb, folder: str | None, secret: int, limits, protected=(), cpu_seconds: float = 300.0
                ) -> dict[str, str | None]:
    """{band cell grade_id: None (reached) or the message}; the result goes to nb.metadata["ttlib"]["challenge"]."""
    from ttlib.grading import sandbox

    bands = band_cells(nb)
    if not bands:
        return {}
    path = os.path.join(folder or "", FILE)
    if not os.path.isfile(path):
        return _fail(bands, f"no {FILE} was handed in beside the notebook (save your agent with "
                            "challenge.save_policy or challenge.save_checkpoint, and hand in both files)")
    if os.path.getsize(path) > MAX_BYTES:
        return _fail(bands, f"{FILE} is larger than the {MAX_BYTES >> 20} MiB the grader reads")
    with open(path, "rb") as f:
        agent = f.read()
    shipped = shipped_name(path)
    if shipped is not None:
        return _fail(bands, f"{FILE} is the course's own {shipped}: hand in an agent you trained")
    seeds = secret_seeds(secret)
    box_limits = sandbox.Limits(**{**(limits.__dict__ if limits is not None else {}), "cpu_seconds": cpu_seconds,
                                   "wall_seconds": 4 * cpu_seconds})
    argv = [os.environ.get("TTLIB_PYTHON", sys.executable), "-m", "ttlib.course.challenge", "play", FILE, "--seeds",
            ",".join(map(str, seeds))]
    result = sandbox.run(argv, box_limits, protected=protected, files={FILE: agent}, name="challenge", preload=True)
    said = _last_json(result.stdout)
    if said is None:
        why = (f"playing it was stopped ({result.stopped}: {cpu_seconds:g} CPU seconds for {len(seeds)} episodes)"
               if result.stopped else f"playing it failed (status {result.returncode})")
        return _fail(bands, why)
    if "error" in said:
        return _fail(bands, str(said["error"]))
    mine, theirs = float(np.mean(said["returns"])), float(np.mean(said["pbc"]))
    reached = bands_reached(mine, theirs)
    nb.metadata.setdefault("ttlib", {})["challenge"] = {
        "return": round(mine, 2), "pbc": round(theirs, 2), "episodes": len(seeds), "bands": len(reached),
        "cpu": round(result.cpu_seconds, 1)}
    return {grade_id: None if band in reached else
            (f"Challenge, band \"{band.says}\": not reached: your agent's mean return on the {len(seeds)} hidden "
             f"episodes was {mine:.1f}, %BC's {theirs:.1f}; this band asks for {theirs + band.margin:.1f} or more")
            for grade_id, band in bands.items()}


def leaderboard_rows(root) -> list[dict]:
    """One row per graded challenge submission (autograded/<student>/10_beat_pbc/), best mean return first; a
    submission whose agent could not be played has no row."""
    from pathlib import Path

    import nbformat

    from ttlib.course.challenge import NOTEBOOK

    rows = []
    for path in sorted(Path(root, "autograded").glob(f"*/{NOTEBOOK}/{NOTEBOOK}.ipynb")):
        played = nbformat.read(path, as_version=4).metadata.get("ttlib", {}).get("challenge")
        if played:
            rows.append({"student": path.parents[1].name, "return": played["return"], "pbc": played["pbc"],
                         "margin": round(played["return"] - played["pbc"], 2), "bands": played["bands"],
                         "episodes": played["episodes"]})
    return sorted(rows, key=lambda row: (-row["margin"], row["student"]))


def leaderboard(root, out: str | None = None) -> list[dict]:
    """`ttlib grade leaderboard`: the rows as CSV, printed or written atomically to `out`."""
    import csv
    import io

    rows = leaderboard_rows(root)
    text = io.StringIO()
    writer = csv.DictWriter(text, ["rank", "student", "return", "pbc", "margin", "bands", "episodes"],
                            lineterminator="\n")
    writer.writeheader()
    for rank, row in enumerate(rows, 1):
        writer.writerow({"rank": rank, **row})
    if out is None:
        sys.stdout.write(text.getvalue())
    else:
        with atomic_path(out) as tmp, open(tmp, "w", encoding="utf-8") as f:
            f.write(text.getvalue())
        print(f"{len(rows)} agents ranked -> {out}")
    return rows


def _last_json(stdout: bytes) -> dict | None:
    for line in reversed(stdout.decode("utf-8", errors="replace").splitlines()):
        try:
            said = json.loads(line)
        except ValueError:
            continue
        if isinstance(said, dict) and ("error" in said or {"returns", "pbc"} <= said.keys()):
            return said
    return None
