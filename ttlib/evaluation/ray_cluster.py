"""Connecting to Ray: an existing cluster (RAY_ADDRESS) or a local one started here, on loopback only.

Ray is optional (`pip install ray`): importing it happens here, with one clear message when it is missing. A local
cluster listens on 127.0.0.1 only, so a course machine never opens ports to its network.
"""

from __future__ import annotations

import contextlib
import os
import socket
import sys

from ttlib.errors import TTLibError

__all__ = ["DistributedError", "check_reachable", "cluster_cpus", "connect", "import_ray"]


class DistributedError(TTLibError, RuntimeError):
    """Ray is missing, the cluster cannot be reached, or episodes could not be completed."""


def import_ray():
    """Ray itself, or a clear error naming the extra that installs it."""
    try:
        import ray
    except ImportError:
        raise DistributedError("distributed evaluation needs Ray, which is not installed: install the `ray` extra, "
                               "pip install 'ttlib[ray]' (or pip install 'ray[default]')") from None
    return ray


@contextlib.contextmanager
def _loopback_settings(new_cluster: bool):
    """A local cluster that listens on the loopback interface only and leaves no auth token in ~/.ray.

    On Linux Ray binds to the machine's network address so that other nodes can join (and a driver rewrites
    127.0.0.1 in an address to that network address); RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 makes it use 127.0.0.1,
    as it does on a laptop. Recent Ray turns on token authentication for a new local cluster and writes
    ~/.ray/auth_token; nothing but this machine can reach a loopback-only cluster, so a new one starts with
    RAY_AUTH_MODE=disabled. Both are read while Ray starts or connects, then restored.
    """
    settings = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", **({"RAY_AUTH_MODE": "disabled"} if new_cluster else {})}
    saved = {k: os.environ.get(k) for k in settings}
    for k, v in settings.items():
        os.environ.setdefault(k, v)
    constants = sys.modules.get("ray._private.ray_constants")  # Ray reads the flag once, when it is imported
    if constants is not None and os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] == "0":
        constants.ENABLE_RAY_CLUSTER = False
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        constants = sys.modules.get("ray._private.ray_constants")
        if constants is not None and hasattr(constants, "env_bool"):  # Ray's own default for this platform
            constants.ENABLE_RAY_CLUSTER = constants.env_bool("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER",
                                                              not constants.IS_WINDOWS_OR_OSX)


def check_reachable(address: str, timeout: float = 3.0) -> None:
    """Fail fast when nothing listens at a cluster address (Ray itself would retry for minutes)."""
    hostport = address.removeprefix("ray://")
    host, _, port = hostport.rpartition(":")
    if not host or not port.isdigit():
        raise DistributedError(f"Ray cluster address {address!r} is not host:port (e.g. 10.0.0.5:6379 or "
                               f"ray://10.0.0.5:10001)")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout).close()
    except OSError as e:
        raise DistributedError(f"no Ray cluster answers at {address} ({e.strerror or e}); start one there with "
                               f"`ray start --head`, or leave the address out to start a local cluster") from None


def connect(address: str | None = None, num_cpus: int | None = None, temp_dir: str | None = None,
            ship_code: bool = True):
    """Attach this process to Ray. -> (ray, started): started is True if this call started a local cluster.

    Uses the running Ray session if there is one; else the cluster at `address` (or $RAY_ADDRESS), e.g.
    "10.0.0.5:6379" or "ray://10.0.0.5:10001"; else starts a local cluster on this machine (`num_cpus` CPUs,
    Ray's files under `temp_dir`), loopback only. A cluster's workers get this copy of ttlib unless `ship_code` is
    False (the grader: its workers use the course installed on their machine, with its assets and datasets).
    """
    if "ray" in sys.modules and sys.modules["ray"].is_initialized():
        return sys.modules["ray"], False
    address = address or os.environ.get("RAY_ADDRESS") or None
    if address not in (None, "local"):
        ray = import_ray()
        if address != "auto":
            check_reachable(address)
        import ttlib

        host = address.removeprefix("ray://").rpartition(":")[0].strip("[]")
        loopback = host in ("localhost", "::1") or host.startswith("127.")
        try:  # ship this copy of ttlib to the cluster's workers: they need the code, not the assets
            with _loopback_settings(new_cluster=False) if loopback else contextlib.nullcontext():
                ray.init(address=address, log_to_driver=False,
                         runtime_env={"py_modules": [os.path.dirname(ttlib.__file__)]} if ship_code else None)
        except Exception as e:
            raise DistributedError(f"could not connect to the Ray cluster at {address}: {type(e).__name__}: "
                                   f"{str(e).splitlines()[0] if str(e) else ''}") from None
        return ray, False
    with _loopback_settings(new_cluster=True):
        ray = import_ray()
        for attempt in range(3):  # on a very busy machine the raylet can miss Ray's 30 s start-up deadline
            try:
                ray.init(num_cpus=num_cpus, include_dashboard=False, _temp_dir=temp_dir, log_to_driver=False)
                break
            except Exception as e:
                ray.shutdown()
                if attempt == 2 or "timed out" not in str(e):
                    raise DistributedError(f"could not start a local Ray cluster: {e}") from None
    return ray, True


def cluster_cpus(ray) -> float:
    return float(ray.cluster_resources().get("CPU", 1.0))

