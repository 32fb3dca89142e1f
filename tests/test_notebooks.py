"""The course notebooks keep the course's conventions, and their exercise solutions agree with ttlib.

nbval runs every notebook for real (`pytest --nbval-lax notebooks`). This file reads them without running them:
it checks the conventions every notebook shares (Colab badge, setup cell, time estimate, nbgrader exercises,
cleared outputs), and it executes only the import cells and the exercise solution cells -- which hold nothing but
function definitions -- to compare each solution with its ttlib counterpart on random inputs. It also tests the
helpers the notebooks rely on: `ttlib.course.checks` (the messages learners see) and `ttlib.course.viz`.
"""

from __future__ import annotations

import ast
import copy
import functools
import importlib
import json
import re
from pathlib import Path

import nbformat
import numpy as np
import pytest
import torch
import torch.nn.functional as F

from ttlib.agents import critic
from ttlib.course import challenge, checks, viz
from ttlib.course import notebooks as course
from ttlib.data.trajectories import OfflineDataset, discounted_values
from ttlib.evaluation import rollout
from ttlib.model import gpt as ttlib_model
from ttlib.model.attention import CausalSelfAttention, KVCache, explicit_attention
from ttlib.model.gpt import GPTConfig, TrajectoryGPT, trajectory_mask
from ttlib.model.tokenizer import TrajectoryTokenizer
from ttlib.planning import beam as planning
from ttlib.planning import decoders
from ttlib.training.train import TrainConfig, learning_rate

NOTEBOOK_DIR = Path(__file__).resolve().parents[1] / "notebooks"
NOTEBOOKS = sorted(NOTEBOOK_DIR.glob("[0-9][0-9]_*.ipynb"))
COURSE_NOTEBOOKS = list(course.NOTEBOOKS)
BADGE = re.compile(r"\(https://colab\.research\.google\.com/github/([\w.-]+/[\w.-]+)/blob/main/notebooks/([\w.-]+)\)")
STUDENT_STUB = "raise NotImplementedError()"
# a test cell of ttlib.exercises: the exercise's visible check, and its hidden one between nbgrader's markers
EXERCISE_CELL = re.compile(r"^from ttlib\.exercises\.(?P<module>\w+) import (?P<name>\w+)\n\n"
                           r"(?P=name)\.check\(globals\(\)\)\n### BEGIN HIDDEN TESTS\n"
                           r"(?P=name)\.check_hidden\(globals\(\)\)\n### END HIDDEN TESTS$", re.M)


@functools.cache
def read(name: str):
    return nbformat.read(NOTEBOOK_DIR / name, as_version=4)


def grading(cell) -> dict:
    return cell.metadata.get("nbgrader", {})


def solution_cells(nb):
    return [c for c in nb.cells if c.cell_type == "code" and grading(c).get("solution")]


def graded_cells(nb):
    return [c for c in nb.cells if c.cell_type == "code" and grading(c).get("grade")]


def student_version(source: str) -> str:
    """What nbgrader's generate_assignment leaves of a solution cell: each solution region becomes a stub."""
    pattern = re.compile(r"^([ \t]*)### BEGIN SOLUTION\n.*?^[ \t]*### END SOLUTION[ \t]*$", re.S | re.M)
    return pattern.sub(lambda m: f"{m.group(1)}# YOUR CODE HERE\n{m.group(1)}{STUDENT_STUB}", source)


@functools.cache
def solutions(name: str, student: bool = False) -> dict:
    """The namespace left by a notebook's import-only cells and its solution cells (definitions only)."""
    namespace: dict = {}
    for i, cell in enumerate(read(name).cells):
        if cell.cell_type != "code":
            continue
        body = ast.parse(cell.source).body
        imports_only = all(isinstance(node, (ast.Import, ast.ImportFrom)) for node in body)
        if grading(cell).get("solution"):
            allowed = (ast.Import, ast.ImportFrom, ast.FunctionDef, ast.ClassDef)
            assert all(isinstance(node, allowed) for node in body), f"{name} cell {i}: a solution cell only defines"
            source = student_version(cell.source) if student else cell.source
        elif imports_only:
            source = cell.source
        else:
            continue
        exec(compile(source, f"{name}[cell {i}]", "exec"), namespace)
    return namespace


# ---- conventions -----------------------------------------------------------------------------------------------------
def test_the_course_notebooks_exist():
    assert [p.name for p in NOTEBOOKS][:len(COURSE_NOTEBOOKS)] == COURSE_NOTEBOOKS


@pytest.mark.parametrize("name", [p.name for p in NOTEBOOKS])
def test_header_badge_goals_time_and_points(name):
    nb = read(name)
    first = nb.cells[0]
    assert first.cell_type == "markdown" and first.source.startswith("# "), "first cell: a markdown title"
    badges = BADGE.findall(first.source)
    assert len(badges) == 1 and badges[0][1] == name, f"one Colab badge linking to notebooks/{name}: {badges}"
    assert "colab-badge.svg" in first.source
    goals = first.source.split("Learning goals", 1)[1].split("**Prerequisites", 1)[0]
    assert re.findall(r"^- ", goals, re.M), "learning goals, as a list"
    assert "**Prerequisites.**" in first.source
    assert re.search(r"\*\*Time:\*\* about \d+ min to run on a \d+-core CPU "
                     r"\(\d+ min when other programs keep it busy\)", " ".join(first.source.split())), "a 'Time:' line"
    assert re.search(r"GPU", first.source.split("**Time:**", 1)[1].split("**Exercises", 1)[0]), "say what a GPU changes"
    total = re.search(r"(\d+) points in total", first.source)
    assert total and int(total.group(1)) == sum(grading(c)["points"] for c in graded_cells(nb)), "total points"


def test_every_badge_uses_the_same_repository():
    slugs = {BADGE.findall(read(p.name).cells[0].source)[0][0] for p in NOTEBOOKS}
    assert len(slugs) == 1, slugs


@pytest.mark.parametrize("name", [p.name for p in NOTEBOOKS])
def test_setup_and_device_cells(name):
    cells = read(name).cells
    setup = cells[1]
    assert setup.cell_type == "code" and "setup" in setup.metadata.get("tags", []), "second cell: tagged 'setup'"
    assert '"google.colab" in sys.modules' in setup.source and "pip" in setup.source
    code = [c.source for c in cells if c.cell_type == "code"]
    assert not any(re.search(r"^\s*[!%]", line) for source in code for line in source.splitlines()), "no magics"
    assert any('torch.device("cuda" if torch.cuda.is_available() else "cpu")' in s for s in code[:4])
    assert any('os.environ.get("TTLIB_FAST") == "1"' in s for s in code[:4])
    assert any("ttlib.__version__" in s and "torch.__version__" in s for s in code[:4])


@pytest.mark.parametrize("name", [p.name for p in NOTEBOOKS])
def test_committed_outputs_are_fresh_and_the_header_quotes_their_run(name):
    """Solution notebooks are committed with the outputs of a full-mode run (GitHub and Colab show them): every
    code cell's outputs were made by its current source, and the header's time is that run's."""
    from tools import outputs

    nb = read(name)
    stale = outputs.stale_cells(nb)
    assert not stale, (f"cells {stale} changed since their outputs were made: run `python -m tools.outputs "
                       f"{name[:2]}` and commit the notebook")
    assert all(c.execution_count for c in nb.cells if c.cell_type == "code" and c.source.strip())
    assert not [o for c in nb.cells if c.cell_type == "code" for o in c.outputs if o.output_type == "error"]
    run = nb.metadata["ttlib"]["run"]
    header = " ".join(nb.cells[0].source.split())
    stated = re.search(r"\*\*Time:\*\* about (\d+) min to run on a (\d+)-core CPU", header)
    assert stated, "the header's 'Time: about N min to run on a C-core CPU ...'"
    assert (int(stated.group(1)), int(stated.group(2))) == (outputs.minutes(run["seconds"]), run["cores"])
    busy = re.search(r"\((\d+) min when other programs keep it busy\)", header)
    assert busy and "busy_seconds" in run, "the time beside a busy process per core: `outputs --beside-hog`"
    assert int(busy.group(1)) == outputs.minutes(run["busy_seconds"])


@pytest.mark.parametrize("name", [p.name for p in NOTEBOOKS])
def test_student_versions_speak_to_learners(name):
    """No notes for CI, grading tools or maintainers in what a learner reads."""
    nb = nbformat.read(NOTEBOOK_DIR / "student" / name, as_version=4)
    text = "\n".join(c.source for c in nb.cells if c.cell_type == "markdown")
    for phrase in ["CI", "nbgrader", "ttlib grade", "do not edit", "Generated by", "hidden test"]:
        assert not re.search(rf"\b{re.escape(phrase)}\b", text), f"{name}: a learner reads {phrase!r}"
    assert "YOUR CODE HERE" in text and "YOUR CODE HERE" in json.dumps(nb.cells), "the header says what to fill in"


@pytest.mark.parametrize("name", [p.name for p in NOTEBOOKS])
def test_a_plot_and_a_widget(name):
    code = "\n".join(c.source for c in read(name).cells if c.cell_type == "code")
    assert "plt." in code, "at least one matplotlib plot"
    assert "widgets." in code and ("interactive" in code or "interact(" in code), "at least one ipywidgets widget"


@pytest.mark.parametrize("name", [p.name for p in NOTEBOOKS])
def test_exercises_are_nbgrader_ready(name):
    nb = read(name)
    graded = [c for c in nb.cells if grading(c)]
    ids = [grading(c)["grade_id"] for c in graded]
    assert len(ids) == len(set(ids)), f"duplicate grade_ids: {ids}"
    for cell in graded:
        meta = grading(cell)
        assert meta["schema_version"] == 3 and meta["task"] is False
    tests = graded_cells(nb)
    assert len(tests) >= 2, "at least 2 exercises"
    for cell in solution_cells(nb):
        meta = grading(cell)
        assert meta["grade"] is False and meta["locked"] is False
        assert cell.source.count("### BEGIN SOLUTION") == cell.source.count("### END SOLUTION") >= 1
    bands = {band.grade_id for band in challenge.BANDS}  # notebook 10's: decided by the agent's return, not code
    for cell in tests:
        meta = grading(cell)
        assert meta["solution"] is False and meta["locked"] is True and meta["points"] > 0
        if meta["grade_id"] in bands:
            assert "challenge.check_band(" in cell.source and re.match(r"# Band \d+ \(\d+ points?\)", cell.source)
            continue
        assert "### BEGIN HIDDEN TESTS" in cell.source and "### END HIDDEN TESTS" in cell.source
        exercise = EXERCISE_CELL.search(cell.source)
        assert exercise or "from ttlib.course.checks import" in cell.source, \
            "a visible check: ttlib.exercises or ttlib.course.checks"
        if exercise:  # the short test cell of ttlib.exercises: the exercise it checks is this cell's, points stated
            checked = getattr(importlib.import_module(f"ttlib.exercises.{exercise['module']}"), exercise["name"])
            assert f"{checked.id}-test" == meta["grade_id"], f"{meta['grade_id']} checks {checked.id}"
            stated = re.match(r"# Exercise (\d+[a-z]?) \((\d+) points?\)", cell.source)  # 4a: a graded stage
            assert stated and stated.groups() == (str(checked.number), f"{meta['points']:g}"), cell.source[:100]
    # each exercise: markdown stating its points, then solution cell(s), then its test cell
    order = [("test", grading(c)["points"]) if grading(c).get("grade") else ("solution", None) if grading(c) else
             ("markdown", c.source) if c.cell_type == "markdown" else ("code", None) for c in nb.cells]
    for i, (kind, points) in enumerate(order):
        if kind != "test":
            continue
        j = i - 1
        if grading(nb.cells[i])["grade_id"] in bands:  # a challenge's bands: after its one answer, points stated
            while order[j][0] == "test":
                j -= 1
            assert order[j][0] == "solution", f"the cells before band cell {i}: bands, then the answer"
            continue
        while order[j][0] == "test":  # the graded stages of one exercise (05's 4a-4c) follow its solution cell
            j -= 1
        assert order[j][0] == "solution", f"the cell before test cell {i} is its solution cell"
        if j != i - 1:
            stage = EXERCISE_CELL.search(nb.cells[i].source)
            checked = getattr(importlib.import_module(f"ttlib.exercises.{stage['module']}"), stage["name"])
            solution = grading(nb.cells[j])["grade_id"]
            assert solution in (checked.cell, checked.id), f"test cell {i} checks {checked.id}, not {solution}"
        while order[j][0] != "markdown":
            j -= 1
        plural = "point" if points == 1 else "points"
        assert f"({points} {plural})" in order[j][1], f"the exercise before cell {i} states '({points} {plural})'"


@pytest.mark.parametrize("name", COURSE_NOTEBOOKS)
def test_student_version_raises_not_implemented(name):
    """With the solutions stripped as nbgrader does, every exercise function raises NotImplementedError, and the
    checks turn that into 'not implemented yet'."""
    student = solutions(name, student=True)
    names = {n.name for c in solution_cells(read(name)) for n in ast.parse(c.source).body
             if isinstance(n, ast.FunctionDef)}
    assert names
    for fn_name in names:
        fn = student[fn_name]
        n_args = fn.__code__.co_argcount - len(fn.__defaults__ or ())
        args = STUB_INPUTS[fn_name]() if fn_name in STUB_INPUTS else [None] * n_args
        with pytest.raises(AssertionError, match=f"{fn_name} is not implemented yet"):
            checks.call(fn, *args)


def tiny_search_inputs():
    """Inputs for a search loop whose given set-up runs before the first stub: model, tokenizer, prefix, keys,
    config."""
    model = TrajectoryGPT(GPTConfig(obs_dim=1, act_dim=1, n_bins=4, n_layer=1, n_head=1, n_embd=4, n_transitions=2))
    tokenizer = TrajectoryTokenizer.fit(np.random.default_rng(0).normal(size=(20, 4)), 1, 1, 4)
    return model, tokenizer, torch.zeros(1, 1, dtype=torch.long), torch.tensor([1]), planning.PlannerConfig(horizon=2)


STUB_INPUTS = {"beam_search": tiny_search_inputs}  # exercises whose stub needs real inputs to reach its stub


def agree(fn, reference, make_inputs, trials: int, atol: float = 1e-5, rtol: float = 0.0, exact: bool = False,
          seed: int = 0, name: str = "the solution's result") -> None:
    """`fn` gives `reference`'s results on `trials` random inputs: make_inputs(rng) returns the arguments (torch is
    seeded too); each function gets its own copy, so one that writes into them cannot spoil the other's."""
    for trial in range(trials):
        rng = np.random.default_rng(seed + trial)
        torch.manual_seed(seed + trial)
        args = make_inputs(rng)
        expected, got = reference(*copy.deepcopy(args)), fn(*copy.deepcopy(args))
        try:
            if exact:
                checks.check_equal_arrays(got, expected, name)
            else:
                checks.check_close(got, expected, name, atol=atol, rtol=rtol)
        except AssertionError as error:
            raise AssertionError(f"trial {trial + 1} of {trials}: {error}") from None


# ---- 00: values, returns, scores -------------------------------------------------------------------------------------
def random_rewards(rng):
    return rng.normal(size=int(rng.integers(1, 80))) * rng.choice([0.1, 1.0, 100.0]), float(rng.uniform(0.3, 1.0))


def test_00_discounted_values_agree_with_ttlib():
    ns = solutions(COURSE_NOTEBOOKS[0])
    agree(ns["discounted_values"], discounted_values, random_rewards, trials=20, atol=1e-3, rtol=1e-5)


def fake_dataset(rng) -> OfflineDataset:
    rewards = [rng.normal(size=int(rng.integers(1, 50))).astype(np.float32) for _ in range(int(rng.integers(1, 9)))]
    arrays = [np.zeros((len(r), 1), np.float32) for r in rewards]
    flags = [np.zeros(len(r), bool) for r in rewards]
    return OfflineDataset("x/y-v0", None, {}, 0.99, arrays, arrays, rewards, flags, flags,
                          [discounted_values(r, 0.99) for r in rewards], None, float(rng.normal()), 5.0)


def test_00_returns_and_scores_agree_with_ttlib():
    ns = solutions(COURSE_NOTEBOOKS[0])
    for seed in range(10):
        d = fake_dataset(np.random.default_rng(seed))
        checks.check_close(ns["episode_returns"](d.rewards), d.returns(), "returns", atol=1e-5)
        returns = np.random.default_rng(seed).normal(size=7) * 100
        checks.check_close(ns["normalized_score"](returns, d.ref_min_score, d.ref_max_score),
                           d.normalized_score(returns), "normalized scores", atol=1e-9)


# ---- 01: attention, masks, heads -------------------------------------------------------------------------------------
def random_attention(rng):
    B, H, T, D = (int(x) for x in rng.integers(1, 6, size=4))
    S = T + int(rng.integers(0, 5))
    mask = torch.rand(T, S) < 0.5
    mask[:, 0] = True
    return torch.randn(B, H, T, D), torch.randn(B, H, S, D), torch.randn(B, H, S, D), mask


def test_01_attention_agrees_with_torch_and_ttlib():
    sdpa = solutions(COURSE_NOTEBOOKS[1])["scaled_dot_product_attention"]
    agree(sdpa, lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, attn_mask=m),
          random_attention, trials=20, atol=1e-5)
    agree(sdpa, explicit_attention, random_attention, trials=10, atol=1e-5, seed=99)


def test_01_mask_agrees_with_the_model():
    mask = solutions(COURSE_NOTEBOOKS[1])["trajectory_mask"]
    rng = np.random.default_rng(0)
    for _ in range(10):
        obs, act, n = (int(x) for x in rng.integers(1, 6, size=3))
        config = GPTConfig(obs_dim=obs, act_dim=act, n_transitions=n, n_layer=1, n_head=1, n_embd=4)
        checks.check_equal_arrays(mask(config.block_size, config.transition_dim), TrajectoryGPT(config).allowed,
                                  f"mask obs={obs} act={act} n={n}")


def test_01_multi_head_attention_agrees_with_causal_self_attention():
    mha = solutions(COURSE_NOTEBOOKS[1])["multi_head_attention"]
    mask = solutions(COURSE_NOTEBOOKS[1])["trajectory_mask"]

    def inputs(rng):
        H = int(rng.integers(1, 5))
        C, T = H * int(rng.integers(1, 9)), int(rng.integers(1, 40))
        return torch.randn(int(rng.integers(1, 4)), T, C), CausalSelfAttention(C, H).eval(), mask(T, 4)

    with torch.no_grad():
        agree(lambda x, layer, m: mha(x, layer.qkv, layer.proj, layer.n_head, m),
              lambda x, layer, m: layer(x, m), inputs, trials=15, atol=1e-5)


# ---- 04: the KV cache ------------------------------------------------------------------------------------------------
def random_cache(rng, n_layer, batch, n_head, head_dim, capacity):
    cache = KVCache(n_layer, batch, n_head, head_dim, capacity)
    cache.k.normal_(), cache.v.normal_()  # noise in every slot: a write to the wrong slot shows
    cache.length = int(rng.integers(0, capacity))
    return cache


def test_04_write_kv_agrees_with_kv_cache_write():
    write_kv = solutions(COURSE_NOTEBOOKS[4])["write_kv"]

    def inputs(rng):
        n_layer, B, H, D = (int(x) for x in rng.integers(1, 4, size=4))
        cache = random_cache(rng, n_layer, B, H, D, int(rng.integers(2, 30)))
        T = int(rng.integers(1, cache.capacity - cache.length + 1))
        return cache, int(rng.integers(0, n_layer)), torch.randn(B, H, T, D), torch.randn(B, H, T, D)

    def run(write):
        def call(cache, layer, k, v):
            return (*write(cache, layer, k, v), cache.k, cache.v, cache.length)
        return call

    agree(run(write_kv), run(lambda cache, *args: cache.write(*args)), inputs, trials=20, exact=True)


def test_04_cached_attention_and_forward_agree_with_ttlib():
    ns = solutions(COURSE_NOTEBOOKS[4])
    given = next(c.source for c in read(COURSE_NOTEBOOKS[4]).cells if c.source.startswith("def heads("))
    exec(given, ns)  # the per-position heads the notebook gives, which cached_forward calls

    def inputs(rng):
        H = int(rng.integers(1, 3))
        config = GPTConfig(obs_dim=int(rng.integers(1, 4)), act_dim=int(rng.integers(1, 3)), n_bins=7,
                           n_layer=int(rng.integers(1, 4)), n_head=H, n_embd=4 * H, n_transitions=3, dropout=0.0)
        model = TrajectoryGPT(config).eval()
        for p in model.parameters():
            torch.nn.init.normal_(p, std=0.5)
        B, start = int(rng.integers(1, 4)), int(rng.integers(0, config.block_size))
        cache = model.new_cache(B)
        with torch.no_grad():
            model(torch.as_tensor(rng.integers(0, 7, size=(B, start))), cache=cache)
        for buffer in (cache.k, cache.v):  # noise in the empty slots, not whatever memory held: the whole buffers
            buffer[:, :, :, start:] = torch.randn_like(buffer[:, :, :, start:])  # are compared, a stray write shows
        T = int(rng.integers(1, config.block_size - start + 1))
        return model, torch.as_tensor(rng.integers(0, 7, size=(B, T))), cache

    def yours(model, bins, cache):
        with torch.no_grad():
            return ns["cached_forward"](model, bins, cache), cache.k, cache.v, cache.length

    def reference(model, bins, cache):
        with torch.no_grad():
            return model(bins, cache=cache)[0], cache.k, cache.v, cache.length

    agree(yours, reference, inputs, trials=20, atol=1e-4)


def test_04_reorder_and_bytes_agree_with_kv_cache():
    ns = solutions(COURSE_NOTEBOOKS[4])
    rng = np.random.default_rng(0)
    for _ in range(15):
        n_layer, batch, n_head, head_dim, capacity = (int(x) for x in rng.integers(1, 6, size=5))
        cache = random_cache(rng, n_layer, batch, n_head, head_dim, capacity)
        indices = torch.as_tensor(rng.integers(0, batch, size=int(rng.integers(1, 2 * batch + 1))))
        assert ns["kv_cache_bytes"](n_layer, batch, n_head, head_dim, capacity) == cache.k.nbytes + cache.v.nbytes
        L = cache.length
        yours = KVCache(n_layer, batch, n_head, head_dim, capacity)
        yours.k, yours.v, yours.length = cache.k.clone(), cache.v.clone(), L
        ns["reorder"](yours, indices)
        cache.reorder(indices)
        checks.check_equal_arrays((yours.k[:, :, :, :L], yours.v[:, :, :, :L], yours.length),
                                  (cache.k[:, :, :, :L], cache.v[:, :, :, :L], cache.length), "reordered cache")


# ---- 02: the tokenizer -----------------------------------------------------------------------------------------------
def random_rows(rng):
    n_obs, n_act = int(rng.integers(1, 5)), int(rng.integers(1, 3))
    x = rng.standard_t(df=2, size=(int(rng.integers(3, 400)), n_obs + n_act + 2)) * rng.uniform(0.01, 100)
    if rng.random() < 0.3:
        x[:, 0] = 1.5  # a constant column
    if rng.random() < 0.3:
        x[:, -1] = rng.integers(0, 2, size=len(x))  # a binary column, like LunarLander's leg contacts
    return x, n_obs, n_act, int(rng.integers(2, 150))


def test_03_edges_agree_with_the_tokenizer():
    ns = solutions(COURSE_NOTEBOOKS[2])
    for strategy in ["uniform", "quantile"]:
        agree(lambda x, o, a, k, s=strategy: ns[f"{s}_edges"](x, k),
              lambda x, o, a, k, s=strategy: TrajectoryTokenizer.fit(x, o, a, k, s).edges,
              random_rows, trials=20, atol=1e-9, rtol=1e-12, name=f"{strategy}_edges")


def test_03_encode_and_decode_agree_with_the_tokenizer():
    ns = solutions(COURSE_NOTEBOOKS[2])
    for seed in range(20):
        rng = np.random.default_rng(seed)
        x, n_obs, n_act, k = random_rows(rng)
        tokenizer = TrajectoryTokenizer.fit(x, n_obs, n_act, k, ["uniform", "quantile"][seed % 2])
        queries = np.concatenate([x, rng.standard_t(df=2, size=(50, x.shape[1])) * x.std()])  # some out of range
        bins = ns["encode"](queries, tokenizer.edges)
        checks.check_equal_arrays(bins, tokenizer.encode(queries, on_clip="ignore"), "bins")
        means = ns["bin_means"](x, tokenizer.edges)  # what each bin of the fitted data holds
        checks.check_close(means, tokenizer.means, "means", atol=1e-12)
        checks.check_close(ns["decode"](bins, means), tokenizer.decode(bins), "decoded", atol=1e-12)


# ---- 03: the Trajectory GPT ------------------------------------------------------------------------------------------
def random_gpt(rng, **overrides) -> TrajectoryGPT:
    config = dict(obs_dim=int(rng.integers(1, 6)), act_dim=int(rng.integers(1, 4)), n_bins=int(rng.integers(2, 40)),
                  n_layer=1, n_head=2, n_embd=8, n_transitions=int(rng.integers(1, 4)), dropout=0.0)
    model = TrajectoryGPT(GPTConfig(**{**config, **overrides})).eval()
    torch.nn.init.normal_(model.head_bias)  # non-zero, so that a bias mistake shows
    return model


def test_03_token_ids_agree_with_the_models_offsets():
    token_ids = solutions(COURSE_NOTEBOOKS[3])["token_ids"]
    rng = np.random.default_rng(0)
    for _ in range(20):
        model = random_gpt(rng)
        c = model.config
        start = int(rng.integers(0, c.block_size))
        bins = torch.as_tensor(rng.integers(0, c.n_bins, size=(3, int(rng.integers(1, c.block_size - start + 1)))))
        expected = bins + model.token_offset[start:start + bins.shape[1]]
        checks.check_equal_arrays(token_ids(bins, start, c.transition_dim, c.n_bins), expected, "token ids")


def test_03_heads_agree_with_the_models_logits():
    heads = solutions(COURSE_NOTEBOOKS[3])["heads"]
    rng = np.random.default_rng(1)
    for _ in range(20):
        model = random_gpt(rng)
        c = model.config
        start = int(rng.integers(0, c.block_size))
        bins = torch.as_tensor(rng.integers(0, c.n_bins, size=(2, int(rng.integers(1, c.block_size - start + 1)))))
        seen = []
        hook = model.ln_f.register_forward_hook(lambda module, inputs, output, seen=seen: seen.append(output))
        with torch.no_grad():
            cache = model.new_cache(2)
            if start:
                model(torch.as_tensor(rng.integers(0, c.n_bins, size=(2, start))), cache=cache)
            logits, _ = model(bins, cache=cache)
            got = heads(seen[-1], model.head_weight, model.head_bias, start)
        hook.remove()
        checks.check_close(got, logits, f"heads (start {start})", atol=1e-5)


def test_03_weighted_cross_entropy_agrees_with_the_models_loss():
    loss_fn = solutions(COURSE_NOTEBOOKS[3])["weighted_cross_entropy"]
    rng = np.random.default_rng(2)
    for _ in range(20):
        model = random_gpt(rng, action_weight=float(rng.uniform(1, 6)), reward_weight=float(rng.uniform(0.5, 2)))
        c = model.config
        B, T = int(rng.integers(1, 5)), int(rng.integers(1, c.block_size + 1))
        bins, targets = (torch.as_tensor(rng.integers(0, c.n_bins, size=(B, T))) for _ in range(2))
        mask = torch.as_tensor(rng.random((B, T)) < 0.7, dtype=torch.float32)
        with torch.no_grad():
            logits, loss = model(bins, targets, mask)
            checks.check_close(loss_fn(logits, targets, mask, model.dim_weight), loss, "loss", atol=1e-5)


def randomized(module: torch.nn.Module) -> torch.nn.Module:
    """Every LayerNorm scale and every bias random too, so that a block that skips or swaps one shows."""
    with torch.no_grad():
        for name, p in module.named_parameters():
            if "ln" in name:
                p.copy_(torch.randn_like(p) * 0.5 + (1.0 if name.endswith("weight") else 0.0))
            elif name.endswith("bias"):
                p.copy_(torch.randn_like(p) * 0.1)
    return module


def test_03_block_agrees_with_ttlibs_block():
    ns = solutions(COURSE_NOTEBOOKS[3])
    rng = np.random.default_rng(4)
    for _ in range(10):
        H, td = int(rng.integers(1, 4)), int(rng.integers(4, 8))
        C, T = H * int(rng.integers(2, 9)), int(rng.integers(1, 3 * td))
        config = GPTConfig(obs_dim=td - 3, act_dim=1, n_embd=C, n_head=H, dropout=0.0)
        block = randomized(ttlib_model.Block(config)).eval()
        mine = ns["Block"](C, H).eval()
        mine.load_state_dict(block.state_dict())
        x, allowed = torch.randn(2, T, C), ttlib_model.trajectory_mask(T, td)
        with torch.no_grad():
            checks.check_close(mine(x, allowed), block(x, allowed), "Block", atol=1e-5)


def test_03_gpt_agrees_with_trajectory_gpt():
    ns = solutions(COURSE_NOTEBOOKS[3])
    rng = np.random.default_rng(5)
    for _ in range(10):
        model = randomized(random_gpt(rng, n_layer=int(rng.integers(1, 3))))
        mine = ns["GPT"](model.config).eval()
        mine.load_state_dict(model.state_dict())
        c = model.config
        bins = torch.as_tensor(rng.integers(0, c.n_bins, size=(3, int(rng.integers(1, c.block_size + 1)))))
        with torch.no_grad():
            checks.check_close(mine(bins), model(bins)[0], "GPT logits", atol=1e-5)


def test_03_exercise_references_are_the_models():
    """The references notebook 03's exercises compare with (ttlib.exercises.gpt and gpt_training) compute what
    TrajectoryGPT does: its token ids, its per-position heads and its loss, on random models."""
    from ttlib.exercises import gpt, gpt_training
    from ttlib.exercises.module_answers import load_weights

    rng = np.random.default_rng(6)
    for _ in range(10):
        model = randomized(random_gpt(rng, n_layer=2, action_weight=float(rng.uniform(1, 6))))
        c = model.config
        T = int(rng.integers(1, c.block_size + 1))
        bins, targets = (torch.as_tensor(rng.integers(0, c.n_bins, size=(2, T))) for _ in range(2))
        mask = torch.as_tensor(rng.random((2, T)) < 0.7, dtype=torch.float32)
        checks.check_equal_arrays(gpt.lent_token_ids(bins, 0, c.transition_dim, c.n_bins),
                                  gpt.ttlib_token_ids(bins, 0, c.transition_dim, c.n_bins), "token ids")
        seen = []
        hook = model.ln_f.register_forward_hook(lambda module, inputs, output, seen=seen: seen.append(output))
        with torch.no_grad():
            logits, loss = model(bins, targets, mask)
        hook.remove()
        checks.check_close(gpt.ttlib_heads(seen[0], model.head_weight, model.head_bias, 0), logits, "heads",
                           atol=1e-5)
        loss_of = gpt_training.ttlib_weighted_cross_entropy
        checks.check_close(loss_of(logits, targets, mask, model.dim_weight), loss, "loss", atol=1e-5)
        mine = load_weights(gpt.GivenGPT(c), model.state_dict(), "TrajectoryGPT")
        assert set(mine.state_dict()) == set(model.state_dict())


def test_03_weights_that_do_not_fit_are_named():
    """A class whose names or sizes differ from ttlib's gets a message naming them, not load_state_dict's error."""
    from ttlib.exercises.gpt import TTLibBlock
    from ttlib.exercises.module_answers import load_weights

    state = TTLibBlock(8, 2).state_dict()
    renamed = TTLibBlock(8, 2)
    renamed.ffn = renamed.mlp
    del renamed.mlp
    with pytest.raises(AssertionError, match=r"missing in yours: mlp\.up\.weight, .*; unexpected in yours: ffn\.up"):
        load_weights(renamed, state, "Block")
    with pytest.raises(AssertionError, match=r"ln_1\.weight has shape \(4,\) in yours but \(8,\) in ttlib's"):
        load_weights(TTLibBlock(4, 2), state, "Block")


def test_03_learning_rate_agrees_with_ttlib():
    lr_fn = solutions(COURSE_NOTEBOOKS[3])["learning_rate"]
    rng = np.random.default_rng(3)
    for _ in range(200):
        total = int(rng.integers(1, 3000))
        warmup, lr = int(rng.integers(1, total + 1)), float(rng.uniform(1e-5, 1e-2))
        config = TrainConfig(steps=total, warmup_steps=warmup, lr=lr, min_lr=lr * float(rng.uniform(0, 1)))
        step = int(rng.integers(0, total + 100))
        assert abs(lr_fn(step, warmup, total, lr, config.min_lr) - learning_rate(step, config)) <= 1e-12 * lr


# ---- 05: beam search -------------------------------------------------------------------------------------------------
def test_05_sample_bins_agrees_with_ttlib():
    sample = solutions(COURSE_NOTEBOOKS[5])["sample_bins"]

    def inputs(rng):
        B, K = int(rng.integers(1, 30)), int(rng.integers(1, 150))
        logits = torch.randn(B, K) * float(rng.uniform(0.05, 8))
        if rng.random() < 0.3:
            logits = logits.round()  # ties at the k-th largest logit
        top_k = None if rng.random() < 0.3 else int(rng.integers(1, K + 3))
        uniform = planning.counter_uniform(torch.tensor([int(rng.integers(0, 2**40))]), int(rng.integers(0, 99)),
                                           torch.arange(B))
        return logits, uniform, top_k, float(rng.uniform(0.2, 3.0))

    agree(sample, planning.sample_bins, inputs, trials=60, exact=True)


def test_05_plan_score_agrees_with_beam_plan():
    score = solutions(COURSE_NOTEBOOKS[5])["plan_score"]
    rng = np.random.default_rng(5)
    for _ in range(15):
        model = random_gpt(rng, n_transitions=int(rng.integers(2, 5)))
        c = model.config
        tokenizer = TrajectoryTokenizer.fit(rng.normal(size=(300, c.transition_dim)) * 5, c.obs_dim, c.act_dim,
                                            c.n_bins)
        context = int(rng.integers(1, c.n_transitions))
        config = planning.PlannerConfig(beam_width=int(rng.integers(1, 6)), sample_expand=int(rng.integers(1, 4)),
                                        horizon=int(rng.integers(1, c.n_transitions - context + 2)), context=context,
                                        gamma=float(rng.uniform(0.5, 1.0)))
        E = int(rng.integers(1, 4))
        prefix = torch.as_tensor(rng.integers(0, c.n_bins, size=(E, (context - 1) * c.transition_dim + c.obs_dim)))
        plan = planning.beam_plan(model, tokenizer, prefix, torch.as_tensor(rng.integers(0, 2**40, size=E)), config)
        checks.check_close(score(plan.rewards, plan.values[:, -1], config.gamma), plan.score, "plan score",
                           atol=1e-4, rtol=1e-5)


def test_05_best_children_agrees_with_ttlib():
    best = solutions(COURSE_NOTEBOOKS[5])["best_children"]

    def inputs(rng):
        E, W, X = int(rng.integers(1, 8)), int(rng.integers(1, 12)), int(rng.integers(1, 5))
        score = torch.randn(E * W * X)
        return (score.round() if rng.random() < 0.5 else score), E, W

    agree(best, planning.best_children, inputs, trials=60, exact=True)


def test_06_expectile_loss_agrees_with_ttlib_and_is_minimised_at_the_expectile():
    loss = solutions(COURSE_NOTEBOOKS[6])["expectile_loss"]

    def inputs(rng):
        diff = torch.as_tensor(rng.normal(size=int(rng.integers(1, 300))) * float(rng.uniform(0.01, 1000)))
        return (diff.float() if rng.random() < 0.5 else diff), float(rng.uniform(0.001, 0.999))

    agree(loss, critic.expectile_loss, inputs, trials=60, atol=1e-6, rtol=1e-5)
    # the constant that minimises it over samples x is their tau-expectile: the root of the asymmetric mean error
    x = torch.as_tensor(np.random.default_rng(3).standard_t(3, size=500))
    for tau in (0.1, 0.5, 0.9):
        low, high = float(x.min()), float(x.max())
        for _ in range(100):  # bisection on sum(w (x - c)), which falls as c rises
            mid = (low + high) / 2
            w = torch.where(x < mid, 1 - tau, tau)
            low, high = (mid, high) if float((w * (x - mid)).sum()) > 0 else (low, mid)
        grid = torch.linspace(mid - 0.05, mid + 0.05, 201, dtype=torch.float64)
        best = grid[int(torch.stack([loss(x - c, tau) for c in grid]).argmin())]
        assert abs(float(best) - mid) <= 0.0005 + 1e-9, (tau, float(best), mid)


def test_06_td_target_and_iql_losses_train_ttlibs_member():
    """The notebook's TD target is ttlib's, and its two losses train ttlib's critic member in float64."""
    from tqdm.auto import tqdm

    from ttlib.data import trajectories as ttdata

    ns = solutions(COURSE_NOTEBOOKS[6])
    batch = {key: value[::20].double() for key, value in critic.transitions(ttdata.load(progress=False)).items()}
    config = critic.CriticConfig(steps=30, hidden=32, batch_size=128)
    torch.manual_seed(0)
    member = critic.CriticMember(batch["obs"].shape[1], batch["act"].shape[1], 32).double()
    checks.check_close(ns["td_target"](member, batch, 0.9), critic.td_target(member, batch, 0.9), "TD target",
                       atol=1e-12)
    yours, ttlibs = (critic.train_member(batch, config, 0, "cpu", [], tqdm(disable=True), losses=losses)
                     for losses in [(ns["value_loss"], ns["q_loss"]), None])
    for key, value in ttlibs.state_dict().items():
        checks.check_close(yours.state_dict()[key], value, key, atol=1e-9)


def test_05_beam_search_makes_beam_plans_plan():
    """The notebook's search loop (with its own sampler, score and selection) makes beam_plan's plan in float64,
    on either decoder, for random models and settings."""
    namespace = solutions(COURSE_NOTEBOOKS[5])
    search = namespace["beam_search"]
    rng = np.random.default_rng(15)
    for trial in range(12):
        model = random_gpt(rng, n_transitions=int(rng.integers(2, 5))).double()
        c = model.config
        tokenizer = TrajectoryTokenizer.fit(rng.normal(size=(300, c.transition_dim)) * 5, c.obs_dim, c.act_dim,
                                            c.n_bins)
        context = int(rng.integers(1, c.n_transitions))
        config = planning.PlannerConfig(beam_width=int(rng.integers(1, 6)), sample_expand=int(rng.integers(1, 4)),
                                        horizon=int(rng.integers(1, c.n_transitions - context + 2)), context=context,
                                        top_k_action=None if trial % 2 else int(rng.integers(1, c.n_bins + 1)),
                                        gamma=float(rng.uniform(0.5, 1.0)), value_weight=float(rng.uniform(0, 2)))
        E = int(rng.integers(1, 4))
        prefix = torch.as_tensor(rng.integers(0, c.n_bins, size=(E, (context - 1) * c.transition_dim + c.obs_dim)))
        keys = torch.as_tensor(rng.integers(0, 2**40, size=E))
        expected_trace, trace = [], []
        expected = planning.beam_plan(model, tokenizer, prefix, keys, config, trace=expected_trace)
        decoder = decoders.RecomputeDecoder if trial % 3 == 0 else decoders.CachedDecoder
        got = search(model, tokenizer, prefix, keys, config, decoder, trace)
        assert torch.equal(got.bins, expected.bins)
        for name in ("score", "rewards", "values", "actions", "observations"):
            torch.testing.assert_close(getattr(got, name), getattr(expected, name), atol=1e-6, rtol=0)
        for (score, keep), (expected_score, expected_keep) in zip(trace, expected_trace, strict=True):
            torch.testing.assert_close(score, expected_score, atol=1e-9, rtol=0)
            # the kept scores: children with identical tokens tie, and rounding may keep either of them
            torch.testing.assert_close(score[keep], expected_score[expected_keep], atol=1e-9, rtol=0)


# ---- 07: vectorized rollouts -----------------------------------------------------------------------------------------
def test_07_encode_transition_agrees_with_contexts():
    encode = solutions(COURSE_NOTEBOOKS[7])["encode_transition"]
    rng = np.random.default_rng(60)
    for _ in range(20):
        obs_dim, act_dim = int(rng.integers(1, 5)), int(rng.integers(1, 3))
        tokenizer = TrajectoryTokenizer.fit(rng.normal(size=(200, obs_dim + act_dim + 2)), obs_dim, act_dim,
                                            int(rng.integers(2, 30)))
        obs, action, reward = rng.normal(size=obs_dim) * 2, rng.normal(size=act_dim), float(rng.normal() * 2)
        contexts = rollout.Contexts(tokenizer, 1, 1)
        contexts.append(0, obs, action, reward)
        checks.check_equal_arrays(encode(tokenizer, obs, action, reward), contexts.history[0][0], "transition")


def test_07_vector_rollout_plays_evaluates_episodes():
    """The solution's loop, on 3 environments for 7 seeds (autoresets, episodes of different lengths), returns
    exactly what rollout.evaluate returns in float64."""
    from ttlib.data import trajectories as ttdata

    ns = solutions(COURSE_NOTEBOOKS[7])
    data = ttdata.load(progress=False)
    tokenizer = TrajectoryTokenizer.fit_dataset(data, n_bins=20)
    torch.manual_seed(0)
    model = TrajectoryGPT(GPTConfig(obs_dim=8, act_dim=2, n_bins=20, n_layer=1, n_head=2, n_embd=32,
                                    n_transitions=4, dropout=0.0)).double().eval()
    planner = planning.PlannerConfig(beam_width=3, horizon=2, sample_expand=2, context=2)
    seeds, env_id = list(range(7)), "LunarLanderContinuous-v3"
    expected = rollout.evaluate(model, tokenizer, env_id, seeds, planner, max_steps=80, progress=False)
    schedule = [seeds[e::3] for e in range(3)]
    envs = rollout.scheduled_vector_env(env_id, schedule, max_steps=80)
    try:
        returns, lengths = ns["vector_rollout"](model, tokenizer, envs, schedule, planner)
    finally:
        envs.close()
    np.testing.assert_array_equal([lengths[s] for s in seeds], expected.lengths)
    np.testing.assert_array_equal([returns[s] for s in seeds], expected.returns)


def test_07_the_exercise_loop_plays_evaluates_episodes():
    """The loop the exercise checks learners against (ttlib.exercises.rollouts) plays rollout.evaluate's episodes,
    in float64, on 3 environments for 7 seeds with autoresets."""
    from ttlib.exercises import Pieces
    from ttlib.exercises.rollouts import ROLLOUT_PLANNER, course, rollout_loop, tiny_model, trial_envs

    tok, env_id, env_kwargs = course()
    torch.manual_seed(0)
    model, seeds = tiny_model(tok), list(range(7))
    expected = rollout.evaluate(model, tok, env_id, seeds, ROLLOUT_PLANNER, env_kwargs=env_kwargs, max_steps=12,
                                progress=False)
    schedule = [seeds[e::3] for e in range(3)]
    envs = trial_envs(schedule, [12] * 3)
    try:
        returns, lengths = rollout_loop.reference["vector_rollout"](model, tok, envs, schedule, ROLLOUT_PLANNER)
    finally:
        envs.close()
    np.testing.assert_array_equal([lengths[s] for s in seeds], expected.lengths)
    np.testing.assert_array_equal([returns[s] for s in seeds], expected.returns)
    outputs = rollout_loop.outcome(Pieces(rollout_loop.reference, "ttlib"), (model, schedule, [12] * 3)).outputs
    assert str(outputs["step 13: the episodes planned for"]) == "none"  # every environment autoresets
    assert str(outputs["step 14: the episodes planned for"]) == "seed 3 at its step 0, seed 4 at its step 0, " \
                                                                 "seed 5 at its step 0"


def test_07_build_prefix_agrees_with_contexts():
    build = solutions(COURSE_NOTEBOOKS[7])["build_prefix"]
    rng = np.random.default_rng(6)
    for _ in range(30):
        obs_dim, act_dim = int(rng.integers(1, 5)), int(rng.integers(1, 3))
        tokenizer = TrajectoryTokenizer.fit(rng.normal(size=(200, obs_dim + act_dim + 2)), obs_dim, act_dim,
                                            int(rng.integers(2, 30)))
        E, context = int(rng.integers(1, 6)), int(rng.integers(1, 7))
        contexts = rollout.Contexts(tokenizer, E, context)
        for _ in range(int(rng.integers(0, 9))):
            for e in range(E):
                contexts.append(e, rng.normal(size=obs_dim), rng.normal(size=act_dim), float(rng.normal()))
        obs = rng.normal(size=(E, obs_dim)) * 2
        expected = contexts.prefix(range(E), obs)
        checks.check_equal_arrays(build([list(h) for h in contexts.history], contexts.encode_obs(obs), context),
                                  expected, f"prefix (context {context})")


# ---- 09: returns-to-go, interleaving, the evaluation bookkeeping -----------------------------------------------------
def test_09_solutions_agree_with_ttlib_dt():
    from ttlib.agents import dt

    ns = solutions("09_decision_transformer.ipynb")
    agree(ns["returns_to_go"], dt.returns_to_go,
          lambda rng: (rng.normal(size=int(rng.integers(1, 500))) * 50,), trials=20, atol=1e-3,
          rtol=1e-6)

    def streams(rng):
        B, T, C = (int(x) for x in rng.integers(1, 9, size=3))
        return torch.randn(B, T, C), torch.randn(B, T, C), torch.randn(B, T, C)

    agree(ns["interleave"], dt.interleave, streams, trials=10, exact=True)
    model = dt.DecisionTransformer(dt.DTConfig(obs_dim=3, act_dim=1, context=3, n_layer=1, n_embd=8)).eval()
    rng = np.random.default_rng(8)
    for _ in range(10):
        target, rewards = float(rng.normal() * 300), rng.normal(size=int(rng.integers(1, 40))) * 30
        agent, fed = dt.DTAgent(model, target, n_envs=1), []
        for r in rewards:  # what the agent feeds its model before each action
            agent.act(np.zeros((1, 3)))
            fed.append(agent.returns[0, -1, 0].item())
            agent.observe([r])
        np.testing.assert_allclose(ns["return_tokens"](target, rewards), fed, atol=1e-2, rtol=1e-5)


# ---- 08: slices, and the central planner's merge and split -----------------------------------------------------------
def test_08_slices_agree_with_the_evaluator():
    from ttlib.evaluation import ray_evaluation as distributed

    split = solutions("08_scaling_out_with_ray.ipynb")["split_episodes"]
    for n in range(0, 30):
        for workers in range(1, 9):
            slices = split(n, workers)
            assert slices == distributed.slices(n, workers), (n, workers)
            assert sum(slices, []) == list(range(n))  # every episode exactly once, in order


def test_08_merge_and_split_agree_with_the_planner_actor():
    from ttlib.evaluation import ray_evaluation as distributed

    ns = solutions("08_scaling_out_with_ray.ipynb")
    rng = np.random.default_rng(7)
    for _ in range(20):
        P = int(rng.integers(1, 40))
        counts = [int(n) for n in rng.integers(1, 9, size=int(rng.integers(1, 6)))]
        observations = [{"prefix": rng.integers(0, 100, size=(n, P)), "keys": rng.integers(0, 2**62, size=n)}
                        for n in counts]
        checks.check_equal_arrays(ns["merge_contexts"](observations), distributed.merge_observations(observations),
                                  "merged contexts")
        actions = rng.normal(size=(sum(counts), int(rng.integers(1, 4))))
        checks.check_equal_arrays(tuple(ns["split_actions"](actions, counts)),
                                  tuple(distributed.split_actions(actions, counts)), "split actions")


# ---- ttlib.course.checks: the messages learners read -----------------------------------------------------------------
def failure(fn, *args, **kwargs) -> str:
    with pytest.raises(AssertionError) as info:
        fn(*args, **kwargs)
    return str(info.value)


def test_check_close_explains_shapes_values_and_none():
    assert "shape (2, 3) but should have shape (3, 2)" in failure(checks.check_close, np.ones((2, 3)), np.ones((3, 2)))
    assert "transpose" in failure(checks.check_close, torch.ones(2, 3), torch.ones(3, 2))
    message = failure(checks.check_close, torch.tensor([1.0, 2.5, 3.0]), np.array([1.0, 2.0, 3.0]), "out")
    assert "1 of 3 entries" in message and "at (1,) expected 2, got 2.5" in message and "0.5" in message
    assert "forget to `return`" in failure(checks.check_close, None, np.ones(2))
    assert "NaN" in failure(checks.check_close, np.array([np.nan]), np.array([1.0]))
    checks.check_close(torch.tensor([1.0, np.nan]), np.array([1.0 + 1e-7, np.nan]))  # same NaNs, within atol
    checks.check_close((torch.ones(2), np.zeros(1)), (np.ones(2), np.zeros(1)))
    assert "[1]" in failure(checks.check_close, (np.ones(2), np.ones(1)), (np.ones(2), np.zeros(1)))


def test_check_messages_tell_close_values_apart_and_hint_only_when_it_fits():
    # a constant column's edge off by 1e-6: the message shows the digits that differ, not "expected 3, got 3"
    message = failure(checks.check_close, np.array([3.0]), np.array([3.000001]), "edges", atol=1e-12)
    assert "expected 3.000001, got 3." in message and "expected 3, got 3" not in message
    # two empty tensors of different shapes: no reshape hint (there is nothing to reshape)
    message = failure(checks.check_close, torch.ones(0, 3), torch.ones(3, 0))
    assert "shape (0, 3) but should have shape (3, 0)" in message and "reshape" not in message


def test_check_names_the_parts_of_a_tuple_it_lists():
    with pytest.raises(AssertionError, match=r"^the v buffer after your call: 1 of 2 entries differ"):
        checks.check_equal_arrays((np.zeros(2), np.array([0, 1])), (np.zeros(2), np.zeros(2)),
                                  "(the k buffer after, the v buffer after) your call")
    with pytest.raises(AssertionError, match=r"^pair\[1\]"):
        checks.check_equal_arrays((0, 1), (0, 0), "pair")


def test_check_equal_arrays_and_check_shape():
    assert "1 of 3 entries differ" in failure(checks.check_equal_arrays, np.array([1, 2, 3]), np.array([1, 2, 4]))
    checks.check_shape(torch.ones(2, 5), (2, None))
    assert "(2, any, 4)" in failure(checks.check_shape, torch.ones(2, 3), (2, None, 4))
    assert "should have shape (3, any)" in failure(checks.check_shape, np.ones((2, 3)), (3, None))


# ---- ttlib.course.viz ------------------------------------------------------------------------------------------------
def test_attention_maps_are_the_models_weights():
    torch.manual_seed(0)
    model = TrajectoryGPT(GPTConfig(obs_dim=2, act_dim=1, n_bins=7, n_layer=2, n_head=2, n_embd=8, n_transitions=3,
                                    dropout=0.0)).eval()
    bins = torch.randint(0, 7, (2, model.config.block_size))
    maps = viz.attention_maps(model, bins)  # (L, B, H, T, T)
    T = bins.shape[1]
    assert maps.shape == (2, 2, 2, T, T)
    torch.testing.assert_close(maps.sum(-1), torch.ones(2, 2, 2, T))
    assert torch.all(maps[..., ~model.allowed[:T, :T]] == 0)
    with torch.no_grad():  # layer 0's weights reproduce layer 0's attention output
        x = model.tok_emb(bins + model.token_offset[:T]) + model.pos_emb[:T]
        block = model.blocks[0]
        h = block.ln_1(x)
        v = block.attn.qkv(h).split(8, dim=2)[2].view(2, T, 2, 4).transpose(1, 2)
        y = block.attn.proj((maps[0] @ v).transpose(1, 2).reshape(2, T, 8))
        torch.testing.assert_close(y, block.attn(h, model.allowed[:T, :T]), atol=1e-6, rtol=0)
    assert viz.token_labels(2, 1, 6) == ["s0.0", "s1.0", "a0.0", "r.0", "V.0", "s0.1"]



def test_attention_by_kind_sorts_each_querys_attention_by_the_kind_and_transition_of_its_keys():
    td, T = 5, 15  # obs_dim 2, act_dim 1: s s a r V; three transitions
    on_itself = torch.eye(T)  # every query attends to itself only: all of it on its own kind, now
    torch.testing.assert_close(torch.as_tensor(viz.attention_by_kind(on_itself, 2, 1)),
                               torch.eye(4, 9, dtype=torch.float64))
    same_dim_before = torch.zeros(T, T)  # each query on the same dimension one transition back
    same_dim_before[torch.arange(td, T), torch.arange(0, T - td)] = 1.0
    table = viz.attention_by_kind(same_dim_before[None, None], 2, 1)  # leading (B, H) dims are averaged
    torch.testing.assert_close(torch.as_tensor(table[:, 4:8]), torch.eye(4, dtype=torch.float64))
    on_first = torch.zeros(2, T, T)
    on_first[:, :, 0] = 1.0  # every query on the very first token: older than the transition before, from t = 2
    assert np.all(viz.attention_by_kind(on_first, 2, 1)[:, 8] == 1.0)
    torch.manual_seed(0)
    model = TrajectoryGPT(GPTConfig(obs_dim=2, act_dim=1, n_bins=7, n_layer=1, n_head=2, n_embd=8, n_transitions=4,
                                    dropout=0.0)).eval()
    table = viz.attention_by_kind(viz.attention_maps(model, torch.randint(0, 7, (3, T)))[0], 2, 1)
    torch.testing.assert_close(torch.as_tensor(table.sum(1)), torch.ones(4, dtype=torch.float64))
    assert np.all(table[:, [3, 7]] == 0), "no query of a real model attends to a value token"
    with pytest.raises(ValueError, match=r"T > 2 \* transition_dim = 10"):
        viz.attention_by_kind(torch.eye(10), 2, 1)


def test_plot_attention_hatches_every_masked_cell_and_names_the_tokens():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    allowed = trajectory_mask(10, 5)  # (10, 10): causal, and the value columns 4 and 9 hidden
    fig, ax = plt.subplots()
    viz.plot_attention(ax, torch.rand(10, 10) * allowed, allowed, viz.token_labels(2, 1, 10), query=3)
    assert len(ax.collections[0].get_paths()) == int((~allowed).sum()), "one hatched square per masked cell"
    assert [t.get_text() for t in ax.get_yticklabels()] == viz.token_labels(2, 1, 10)
    plt.close(fig)

def test_plot_beam_tree_draws_every_candidate_and_the_best_path():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    model = random_gpt(np.random.default_rng(1), n_transitions=4)
    c = model.config
    tokenizer = TrajectoryTokenizer.fit(np.random.default_rng(2).normal(size=(100, c.transition_dim)), c.obs_dim,
                                        c.act_dim, c.n_bins)
    config = planning.PlannerConfig(beam_width=3, sample_expand=2, horizon=3, context=1)
    trace = []
    plan = planning.beam_plan(model, tokenizer, torch.zeros(2, c.obs_dim, dtype=torch.long), torch.tensor([5, 6]),
                              config, trace=trace)
    assert len(trace) == 3 and trace[0][0].shape == (12,) and trace[0][1].shape == (6,)
    fig, ax = plt.subplots()
    path = viz.plot_beam_tree(ax, trace, 3, 2, env=1)  # the chosen plan's score at every step
    assert len(path) == 3 and abs(path[-1] - float(plan.score[1])) < 1e-4
    plt.close(fig)


def test_token_layout_and_gpt_diagram_draw_every_token_and_block():
    matplotlib = pytest.importorskip("matplotlib")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (layout, diagram) = plt.subplots(1, 2)
    viz.plot_token_layout(layout, obs_dim=3, act_dim=2, n_transitions=2, n_bins=10)
    texts = [t.get_text() for t in layout.texts]
    assert viz.token_labels(3, 2, 14) == [t for t in texts if "." in t and not t.startswith("+")]
    assert sum(p.get_hatch() == "///" for p in layout.patches) == 2, "the two value tokens are hatched"
    assert "+40" in texts, "the last dimension's offset, 4 * n_bins"
    viz.plot_gpt_block(diagram, n_layer=3)
    words = " ".join(t.get_text() for t in diagram.texts)
    assert all(w in words for w in ["ln_1", "ln_2", "ln_f", "MLP", "attention", "x 3", "head"])
    plt.close(fig)


def test_interactive_plot_raises_errors_of_its_first_drawing():
    widgets = pytest.importorskip("ipywidgets")

    def broken(x=1):
        raise ValueError("boom")

    with pytest.raises(ValueError, match="boom"):
        viz.interactive_plot(broken, x=widgets.IntSlider(1))
    drawn = []
    box = viz.interactive_plot(lambda x=1: drawn.append(x), x=widgets.IntSlider(3))
    box.children[0].children[0].value = 5  # moving the slider redraws
    assert drawn == [3, 5]
