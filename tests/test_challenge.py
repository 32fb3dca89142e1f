"""Notebook 10's challenge, graded by return: real nbgrader through `ttlib grade collect` and `autograde`, agents
played by the grader in its sandbox on the course's secret seeds, beside %BC on the same seeds.

The class: "ada" hands in an agent that beats %BC by far (the shipped IQL policy with its weights nudged: a file of
her own that flies as it does), "bob" one that does not (BC on every episode, trained briefly), "cy" the course's
own IQL file as it is, "dee" no agent file, and "eve" an agent of the course dataset. Only ada earns points; each
of the others reads why in the band cells; the leaderboard ranks the two agents that were played.
"""

from __future__ import annotations

import csv
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
from nbgrader.api import Gradebook

from ttlib.agents import baselines, registry
from ttlib.course import challenge
from ttlib.data import trajectories as ttdata
from ttlib.data.minari_io import NO_EXPERT_DATASET
from ttlib.errors import ConfigError
from ttlib.grading import assignments as grade
from ttlib.grading import challenge as grading
from ttlib.grading import sandbox
from ttlib.planning.beam import critic_planner
from ttlib.training.checkpoint_files import read_payload, write_payload
from ttlib.training.checkpoints import default_checkpoint, read_checkpoint

REPO = Path(__file__).resolve().parents[1]
NOTEBOOK = challenge.NOTEBOOK
IQL = "iql_no_expert_lunarlander.safetensors"
POINTS = {band.grade_id: band.points for band in challenge.BANDS}
SECRET = 20261128  # the graded class's hidden episodes: fixed, so that a run is repeatable on a machine


def test_the_challenge_is_on_the_data_without_the_expert_and_its_bar_is_pbc():
    assert challenge.DATASET == NO_EXPERT_DATASET
    payload = read_checkpoint(default_checkpoint(challenge.PBC_CHECKPOINT), kind=None)
    assert payload["dataset"]["id"] == NO_EXPERT_DATASET
    assert (payload["policy_config"]["kind"], payload["policy_config"]["top_percent"]) == ("bc", 10.0)
    notebook = nbformat.read(REPO / "notebooks" / f"{NOTEBOOK}.ipynb", as_version=4)
    cells = {c.metadata["nbgrader"]["grade_id"]: c for c in notebook.cells
             if c.metadata.get("nbgrader", {}).get("grade")}
    assert {grade_id: c.metadata["nbgrader"]["points"] for grade_id, c in cells.items()} == POINTS
    for index, band in enumerate(challenge.BANDS):  # each cell checks its own band, and says what it is worth
        assert f"challenge.check_band({index}, train_agent)" in cells[band.grade_id].source
        assert cells[band.grade_id].source.startswith(f"# Band {index + 1} ({band.points} points)")


def test_bands_are_margins_over_pbc_on_the_same_episodes():
    assert [b.says for b in challenge.bands_reached(48.0, 48.0)] == ["beats %BC"]
    assert challenge.bands_reached(47.9, 48.0) == []
    assert len(challenge.bands_reached(48.0 + 75.0, 48.0)) == 2
    assert len(challenge.bands_reached(48.0 + 149.9, 48.0)) == 2
    assert challenge.bands_reached(300.0, 48.0) == list(challenge.BANDS)


def test_the_secret_seeds_are_the_courses_and_none_is_public(tmp_path):
    secret = grading.course_secret(str(tmp_path))
    assert (tmp_path / grading.SECRET_FILE).read_text().strip() == str(secret)
    assert grading.course_secret(str(tmp_path)) == secret  # made once, then read
    seeds = grading.secret_seeds(secret)
    assert seeds == grading.secret_seeds(secret) and len(set(seeds)) == challenge.HIDDEN_EPISODES
    assert not set(seeds) & set(challenge.PUBLIC_SEEDS) and min(seeds) >= 100_000
    assert grading.secret_seeds(secret + 1) != seeds


def play_json(path: Path, cwd: Path) -> dict:
    """The grader's command, as its sandbox runs it."""
    out = subprocess.run([sys.executable, "-m", "ttlib.course.challenge", "play", str(path), "--seeds", "0,1"],
                         cwd=cwd, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_an_agent_file_that_cannot_be_played_is_named(tmp_path):
    with pytest.raises(challenge.ChallengeError, match="no agent file"):
        challenge.load_agent(str(tmp_path / "missing.safetensors"))
    garbage = tmp_path / "garbage.safetensors"
    garbage.write_bytes(b"import os; os.system('echo pwned')")
    with pytest.raises(challenge.ChallengeError, match="is not a ttlib checkpoint"):
        challenge.load_agent(str(garbage))
    said = play_json(garbage, tmp_path)
    assert "is not a ttlib checkpoint" in said["error"] and "returns" not in said
    with pytest.raises(challenge.ChallengeError, match="learnt from ttlib/lunarlander/mixed-v0: the challenge is on"):
        challenge.load_agent(default_checkpoint("pbc_lunarlander.safetensors"))
    payload = read_payload(default_checkpoint(challenge.PBC_CHECKPOINT))
    payload["model"].pop(sorted(payload["model"])[0])  # a weight missing: the file is the right data's, damaged
    damaged = tmp_path / "damaged.safetensors"
    write_payload(str(damaged), payload)
    with pytest.raises(challenge.ChallengeError, match="damaged.safetensors could not be loaded"):
        challenge.load_agent(str(damaged))
    assert "could not be loaded" in play_json(damaged, tmp_path)["error"]
    resaved = read_payload(default_checkpoint(IQL))
    resaved["history"] = {"note": "my own, honest"}  # other bytes, the same weights: still the course's agent
    write_payload(str(tmp_path / "resaved.safetensors"), resaved)
    assert challenge.shipped_name(str(tmp_path / "resaved.safetensors")) == IQL
    assert challenge.shipped_name(str(garbage)) is None


def test_a_trajectory_transformer_is_handed_in_with_its_planners_settings(tmp_path):
    tiny = tmp_path / "tiny.safetensors"
    done = subprocess.run([sys.executable, "-m", "ttlib", "train", "--dataset", challenge.DATASET, "--out", str(tiny),
                           "--steps", "2", "--n-layer", "1", "--n-embd", "16", "--n-head", "2", "--n-transitions", "2",
                           "--batch-size", "4", "--eval-every", "2", "--eval-batches", "1"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    agent = tmp_path / challenge.FILE
    challenge.save_checkpoint(str(tiny), str(agent), beam_width=3, sample_expand=1, horizon=1, value="token")
    planner = challenge.load_agent(str(agent)).agent.planner
    assert (planner.beam_width, planner.sample_expand, planner.horizon, planner.value) == (3, 1, 1, "token")
    given = registry.load("tt", checkpoint=str(agent), beam_width=5).agent.planner  # as `ttlib evaluate` loads it
    assert (given.beam_width, given.sample_expand, given.value) == (5, 1, "token")  # a setting given wins
    before = agent.read_bytes()
    with pytest.raises(challenge.ChallengeError, match="could not be loaded: no setting beam_wdith"):
        challenge.save_checkpoint(str(tiny), str(agent), beam_wdith=4)
    with pytest.raises(challenge.ChallengeError, match="settings are numbers, words or None: horizon is not"):
        challenge.save_checkpoint(str(tiny), str(agent), horizon=[1, 2])
    assert agent.read_bytes() == before  # a setting that fails never replaces the agent handed in
    with pytest.raises(challenge.ChallengeError, match="a bc policy acts without settings: leave out beam_width"):
        challenge.save_checkpoint(default_checkpoint(challenge.PBC_CHECKPOINT), str(agent), beam_width=3)


def test_the_shipped_tt_without_the_expert_plays_the_weighted_mean_of_its_proposals_unless_told_otherwise():
    """The no-expert checkpoint carries its planner's settings and the critic they were chosen with (docs/RESULTS.md:
    the advantage-weighted mean, beta 2, on a critic of expectile 0.5); the course checkpoint plays the critic
    planner's best proposal, its proposals sampled at temperature 0.5."""
    planner = registry.load("tt", dataset=challenge.DATASET, device="cpu").agent.planner
    assert (planner.value, planner.horizon, planner.action_mean_beta, planner.likelihood_weight) == \
        ("critic", 1, 2.0, 0.0)
    assert read_payload(default_checkpoint(challenge.TT_CHECKPOINT))["critic"]["config"]["expectile"] == 0.5
    off = registry.load("tt", dataset=challenge.DATASET, device="cpu", action_mean_beta=0, horizon=2).agent.planner
    assert (off.action_mean_beta, off.horizon) == (None, 2)  # `--action-mean-beta 0`: the best plan again
    with pytest.raises(ConfigError, match="no setting beta: the settings are PlannerConfig's fields"):
        registry.load("tt", dataset=challenge.DATASET, device="cpu", beta=2)
    assert registry.load("tt", device="cpu").agent.planner == critic_planner(temperature=0.5)
    assert registry.load("tt", device="cpu", temperature=1.0).agent.planner == critic_planner()


# ---- a class graded by nbgrader --------------------------------------------------------------------------------
def nudged(policy_file: str, out: Path) -> Path:
    """A file of the student's own that flies as `policy_file`'s policy: its weights nudged by 1e-5."""
    import torch

    policy, config, payload = baselines.load_policy(default_checkpoint(policy_file))
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for weights in policy.parameters():
            weights.add_(1e-5 * torch.randn(weights.shape, generator=generator))
    data = ttdata.load(challenge.DATASET, progress=False)
    return Path(challenge.save_policy(policy, config, data, payload["history"], str(out)))


def briefly_trained_bc(out: Path, dataset: str = challenge.DATASET, steps: int = 200) -> Path:
    """BC on every episode of `dataset`, trained briefly: it copies the random flights too."""
    data = ttdata.load(dataset, progress=False)
    config = baselines.PolicyConfig(kind="bc", steps=steps)
    policy, history = baselines.train_policy(data, config, progress=False)
    return Path(challenge.save_policy(policy, config, data, history, str(out)))


def command(*args, env) -> str:
    out = subprocess.run([sys.executable, "-m", *args], cwd=REPO, env=env, capture_output=True, text=True,
                         timeout=900)
    assert out.returncode == 0, f"`{' '.join(args)}` failed:\n{out.stdout[-4000:]}\n{out.stderr[-4000:]}"
    return out.stdout


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    if not sandbox.capabilities().landlock_abi:
        pytest.fail(f"this test needs Linux with Landlock: {sandbox.capabilities().missing()}")
    tmp = tmp_path_factory.mktemp("challenge")
    root = tmp / "grading"
    env = {**os.environ, "TTLIB_COURSE_DIR": str(root), "TTLIB_FAST": "1", "OMP_NUM_THREADS": "1"}
    source = root / "source" / NOTEBOOK / f"{NOTEBOOK}.ipynb"
    source.parent.mkdir(parents=True)
    nbformat.write(grade.source_version(nbformat.read(REPO / "notebooks" / f"{NOTEBOOK}.ipynb", as_version=4),
                                        f"{NOTEBOOK}.ipynb"), source)
    command("nbgrader", "generate_assignment", NOTEBOOK, "--force", env=env)
    folder = tmp / "handed_in"
    folder.mkdir()
    student_version = nbformat.read(REPO / "notebooks" / "student" / f"{NOTEBOOK}.ipynb", as_version=4)
    agents = {"ada": nudged(IQL, folder / "ada.challenge.safetensors"),
              "bob": briefly_trained_bc(folder / "bob.challenge.safetensors"),
              "cy": Path(shutil.copyfile(default_checkpoint(IQL), folder / "cy.challenge.safetensors")),
              "eve": briefly_trained_bc(folder / "eve.challenge.safetensors", ttdata.DEFAULT_DATASET, steps=20)}
    for student in ["ada", "bob", "cy", "dee", "eve"]:
        nbformat.write(student_version, folder / f"{student}.ipynb")
    (root / grading.SECRET_FILE).parent.mkdir()  # the course's secret, fixed: the same episodes in every run
    (root / grading.SECRET_FILE).write_text(f"{SECRET}\n")
    command("ttlib", "grade", "collect", NOTEBOOK, str(folder), env=env)
    log = command("ttlib", "grade", "autograde", NOTEBOOK, "--jobs", "2", env=env)
    board = command("ttlib", "grade", "leaderboard", env=env)
    return {"root": root, "log": log, "board": list(csv.DictReader(board.splitlines())), "agents": agents}


def score(graded, student) -> float:
    with Gradebook(f"sqlite:///{graded['root'] / 'gradebook.db'}") as gb:
        return gb.find_submission(NOTEBOOK, student).score


def verdicts(graded, student) -> dict[str, str]:
    nb = nbformat.read(graded["root"] / "autograded" / student / NOTEBOOK / f"{NOTEBOOK}.ipynb", as_version=4)
    return {c.metadata["nbgrader"]["grade_id"]: json.dumps(c.outputs) for c in nb.cells
            if c.metadata.get("nbgrader", {}).get("grade")}


def played(graded, student) -> dict:
    nb = nbformat.read(graded["root"] / "autograded" / student / NOTEBOOK / f"{NOTEBOOK}.ipynb", as_version=4)
    return nb.metadata["ttlib"]["challenge"]


def test_an_agent_that_beats_pbc_earns_its_bands_and_one_that_does_not_earns_none(graded):
    """ada beats %BC by about 190 on average (60 seeds: 243.3 against 48.1): bands 1 and 2 whatever the episodes;
    band 3 (150) follows the margin these 20 episodes gave -- it is the numbers that decide, never the student."""
    ada, said = played(graded, "ada"), verdicts(graded, "ada")
    margin = ada["return"] - ada["pbc"]
    assert margin >= 75, ada
    assert score(graded, "ada") == 4 + 2 * (margin >= 150), (ada, said)
    for band in challenge.BANDS:
        reached = margin >= band.margin
        assert ("reached: your agent's mean return on the 20 hidden episodes was" in said[band.grade_id]) == reached
        assert ("not reached" in said[band.grade_id]) != reached, said
    assert score(graded, "bob") == 0
    said = verdicts(graded, "bob")
    assert all("not reached: your agent's mean return on the 20 hidden episodes was" in said[g] for g in POINTS), said


def test_the_courses_own_agent_a_missing_file_and_other_data_earn_nothing_and_say_why(graded):
    for student, why in [("cy", f"is the course's own {IQL}: hand in an agent you trained"),
                         ("dee", "no challenge.safetensors was handed in beside the notebook"),
                         ("eve", "learnt from ttlib/lunarlander/mixed-v0: the challenge is on")]:
        assert score(graded, student) == 0, student
        said = verdicts(graded, student)
        assert all(why in said[g] for g in POINTS), (student, said)


def test_the_leaderboard_ranks_the_played_agents_on_the_same_secret_episodes(graded):
    rows = graded["board"]
    assert [row["student"] for row in rows] == ["ada", "bob"], rows
    ada, bob = rows
    assert float(ada["margin"]) >= 75 > 0 > float(bob["margin"]) and bob["bands"] == "0"
    assert ada["bands"] == str(len(challenge.bands_reached(float(ada["return"]), float(ada["pbc"]))))
    assert ada["pbc"] == bob["pbc"] and ada["episodes"] == bob["episodes"] == str(challenge.HIDDEN_EPISODES)
    assert [played(graded, s)["pbc"] for s in ("ada", "bob")] == [float(ada["pbc"])] * 2  # the same episodes
    assert (graded["root"] / grading.SECRET_FILE).read_text().strip() == str(SECRET)  # the course's, kept as made
