"""Nothing a user loads runs code: checkpoints are tensors and JSON, and a pickle is refused before it is read.

Every reader is tried with a file that runs a shell command when it is unpickled (the positive control below shows
the file is live: unpickled in full, it does run). Damaged files -- cut, foreign, a shape or a type edited in the
header -- each get their own clear error, and round trips are exact, optimiser and generators included.
"""

import ast
import json
import os
import pickle
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from ttlib.agents import dt
from ttlib.agents.baselines import load_policy
from ttlib.agents.critic import add_critic, load_critic
from ttlib.bench.decoding import PRESETS, random_model
from ttlib.cli.main import main
from ttlib.training.checkpoint_files import CheckpointError, convert_pickled, read_payload, write_payload
from ttlib.training.checkpoints import (
    default_checkpoint,
    export_checkpoint,
    load_checkpoint,
    read_checkpoint,
    save_checkpoint,
)
from ttlib.training.train import TrainConfig, train

ROOT = Path(__file__).resolve().parents[1]
REFUSED = "loading a pickle runs whatever code it holds"


class RunsACommand:
    """Unpickling this runs `touch marker`: what a malicious "better checkpoint" would do."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


@pytest.fixture
def evil(tmp_path):
    """(a torch.save file that runs a command when unpickled, a plain pickle that does too, the marker they touch)"""
    marker = tmp_path / "it-ran"
    payload = {"format": "ttlib-checkpoint-v1", "kind": "trajectory-gpt", "model": {}, "payload": RunsACommand(marker)}
    as_pt, as_pickle = tmp_path / "shared.pt", tmp_path / "shared.pkl"
    torch.save(payload, as_pt)
    with open(as_pickle, "wb") as f:
        pickle.dump(payload, f, protocol=4)
    return as_pt, as_pickle, marker


def torch_version() -> tuple[int, int]:
    return tuple(int(x) for x in torch.__version__.split("+")[0].split(".")[:2])


def tiny_checkpoint(path, **extra):
    model, tokenizer = random_model(PRESETS["tiny"])
    save_checkpoint(str(path), model, tokenizer, dataset={"id": "t", "env_id": "Pendulum-v1", "env_kwargs": {},
                                                          "obs_dim": 3, "act_dim": 1, "gamma": 0.99}, **extra)
    return model, tokenizer


def test_the_malicious_file_is_live_and_the_conversion_refuses_it_unrun(evil, tmp_path):
    as_pt, _, marker = evil
    refusal = "cannot read a pickle safely" if torch_version() < (2, 6) else "reads only tensors and plain data"
    with pytest.raises(CheckpointError, match=refusal):  # the restricted unpickler refuses it, unrun
        convert_pickled(str(as_pt), str(tmp_path / "new.safetensors"))
    assert not marker.exists() and not (tmp_path / "new.safetensors").exists()
    torch.load(as_pt, map_location="cpu", weights_only=False)  # the control: unpickled in full, here only
    assert marker.exists(), "the control failed: the test's malicious file would not have run anything"


@pytest.mark.parametrize("read", [
    lambda p: read_checkpoint(p), lambda p: read_checkpoint(p, kind=None), lambda p: load_checkpoint(p, device="cpu"),
    lambda p: dt.load_checkpoint(p, device="cpu"), lambda p: load_policy(p), lambda p: load_critic(p, device="cpu"),
    lambda p: add_critic(p, progress=False), lambda p: export_checkpoint(p, p + ".slim"), lambda p: read_payload(p),
    lambda p: train(TrainConfig.from_settings({"steps": 1}), out=p, resume=p, progress=False),
], ids=["read", "read-any-kind", "load", "dt", "policy", "critic", "add-critic", "export", "payload", "resume"])
def test_every_reader_refuses_a_pickle_unrun(read, evil):
    for path in evil[:2]:
        with pytest.raises(CheckpointError, match=REFUSED) as error:
            read(str(path))
        assert "ttlib convert-checkpoint" in str(error.value)
    assert not evil[2].exists()


@pytest.mark.parametrize("args", [
    ["evaluate", "--checkpoint", "{pt}", "--episodes", "1"],
    ["evaluate", "--model", "dt", "--checkpoint", "{pt}", "--episodes", "1"],
    ["evaluate", "--model", "bc", "--checkpoint", "{pt}", "--episodes", "1"],
    ["evaluate", "--checkpoint", "{pt}", "--episodes", "2", "--workers", "2"],
    ["train", "--out", "{dir}/run.safetensors", "--resume", "{pt}", "--steps", "1"],
    ["train-critic", "--checkpoint", "{pt}"],
], ids=["evaluate", "evaluate-dt", "evaluate-bc", "evaluate-ray", "resume", "train-critic"])
def test_every_command_refuses_a_pickle_in_one_line_and_runs_nothing(args, evil, tmp_path, capsys):
    as_pt, _, marker = evil
    assert main([a.format(pt=as_pt, dir=tmp_path) for a in args]) == 2  # (in this process: no interpreter start)
    stderr = capsys.readouterr().err
    assert "Traceback" not in stderr and REFUSED in stderr.strip().splitlines()[-1], stderr[-2000:]
    assert not marker.exists()


def rewrite_header(path, change):
    """Edit a safetensors file's JSON header in place (its tensors' bytes untouched), as a tamperer would."""
    raw = Path(path).read_bytes()
    n = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8:8 + n])
    change(header)
    new = json.dumps(header).encode()
    Path(path).write_bytes(len(new).to_bytes(8, "little") + new + raw[8 + n:])


def edit_payload(change):
    def edit(header):
        tree = json.loads(header["__metadata__"]["ttlib"])
        change(tree)
        header["__metadata__"]["ttlib"] = json.dumps(tree)
    return edit


def swap_shape(header):
    name = next(k for k, v in header.items() if k.startswith("model/") and len(v.get("shape", [])) == 2
                and v["shape"][0] != v["shape"][1])
    header[name]["shape"] = header[name]["shape"][::-1]  # the same bytes, read as another shape


@pytest.mark.parametrize("damage, message", [
    (lambda p: Path(p).write_bytes(Path(p).read_bytes()[: os.path.getsize(p) // 2]), "corrupt or truncated"),
    (lambda p: Path(p).write_bytes(Path(p).read_bytes()[:5]), "not a ttlib checkpoint"),
    (lambda p: save_file({"weight": torch.ones(2)}, p), "safetensors file but not a ttlib checkpoint"),
    (lambda p: rewrite_header(p, swap_shape), "does not fit the model"),
    (lambda p: rewrite_header(p, edit_payload(lambda t: t.update(step="ten"))), "its step should be int"),
    (lambda p: rewrite_header(p, edit_payload(lambda t: t.update(dataset=[]))), "its dataset should be dict"),
    (lambda p: rewrite_header(p, edit_payload(lambda t: t["dataset"].update(obs_dim="3"))),
     "its dataset.obs_dim should be int"),
    (lambda p: rewrite_header(p, edit_payload(lambda t: t.pop("tokenizer"))), "it has no tokenizer"),
    (lambda p: rewrite_header(p, edit_payload(lambda t: t["model_config"].update(n_wings=2))),
     "its model_config does not describe one"),
    (lambda p: rewrite_header(p, edit_payload(lambda t: t["tokenizer"].update(edges="wide"))),
     "its tokenizer does not describe one"),
    (lambda p: rewrite_header(p, edit_payload(lambda t: t["model"].update(extra={"__tensor__": "nowhere"}))),
     "names a tensor 'nowhere' it does not hold"),
    (lambda p: rewrite_header(p, lambda h: h.update(__metadata__={"ttlib": "{not json"})), "not valid JSON"),
], ids=["cut", "stub", "foreign-safetensors", "shape", "step-type", "dataset-type", "obs-dim-type",
        "no-tokenizer", "config-field", "tokenizer-edges", "dangling-tensor", "bad-json"])
def test_damaged_files_each_get_a_clear_error(damage, message, tmp_path):
    path = str(tmp_path / "tt.safetensors")
    tiny_checkpoint(path)
    load_checkpoint(path, device="cpu")  # intact, it loads
    damage(path)
    with pytest.raises(CheckpointError, match=message):
        load_checkpoint(path, device="cpu")


def same(a, b, where="payload"):
    """Equal values of the same types, all the way down (tensors: dtype, shape and every element)."""
    assert type(a) is type(b), f"{where}: {type(a).__name__} came back as {type(b).__name__}"
    if isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b), where
    elif isinstance(a, dict):
        assert list(a) == list(b), where
        for key in a:
            same(a[key], b[key], f"{where}/{key}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            same(x, y, f"{where}/{i}")
    else:
        assert a == b, f"{where}: {a!r} came back as {b!r}"


def test_round_trips_are_exact_optimiser_and_generators_included(tmp_path):
    model, tokenizer = random_model(PRESETS["tiny"])
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.95))
    model(torch.zeros(2, 5, dtype=torch.long))[0].float().pow(2).mean().backward()
    optimizer.step()  # state keyed by int, betas a tuple, step a tensor
    generator = torch.Generator().manual_seed(3)
    torch.rand(4, generator=generator)
    path = str(tmp_path / "run.safetensors")
    save_checkpoint(path, model, tokenizer, dataset={"id": "t", "env_id": "E-v0", "env_kwargs": {"x": [1, 2.5]},
                    "obs_dim": 3, "act_dim": 1, "gamma": 0.99, "mean_return": float("nan")}, step=7,
                    history=[{"step": 0, "val_loss": 1.25, "note": None}], optimizer=optimizer, generator=generator)
    payload = read_checkpoint(path)
    same(optimizer.state_dict(), payload["optimizer"], "optimizer")
    same(generator.get_state(), payload["generator"], "generator")
    assert payload["dataset"]["mean_return"] != payload["dataset"]["mean_return"]  # NaN survives as NaN
    again = str(tmp_path / "again.safetensors")
    write_payload(again, payload)
    payload["dataset"]["mean_return"] = 0.0  # (NaN != NaN: compare the rest)
    reread = read_checkpoint(again)
    reread["dataset"]["mean_return"] = 0.0
    same(payload, reread)
    fresh = torch.optim.AdamW(model.parameters(), lr=1e-3)
    fresh.load_state_dict(payload["optimizer"])  # an optimiser takes it back
    same(optimizer.state_dict(), fresh.state_dict(), "reloaded optimizer")


def test_an_old_pickled_checkpoint_converts_exactly_and_then_plans(tmp_path):
    model, tokenizer = random_model(PRESETS["tiny"])
    old = {"format": "ttlib-checkpoint-v1", "kind": "trajectory-gpt", "model_config": model.config_dict(),
           "model": {k: v.clone() for k, v in model.state_dict().items()}, "tokenizer": tokenizer.state_dict(),
           "dataset": {"id": "t", "env_id": "Pendulum-v1", "env_kwargs": {}, "obs_dim": 3, "act_dim": 1,
                       "gamma": 0.99}, "train_config": None, "step": 3, "history": [{"step": 3, "val_loss": 2.0}]}
    source, new = tmp_path / "old.pt", tmp_path / "new.safetensors"
    torch.save(old, source)
    command = [sys.executable, "-m", "ttlib", "convert-checkpoint", str(source), str(new)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=120)
    if torch_version() < (2, 6):  # its restricted unpickler has a known way around it: refused, the user told why
        assert result.returncode == 2 and "cannot read a pickle safely" in result.stderr and not new.exists()
        assert "torch is 2.6 or newer" in result.stderr.strip().splitlines()[-1]
        return
    assert "restricted unpickler" in result.stderr
    assert result.returncode == 0 and "reading it runs nothing" in result.stdout, result.stderr
    converted, _, payload = load_checkpoint(str(new), device="cpu")
    old["format"] = payload["format"]
    same(old, payload)
    for name, value in model.state_dict().items():
        assert torch.equal(converted.state_dict()[name], value)


def test_the_shipped_checkpoints_are_data():
    for name in ("tt_lunarlander.safetensors", "dt_lunarlander.safetensors", "pbc_lunarlander.safetensors"):
        path = ROOT / "assets" / name
        assert path.read_bytes()[8:9] == b"{", f"{name} is not a safetensors file"
        read_checkpoint(str(path), kind=None)
    assert not list((ROOT / "assets").glob("*.pt")), "a pickled checkpoint is shipped"
    load_checkpoint(default_checkpoint(), device="cpu")


# ---- the guard: no code path in ttlib unpickles a file, except the explicit converter -------------------------
PICKLERS = {"pickle", "cPickle", "dill", "cloudpickle", "joblib", "shelve", "marshal", "_pickle"}
# Where a pickler may be imported, and why that is not loading a user's file.
ALLOWED_IMPORTS = {("ttlib/training/data_parallel.py", "cloudpickle"):
                   "hands a function written in a notebook from the parent process to the workers it starts",
                   ("ttlib/exercises/refuse.py", "marshal"): "names marshal.loads, to refuse it in a learner's code"}
CONVERTER = ("ttlib/training/checkpoint_files.py", "convert_pickled")  # the one torch.load without weights_only=True


def python_sources():
    for folder in ("ttlib", "tools"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            yield path.relative_to(ROOT).as_posix(), path.read_text()
    for path in sorted((ROOT / "notebooks").glob("*.ipynb")):
        cells = json.loads(path.read_text())["cells"]
        code = "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "code")
        yield path.relative_to(ROOT).as_posix(), "\n".join(
            line for line in code.splitlines() if not line.lstrip().startswith(("!", "%")))


def unpickling_sites(name, source):
    """(line, what) for every place in one file that could unpickle something."""
    tree = ast.parse(source)
    functions = {id(n): f.name for f in ast.walk(tree) if isinstance(f, ast.FunctionDef) for n in ast.walk(f)}
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            modules = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
            for module in modules:
                root = module.split(".")[0]
                if root in PICKLERS and (name, root) not in ALLOWED_IMPORTS:
                    yield node.lineno, f"imports {module}"
        if not isinstance(node, ast.Call):
            continue
        call = ast.unparse(node.func)
        keywords = {k.arg: ast.unparse(k.value) for k in node.keywords}
        if call.endswith("torch.load") or call == "load" and "weights_only" in keywords:
            if keywords.get("weights_only") != "True" and (name, functions.get(id(node))) != CONVERTER:
                yield node.lineno, f"{call}(weights_only={keywords.get('weights_only')})"
        if keywords.get("allow_pickle") not in (None, "False"):
            yield node.lineno, f"{call}(allow_pickle={keywords['allow_pickle']})"
        if call.endswith(("read_pickle", "Unpickler")):
            yield node.lineno, call


def test_no_code_path_unpickles_a_file_but_the_explicit_converter():
    found = [f"{name}:{line}: {what}" for name, source in python_sources()
             for line, what in unpickling_sites(name, source)]
    assert not found, "unpickling outside ttlib.training.checkpoint_files.convert_pickled:\n" + "\n".join(found)


def test_the_guard_sees_what_it_guards():
    planted = ("import pickle\nimport torch, numpy as np\ndef f(p):\n    torch.load(p)\n    torch.load(p, "
               "weights_only=False)\n    np.load(p, allow_pickle=True)\n    torch.load(p, weights_only=True)\n")
    found = [what for _, what in unpickling_sites("ttlib/x.py", planted)]
    assert found == ["imports pickle", "torch.load(weights_only=None)", "torch.load(weights_only=False)",
                     "np.load(allow_pickle=True)"]
    converter = "import torch\ndef convert_pickled(p):\n    torch.load(p, weights_only=False)\n"
    assert list(unpickling_sites("ttlib/training/checkpoint_files.py", converter)) == []


@pytest.mark.parametrize("moment", ["as the file is created", "while it is written"])
def test_ctrl_c_at_any_moment_of_a_write_leaves_the_old_file_and_nothing_else(tmp_path, monkeypatch, moment):
    """An atomic write interrupted -- right after its temporary file was created, or halfway through writing it --
    leaves the previous file as it was and no temporary file beside it (a Ctrl-C of `ttlib train` can come at any
    time: it writes a checkpoint at every evaluation)."""
    from ttlib import files

    path = tmp_path / "tt.safetensors"
    write_payload(str(path), {"format": "old", "model": {"w": torch.zeros(3)}})
    before = path.read_bytes()
    real_close = os.close

    def close_then_interrupt(fd):
        real_close(fd)
        raise KeyboardInterrupt  # the signal lands the instant after the file exists

    def interrupted_writer(tensors, tmp, metadata=None):
        Path(tmp).write_bytes(b"half of a checkpoint")
        raise KeyboardInterrupt

    if moment == "as the file is created":
        monkeypatch.setattr(files.os, "close", close_then_interrupt)
    else:
        monkeypatch.setattr("safetensors.torch.save_file", interrupted_writer)
    with pytest.raises(KeyboardInterrupt):
        write_payload(str(path), {"format": "new", "model": {"w": torch.ones(3)}})
    monkeypatch.undo()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tt.safetensors"]
    assert path.read_bytes() == before
