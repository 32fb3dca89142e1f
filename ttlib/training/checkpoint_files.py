"""A checkpoint on disk: its tensors in a safetensors file, everything else as JSON in that file's header.

Checkpoints are what a course shares most -- an instructor hands out a trained model, learners swap theirs -- so
reading one must never run code. A PyTorch `.pt` file is a pickle, and unpickling a file *is* running the program
it holds. A safetensors file is only a JSON header (names, dtypes, shapes, byte offsets) and the raw bytes of the
tensors: reading it parses JSON and copies bytes, whoever made it.

A checkpoint's payload is a tree of dicts, lists and tuples whose leaves are tensors or JSON values (str, int,
float, bool, None). `write_payload` takes every tensor out of the tree, names it by its path ("model/head.weight",
"optimizer/state/3/exp_avg"), and leaves a reference in its place; the rest of the tree goes, as JSON, into the
header's metadata. A few shapes JSON has no word for are spelled out so that a round trip is exact:

    a tensor                      {"__tensor__": "model/head.weight"}
    a tuple                       {"__tuple__": [...]}              (AdamW's betas)
    a dict with non-string keys   {"__items__": [[key, value], ...]}  (an optimiser's state, keyed by int)

`read_payload` puts the tree back together. A file that is not a safetensors file -- an old pickled checkpoint, a
truncated download, anything else -- is refused before a byte of it is interpreted, with an error that says what
it is. Old pickled checkpoints are read only by `convert_pickled`, which the user runs knowingly
(`ttlib convert-checkpoint OLD NEW`).
"""

from __future__ import annotations

import json
import os

import numpy as np
import torch

from ttlib.errors import TTLibError
from ttlib.files import atomic_path

__all__ = ["CHECKPOINT_FORMAT", "CheckpointError", "ITEMS", "MAX_HEADER", "METADATA_KEY", "PICKLED_FORMAT", "TENSOR",
           "TUPLE", "convert_pickled", "read_payload", "write_payload"]

CHECKPOINT_FORMAT = "ttlib-checkpoint-v2"  # a payload's "format": safetensors + JSON
PICKLED_FORMAT = "ttlib-checkpoint-v1"  # the format before it: the same payload, pickled by torch.save
TENSOR, TUPLE, ITEMS = "__tensor__", "__tuple__", "__items__"  # the spelled-out shapes (see the docstring)
METADATA_KEY = "ttlib"  # the safetensors metadata entry that holds the payload's JSON
MAX_HEADER = 100 * 2**20  # a safetensors header longer than this is not one of ours (weights are not in it)


class CheckpointError(TTLibError, ValueError):
    """A checkpoint that is missing, corrupt, of another kind, or does not fit the model/environment."""


# ---- the payload as tensors + JSON ---------------------------------------------------------------------------
def _split(tree, path: str, tensors: dict):
    """The tree with every tensor replaced by a reference to its entry in `tensors` (filled in here)."""
    if isinstance(tree, torch.Tensor):
        name = path or "tensor"
        while name in tensors:  # two paths that spell the same ("a/b" as one key, or a under b)
            name += "'"
        tensors[name] = tree.detach().cpu().contiguous().clone()  # clone: no two entries share storage
        return {TENSOR: name}
    if isinstance(tree, dict):
        if all(isinstance(k, str) for k in tree):
            if {TENSOR, TUPLE, ITEMS} & set(tree):
                raise TypeError(f"a checkpoint cannot hold a dict keyed {sorted({TENSOR, TUPLE, ITEMS} & set(tree))} "
                                f"(at {path or 'the top'}): those keys spell tensors, tuples and keyed items")
            return {k: _split(v, f"{path}/{k}" if path else k, tensors) for k, v in tree.items()}
        return {ITEMS: [[_split(k, path, {}), _split(v, f"{path}/{k}", tensors)] for k, v in tree.items()]}
    if isinstance(tree, (list, tuple)):
        items = [_split(v, f"{path}/{i}", tensors) for i, v in enumerate(tree)]
        return {TUPLE: items} if isinstance(tree, tuple) else items
    if isinstance(tree, np.generic):  # a NumPy scalar that found its way into a history row: its Python value
        return tree.item()
    if isinstance(tree, np.ndarray):
        return tree.tolist()
    if tree is None or isinstance(tree, (str, bool, int, float)):
        return tree
    raise TypeError(f"a checkpoint holds tensors and JSON values only, not {type(tree).__name__} (at {path})")


def _join(tree, tensors: dict, source: str):
    """The inverse of `_split`: references replaced by the tensors they name."""
    if isinstance(tree, list):
        return [_join(v, tensors, source) for v in tree]
    if not isinstance(tree, dict):
        return tree
    if TENSOR in tree:
        name = tree[TENSOR]
        if len(tree) != 1 or not isinstance(name, str) or name not in tensors:
            raise CheckpointError(f"{source} names a tensor {name!r} it does not hold (a damaged or edited file)")
        return tensors[name]
    if TUPLE in tree and len(tree) == 1 and isinstance(tree[TUPLE], list):
        return tuple(_join(v, tensors, source) for v in tree[TUPLE])
    if ITEMS in tree and len(tree) == 1 and isinstance(tree[ITEMS], list):
        if not all(isinstance(p, list) and len(p) == 2 for p in tree[ITEMS]):
            raise CheckpointError(f"{source} has a damaged keyed entry (expected [key, value] pairs)")
        try:
            return {_join(k, tensors, source): _join(v, tensors, source) for k, v in tree[ITEMS]}
        except TypeError:  # a list or dict as a key: no checkpoint of ours writes one
            raise CheckpointError(f"{source} has a damaged keyed entry (a key that is not a value)") from None
    return {k: _join(v, tensors, source) for k, v in tree.items()}


def write_payload(path: str, payload: dict) -> None:
    """Write a checkpoint's payload as a safetensors file, atomically: a crash leaves the old file, never half
    of a new one."""
    from safetensors.torch import save_file

    tensors: dict[str, torch.Tensor] = {}
    tree = _split(payload, "", tensors)
    metadata = {METADATA_KEY: json.dumps(tree, allow_nan=True)}
    with atomic_path(path) as tmp:
        save_file(tensors, tmp, metadata=metadata)


# ---- reading: refuse anything that is not a safetensors file, before interpreting it ---------------------------
def _what_it_is(head: bytes) -> str:
    """A few words on a file that is not a safetensors file, from its first bytes."""
    if head.startswith(b"PK\x03\x04"):
        return "a PyTorch .pt file (a zip holding a pickle)"
    if head[:1] == b"\x80" and head[1:2] in (b"\x02", b"\x03", b"\x04", b"\x05"):
        return "a pickle"
    if head.startswith(b"\x89HDF"):
        return "an HDF5 file"
    return "not a safetensors file"


def _check_container(path: str) -> None:
    """CheckpointError unless `path` starts like a safetensors file: an 8-byte header length that fits the file,
    then a JSON object. Nothing else in the file has been read when this refuses it."""
    if not os.path.isfile(path):
        raise CheckpointError(f"no checkpoint at {path}")
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        head = f.read(9)
    header = int.from_bytes(head[:8], "little") if len(head) == 9 else -1
    if 0 < header <= min(size - 8, MAX_HEADER) and head[8:9] == b"{":
        return
    what = _what_it_is(head)
    if what.startswith("a PyTorch") or what == "a pickle":
        raise CheckpointError(
            f"{path} is {what}, and loading a pickle runs whatever code it holds, so ttlib does not open it. If it "
            f"is an older ttlib checkpoint from a source you trust, convert it once: "
            f"ttlib convert-checkpoint {path} NEW.safetensors")
    raise CheckpointError(f"{path} is not a ttlib checkpoint ({what}, or a truncated one)")


def read_payload(path: str) -> dict:
    """The payload a checkpoint file holds (tensors on the CPU). CheckpointError, with nothing in the file run or
    trusted, for anything that is not an intact safetensors file written by `write_payload`."""
    from safetensors import SafetensorError, safe_open

    _check_container(path)
    try:
        with safe_open(path, framework="pt", device="cpu") as f:
            metadata = f.metadata() or {}
            tensors = {name: f.get_tensor(name) for name in f.keys()}
    except (SafetensorError, OSError, ValueError, RuntimeError) as e:  # a cut or damaged file fails in several ways
        raise CheckpointError(f"{path} is not a readable checkpoint (corrupt or truncated?): "
                              f"{str(e).splitlines()[0][:160] if str(e) else type(e).__name__}") from None
    if METADATA_KEY not in metadata:
        raise CheckpointError(f"{path} is a safetensors file but not a ttlib checkpoint (it has no "
                              f"{METADATA_KEY!r} entry in its metadata)")
    try:
        tree = json.loads(metadata[METADATA_KEY])
    except json.JSONDecodeError:
        raise CheckpointError(f"{path} is not a ttlib checkpoint: its metadata is not valid JSON") from None
    payload = _join(tree, tensors, path)
    if not isinstance(payload, dict):
        raise CheckpointError(f"{path} is not a ttlib checkpoint (its metadata is not a JSON object)")
    return payload


# ---- the one way an old pickled checkpoint is read: on purpose ------------------------------------------------
def convert_pickled(source: str, destination: str) -> dict:
    """Read an older, pickled ttlib checkpoint and write it to `destination` as a safetensors one -> its payload.

    The pickle is read with PyTorch's restricted unpickler only (`weights_only=True`: tensors and plain containers,
    all an older ttlib checkpoint holds), which refuses a file that holds anything else, unrun. ttlib never unpickles
    a file in full: that runs any code the file holds. On torch < 2.6, whose restricted unpickler had a known way
    around it (CVE-2025-32434), the conversion is refused: convert with torch 2.6 or newer."""
    if not os.path.isfile(source):
        raise CheckpointError(f"no checkpoint at {source}")
    if tuple(int(x) for x in torch.__version__.split("+")[0].split(".")[:2]) < (2, 6):
        raise CheckpointError(f"torch {torch.__version__} cannot read a pickle safely (its restricted unpickler has "
                              f"a known way around it): convert {source} where torch is 2.6 or newer (e.g. in a "
                              "virtual environment of its own), then use the converted file here")
    try:
        payload = torch.load(source, map_location="cpu", weights_only=True)
    except Exception as e:  # the restricted unpickler's refusal, or a corrupt file
        detail = str(e).splitlines()[0][:200] if str(e) else type(e).__name__
        raise CheckpointError(f"{source} could not be read as a pickled checkpoint: {detail}. ttlib reads only "
                              "tensors and plain data from a pickle (anything else could run code), and an older "
                              "ttlib checkpoint holds nothing else") from None
    if not isinstance(payload, dict) or payload.get("format") != PICKLED_FORMAT:
        raise CheckpointError(f"{source} is not an older ttlib checkpoint (expected format {PICKLED_FORMAT})")
    payload["format"] = CHECKPOINT_FORMAT
    try:
        write_payload(destination, payload)
    except TypeError as e:  # something in it that is neither a tensor nor a JSON value
        raise CheckpointError(f"{source} cannot be written as data only: {e}") from None
    return payload
