"""Where datasets live on disk and how they are read: Minari's folders, completeness checks, downloads.

Datasets are stored in Minari's format and in Minari's folder (MINARI_DATASETS_PATH, default
~/.minari/datasets), so Minari's own tools can read them too. Remote Minari ids (e.g.
"mujoco/halfcheetah/medium-v0") are downloaded by Minari given internet; offline, one short connection attempt
fails at once with a clear message instead of Minari's half a minute of retries. A local dataset that is there but
broken is never replaced behind your back: reading it raises a DatasetError that says how to fix it.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
from pathlib import Path
from urllib.parse import urlsplit

import gymnasium as gym
import minari
import numpy as np
from minari.storage import get_dataset_path

from ttlib.errors import TTLibError

__all__ = ["DEFAULT_DATASET", "DatasetError", "HALFCHEETAH_DATASET", "NO_EXPERT_DATASET", "OWN_DATASETS",
           "REBUILD_HINT", "dataset_path", "download", "list_broken", "list_local", "minari_root", "read_episodes",
           "read_metadata"]

DEFAULT_DATASET = "ttlib/lunarlander/mixed-v0"  # the course dataset, built locally, offline
NO_EXPERT_DATASET = "ttlib/lunarlander/no-expert-v0"  # the same lander without the expert: a late pilot and random
HALFCHEETAH_DATASET = "ttlib/halfcheetah/scripted-v0"  # small MuJoCo-shaped dataset (obs 17, act 6), offline
# built by ttlib (datasets_build): a broken one is rebuilt
OWN_DATASETS = (DEFAULT_DATASET, NO_EXPERT_DATASET, HALFCHEETAH_DATASET)

REBUILD_HINT = "rebuild it with `ttlib make-dataset --force` (or ttlib.data.trajectories.build({id!r}, force=True))"


class DatasetError(TTLibError, ValueError):
    """Every bad input the data modules detect: one line that says what is wrong and what to do about it."""


@contextlib.contextmanager
def minari_root(path: Path):
    """Point Minari at another datasets folder for a while (it reads MINARI_DATASETS_PATH on every call)."""
    old = os.environ.get("MINARI_DATASETS_PATH")
    os.environ["MINARI_DATASETS_PATH"] = str(path)
    try:
        yield
    finally:
        if old is None:
            del os.environ["MINARI_DATASETS_PATH"]
        else:
            os.environ["MINARI_DATASETS_PATH"] = old


def dataset_path(dataset_id: str) -> Path:
    """Where Minari keeps a dataset: <MINARI_DATASETS_PATH or ~/.minari/datasets>/<dataset_id>."""
    return Path(get_dataset_path(dataset_id))


def _corrupt(dataset_id: str, path: Path, reason: str) -> DatasetError:
    fix = REBUILD_HINT.format(id=dataset_id) if dataset_id in OWN_DATASETS else f"delete the folder {path}"
    reason = reason.strip().splitlines()[0] if reason.strip() else "unknown reason"
    return DatasetError(f"local dataset {dataset_id} at {path} is corrupt or half-written ({reason}); {fix}")


def read_metadata(dataset_id: str, path: Path) -> dict:
    try:
        with open(path / "data" / "metadata.json") as file:
            return json.load(file)
    except (OSError, ValueError) as error:
        raise _corrupt(dataset_id, path, f"{type(error).__name__}: {error}") from None


def _complete(path: Path, metadata: dict) -> bool:
    """Cheap completeness check: the data file opens and holds as many episodes as the metadata says."""
    if metadata.get("data_format", "hdf5") != "hdf5":
        return True  # arrow/parquet keep one folder per episode; the full read in load() checks those
    try:
        import h5py

        with h5py.File(path / "data" / "main_data.hdf5", "r") as file:
            return len(file.keys()) == metadata.get("total_episodes")
    except OSError:
        return False


def _local_folders():
    """(dataset_id, path) of every folder under Minari's root that holds a data/ folder, hidden ones skipped
    (leftovers of a crashed build)."""
    root = dataset_path("")
    for data_dir in sorted(root.rglob("data")):
        path = data_dir.parent
        parts = path.relative_to(root).parts
        if data_dir.is_dir() and not any(part.startswith(".") for part in parts):
            yield "/".join(parts), path


def _problem(dataset_id: str, path: Path) -> tuple[dict, str | None]:
    """-> (metadata, None) for a complete dataset, or ({}, one-line error with the fix) for a broken one."""
    try:
        metadata = read_metadata(dataset_id, path)
    except DatasetError as error:
        return {}, str(error)
    if metadata.get("dataset_id") != dataset_id:
        return {}, str(_corrupt(dataset_id, path, f"its metadata names {metadata.get('dataset_id')!r}"))
    if not _complete(path, metadata):
        return {}, str(_corrupt(dataset_id, path, "fewer episodes in its data file than its metadata says"))
    return metadata, None


def list_local() -> list[dict]:
    """Every complete local Minari dataset: id, episodes, steps, env_id, path. Broken ones are in list_broken()."""
    found = []
    for dataset_id, path in _local_folders():
        metadata, problem = _problem(dataset_id, path)
        if problem is not None:
            continue
        env_spec = metadata.get("eval_env_spec") or metadata.get("env_spec")
        found.append(
            {
                "id": dataset_id,
                "episodes": metadata.get("total_episodes"),
                "steps": metadata.get("total_steps"),
                "env_id": json.loads(env_spec)["id"] if env_spec else None,
                "path": str(path),
            }
        )
    return found


def list_broken() -> list[dict]:
    """Every local dataset folder that cannot be loaded (half download, truncated file): id, path, and the
    error `load` would raise, which says how to fix it."""
    broken = []
    for dataset_id, path in _local_folders():
        _, problem = _problem(dataset_id, path)
        if problem is not None:
            broken.append({"id": dataset_id, "path": str(path), "error": problem})
    return broken


def _remote_host() -> tuple[str, int]:
    """The host:port a Minari download talks to first (the HTTPS proxy if one is set)."""
    proxy = os.environ.get("HTTPS_PROXY") or os.environ.get("https_proxy")
    remote = os.environ.get("MINARI_REMOTE", "hf://farama-minari")
    if proxy:
        url = urlsplit(proxy if "://" in proxy else f"http://{proxy}")
    elif remote.startswith("gcp://"):
        url = urlsplit("https://storage.googleapis.com")
    else:
        url = urlsplit(os.environ.get("HF_ENDPOINT", "https://huggingface.co"))
    return url.hostname or "", url.port or (443 if url.scheme == "https" else 80)


def download(dataset_id: str) -> None:
    """Let Minari download a remote dataset, turning its failures into one-line DatasetErrors.

    Offline, Minari's hub client retries with back-off for half a minute before giving up, so first try one
    plain TCP connection with a short timeout and fail at once if the remote cannot be reached.
    """
    # Offline we cannot tell a remote id from a mistyped local one, so say both: it is not here, and a download
    # (if it is a remote id) needs internet.
    offline = DatasetError(
        f"dataset {dataset_id} is not on this machine (no folder {dataset_path(dataset_id)}; `ttlib datasets` "
        f"lists the local ones) and, if it is a remote Minari id, downloading it needs internet; "
        f"the offline course dataset is {DEFAULT_DATASET!r}"
    )
    if os.environ.get("HF_HUB_OFFLINE", "0").lower() not in ("", "0", "false", "no"):
        raise offline
    try:
        socket.create_connection(_remote_host(), timeout=5).close()
    except OSError:
        raise offline from None

    try:
        minari.download_dataset(dataset_id)
    except ImportError as error:
        raise DatasetError(f"downloading {dataset_id} needs Minari's remote extras: {error}") from None
    except ValueError as error:  # Minari: no such dataset, or no version compatible with this Minari
        raise DatasetError(f"unknown dataset id {dataset_id!r}: {str(error).splitlines()[0]}") from None
    except Exception as error:  # network trouble half-way: requests/httpx errors, timeouts, HTTP errors
        raise DatasetError(
            f"downloading {dataset_id} failed ({type(error).__name__}: {str(error).splitlines()[0]}); "
            f"check the internet connection, or use the offline course dataset {DEFAULT_DATASET!r}"
        ) from None


def read_episodes(dataset_id: str, path: Path) -> dict:
    """Read every episode of a local Minari dataset: the fields of an OfflineDataset but gamma and values."""
    metadata = read_metadata(dataset_id, path)
    written_by = metadata.get("minari_version")
    try:
        minari_dataset = minari.load_dataset(dataset_id)
        episodes = list(minari_dataset.iterate_episodes())
    except Exception as error:  # truncated or missing data file, broken metadata, unsupported Minari version
        if written_by and written_by not in minari.supported_dataset_versions:  # not broken: just newer
            fix = "upgrade Minari (pip install -U minari)"
            if dataset_id in OWN_DATASETS:
                fix += ", or " + REBUILD_HINT.format(id=dataset_id)
            raise DatasetError(f"local dataset {dataset_id} at {path} was written by Minari {written_by}, which "
                               f"this Minari {minari.__version__} cannot read; {fix}") from None
        raise _corrupt(dataset_id, path, f"{type(error).__name__}: {error}") from None
    n_steps = sum(len(episode) for episode in episodes)
    if len(episodes) != metadata.get("total_episodes") or n_steps != metadata.get("total_steps"):
        raise _corrupt(dataset_id, path, "fewer episodes or steps than its metadata says")

    spaces = {"observation": minari_dataset.observation_space, "action": minari_dataset.action_space}
    for name, space in spaces.items():
        if not isinstance(space, gym.spaces.Box) or len(space.shape) != 1:
            raise DatasetError(f"{dataset_id} has a {space} {name} space; ttlib handles flat Box spaces only")

    observations, actions, rewards, terminations, truncations, behaviour = [], [], [], [], [], []
    for episode in episodes:
        T = len(episode.rewards)
        observations.append(np.asarray(episode.observations[:T], dtype=np.float32))  # (T, obs_dim), drop last
        actions.append(np.asarray(episode.actions, dtype=np.float32))  # (T, act_dim)
        rewards.append(np.asarray(episode.rewards, dtype=np.float32))  # (T,)
        terminations.append(np.asarray(episode.terminations, dtype=bool))  # (T,)
        truncations.append(np.asarray(episode.truncations, dtype=bool))  # (T,)
        labels = (episode.infos or {}).get("behaviour")
        if labels is not None and len(labels) > 0:
            label = labels[0]
            behaviour.append(label.decode() if isinstance(label, bytes) else str(label))

    env_spec = metadata.get("eval_env_spec") or metadata.get("env_spec")
    env_spec = json.loads(env_spec) if env_spec else {}
    action_space = spaces["action"]
    return dict(
        dataset_id=dataset_id,
        env_id=env_spec.get("id"),
        env_kwargs=_env_kwargs(env_spec),
        observations=observations,
        actions=actions,
        rewards=rewards,
        terminations=terminations,
        truncations=truncations,
        behaviour=behaviour if len(behaviour) == len(episodes) else None,
        ref_min_score=metadata.get("ref_min_score"),
        ref_max_score=metadata.get("ref_max_score"),
        action_low=action_space.low.astype(np.float64).tolist(),
        action_high=action_space.high.astype(np.float64).tolist(),
    )


def _env_kwargs(env_spec: dict) -> dict:
    """gymnasium.make kwargs that rebuild the environment a dataset was collected in: the spec's kwargs, plus its
    time limit where that is not the registered one (episodes cut at 200 steps must be compared with episodes
    cut at 200 steps). A limit equal to the registered one is left out, so such datasets read as they always did.
    """
    kwargs = dict(env_spec.get("kwargs") or {})
    limit = env_spec.get("max_episode_steps")
    try:
        registered = gym.spec(env_spec["id"]).max_episode_steps
    except (KeyError, gym.error.Error):  # no id, or an environment not installed here: keep what the data say
        registered = None
    if limit is not None and limit != registered:
        kwargs["max_episode_steps"] = limit
    return kwargs

