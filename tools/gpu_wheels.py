"""Fill the wheel folder that `tools/gpu-check` installs from, for an offline GPU machine.

    python tools/gpu-wheels                    # -> .whl/ (ignored by git): wheels for Python 3.12, manylinux x86-64
    python tools/gpu-wheels --dest DIR --python-version 3.11 --image-packages pip-list.txt
    python tools/gpu-wheels --grading          # -> .whl-grade/: what `ttlib grade autograde` needs, on its own

The GPU machines the course is checked on have Python, PyTorch, NumPy, h5py, matplotlib and a few hundred other
packages (IMAGE_PACKAGES), but not Gymnasium, Box2D, MuJoCo, Minari or a Jupyter kernel, and no network. This
script runs where pip reaches PyPI and downloads, as wheels only (`pip download --only-binary=:all:` for the target
Python and platform), what the course needs there:

    the course's dependencies (pyproject.toml), less what the machine has and the JupyterLab front end, plus what
    runs a notebook without a browser (ipykernel, nbclient, nbformat), and what those need in turn

It keeps the wheels the course's needs reach without passing through a package the machine already has, leaves
out what nothing run there imports (DROPPED) and what is too big to carry (LEFT_OUT), and writes manifest.json
beside them: every wheel, its size, and what was left out and why (gpu-check reads it).

With --grading it fills another folder (.whl-grade/), which travels without .whl/, with what `ttlib grade autograde`
needs there: the same, without the simulators (GRADING_LEFT_OUT), plus nbgrader and its requirements, less its
JupyterLab and Notebook front ends (GRADING_DROPPED).
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from email.parser import HeaderParser
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]  # the repository checkout this module lives in
DEFAULT_DEST = ROOT / ".whl"
GRADING_DEST = ROOT / ".whl-grade"

# The Python packages of the GPU machines' image ('cuda', as listed on 2026-11-17): never carried. Another machine:
# --image-packages with its `pip list` or `pip freeze` output.
IMAGE_PACKAGES = """
absl-py accelerate aiofiles aiohappyeyeballs aiohttp aiosignal annotated-doc anyio attrs botorch build certifi
charset-normalizer chex click cloudpickle cmake colorama contourpy coverage cuda-bindings cuda-core cuda-pathfinder
cuda-toolkit cupy-cuda13x cycler cython diffrax e3nn einops equinox etils execnet filelock flatbuffers flax fonttools
formulaic frozenlist fsspec gpytorch grpcio h11 h5py hf-xet httpcore httpx huggingface-hub humanize hypothesis idna
imageio iniconfig interface-meta jax jax-cuda13-pjrt jax-cuda13-plugin jaxlib jaxtyping jinja2 joblib kiwisolver
lazy-loader lightning lightning-utilities linear-operator lineax llvmlite lxml markdown markdown-it-py markupsafe
matplotlib mdurl meson ml-dtypes mpi4py mpmath msgpack multidict multipledispatch mypy-extensions nanobind narwhals
networkx ninja numba numba-cuda numpy numpyro nvidia-cublas nvidia-cuda-cupti nvidia-cuda-nvrtc nvidia-cuda-runtime
nvidia-cudnn-cu13 nvidia-cufft nvidia-cufile nvidia-curand nvidia-cusolver nvidia-cusparse nvidia-cusparselt-cu13
nvidia-ml-py nvidia-nccl-cu13 nvidia-nvjitlink nvidia-nvshmem-cu13 nvidia-nvtx onnx onnx-ir onnxruntime onnxscript
opencv-python-headless optax opt-einsum opt-einsum-fx optimistix orbax-checkpoint packaging pandas pathspec patsy peft
pillow pip pluggy portalocker prometheus-client propcache protobuf psutil pyarrow pybind11 py-cpuinfo pygments
pyparsing pyproject-hooks pyre-extensions pytest pytest-benchmark pytest-cov pytest-mock pytest-timeout pytest-xdist
python-dateutil pytorch-lightning pyyaml regex requests rich sacrebleu safetensors scikit-build-core scikit-image
scikit-learn scipy seaborn sentencepiece sentence-transformers setuptools shellingham simplejson six
sortedcontainers statsmodels sympy tabulate tensorboard tensorboard-data-server tensorstore threadpoolctl tifffile
tiktoken timm tokenizers toolz torch torchaudio torchdiffeq torch-geometric torchmetrics torchvision tqdm
transformers treescope triton typer typing-extensions typing-inspect urllib3 uvloop wadler-lindig werkzeug wheel
wrapt xarray xxhash yarl zipp
""".split()

# What runs the notebooks without a browser, in place of the course's `jupyterlab` dependency.
RUNNER = ["ipykernel", "nbclient", "nbformat"]
NOT_NEEDED = {"jupyterlab": "the browser front end: nbclient runs the notebooks"}

# Required by a package we carry, but imported by nothing gpu-check runs (checked: every notebook and part runs
# without them). Each would cost megabytes of the carried folder.
DROPPED = {
    "mujoco-studio": "MuJoCo's interactive viewer: its environments and rgb_array rendering run without it",
    "debugpy": "the kernel's debugger: ipykernel runs without it",
    "jedi": "IPython's tab completion: IPython runs without it",
    "widgetsnbextension": "ipywidgets' JupyterLab front end: a kernel run by nbclient has no browser",
    "jupyterlab-widgets": "ipywidgets' JupyterLab front end: a kernel run by nbclient has no browser",
}

# --grading: what `ttlib grade autograde` needs, in a folder that travels on its own (.whl/ and it together, with the
# checkout, are more than the 64 MiB a GPU machine's working tree may carry): the course's needs without the
# simulators (GRADING_PLAIN: gymnasium without its extras), plus nbgrader, less nbgrader's front ends, which nothing
# autograding runs imports (GRADING_DROPPED, 33 MB of wheels; checked with `python -X importtime` on nbgrader's
# apps and converters and ttlib.grading: nbconvert imports `notebook` only to find its CSS, and runs without it).
GRADING = ["nbgrader>=0.9"]
GRADING_PLAIN = {"gymnasium"}
GRADING_LEFT_OUT = {
    "box2d": "gymnasium's Box2D (with pygame, 16 MB): the hidden tests of a notebook that runs LunarLander fail there",
    "mujoco": "gymnasium's MuJoCo (13 MB): the hidden tests of a notebook that runs HalfCheetah fail there",
}
GRADING_DROPPED = {
    "jupyterlab": "nbgrader's formgrader and assignment list in JupyterLab: autograding runs without a browser",
    "notebook": "nbgrader's Notebook 7 extensions: autograding runs without a browser",
    "jupyterlab-server": "JupyterLab's server: autograding runs without a browser",
}

# Needed by a notebook, but not carried: gpu-check reports that notebook as not run, and why.
LEFT_OUT = {
    "ray": "notebook 08's Ray: its wheel alone is larger than the 64 MiB a GPU machine's working tree may carry",
}

MANYLINUX_X86_64 = ["manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64",
                    "manylinux1_x86_64"]


def normalize(name: str) -> str:
    """A project name as pip compares them (PEP 503): lower case, runs of -_. as one -."""
    return re.sub(r"[-_.]+", "-", name).lower()


def wheel_metadata(path) -> tuple[str, str, list[str]]:
    """A wheel's (normalized name, version, Requires-Dist lines), read from its METADATA."""
    with zipfile.ZipFile(path) as wheel:
        name = next(n for n in wheel.namelist() if re.fullmatch(r"[^/]+\.dist-info/METADATA", n))
        headers = HeaderParser().parsestr(wheel.read(name).decode("utf-8"))
    return normalize(headers["Name"]), headers["Version"], headers.get_all("Requires-Dist") or []


def target_environment(python_version: str) -> dict:
    """The PEP 508 marker variables of CPython `python_version` on Linux x86-64."""
    return {"python_version": ".".join(python_version.split(".")[:2]), "python_full_version": python_version,
            "implementation_name": "cpython", "platform_python_implementation": "CPython", "os_name": "posix",
            "sys_platform": "linux", "platform_system": "Linux", "platform_machine": "x86_64", "extra": ""}


def needed(requirements: list[str], environment: dict, extras: set[str] = frozenset()):
    """The Requirement objects among `requirements` (Requires-Dist lines) that apply in `environment` when the
    package is installed with `extras`."""
    from packaging.requirements import Requirement

    for line in requirements:
        requirement = Requirement(line)
        if requirement.marker is None or any(requirement.marker.evaluate({**environment, "extra": extra})
                                             for extra in (extras or {""})):
            yield requirement


def course_requirements(plain=frozenset()) -> list[str]:
    """pyproject.toml's dependencies, less what is NOT_NEEDED, plus the RUNNER; those named in `plain` without
    their extras."""
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        raise SystemExit("gpu-wheels: needs Python >= 3.11 (tomllib)") from None

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    from packaging.requirements import Requirement

    kept = [r for r in map(Requirement, project["dependencies"]) if normalize(r.name) not in NOT_NEEDED]
    return [f"{r.name}{r.specifier}" if normalize(r.name) in plain else str(r) for r in kept] + RUNNER


def closure(top: list[str], wheels: dict, image: set[str], environment: dict,
            dropped=frozenset(DROPPED)) -> tuple[list[str], set[str]]:
    """Walk the requirements from `top` through the downloaded `wheels` ({name: path}): -> (names of the wheels to
    carry, names of the image's packages met on the way). A walk stops at a package the image has, at `dropped`
    and LEFT_OUT packages."""
    from packaging.requirements import Requirement

    carry, met, todo = [], set(), [Requirement(line) for line in top]
    seen: dict[str, set[str]] = {}
    while todo:
        requirement = todo.pop()
        name = normalize(requirement.name)
        if name in image:
            met.add(name)
            continue
        if name in dropped or name in LEFT_OUT:
            continue
        extras = set(requirement.extras)
        if name in seen and extras <= seen[name]:
            continue
        if name not in wheels:
            raise SystemExit(f"gpu-wheels: {name} is needed but pip downloaded no wheel of it")
        if name not in seen:
            carry.append(name)
        seen[name] = seen.get(name, set()) | extras
        todo += list(needed(wheel_metadata(wheels[name])[2], environment, extras))
    return carry, met


def download(requirements: list[str], folder: Path, python_version: str, platforms: list[str]) -> None:
    """pip download, wheels only, for CPython `python_version` on `platforms`, with everything they need."""
    command = [sys.executable, "-m", "pip", "download", "--quiet", "--only-binary=:all:", "--python-version",
               python_version, "--implementation", "cp", "--dest", str(folder)]
    for platform in platforms:
        command += ["--platform", platform]
    result = subprocess.run(command + requirements, capture_output=True, text=True)
    if result.returncode != 0:
        raise SystemExit("gpu-wheels: pip download failed:\n" + result.stderr.strip()[-2000:])


def read_image_packages(path: str | None) -> set[str]:
    """Names of the packages the target machine has: IMAGE_PACKAGES, or a `pip list` / `pip freeze` output."""
    if path is None:
        return {normalize(n) for n in IMAGE_PACKAGES}
    names = set()
    for line in Path(path).read_text().splitlines():
        match = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", line)
        if match and not line.startswith(("Package", "---")):
            names.add(normalize(match.group(1)))
    return names


def fill(dest: Path, python_version: str, platforms: list[str], image: set[str], grading: bool = False) -> dict:
    """Download, keep what the course (`grading`: what grading) needs there, and replace `dest` with it and its
    manifest.json."""
    top = course_requirements(GRADING_PLAIN) + GRADING if grading else course_requirements()
    dropped = {**DROPPED, **GRADING_DROPPED} if grading else DROPPED
    with tempfile.TemporaryDirectory(prefix="gpu-wheels-") as tmp:
        downloads = Path(tmp) / "all"
        download(top, downloads, python_version, platforms)
        wheels = {wheel_metadata(p)[0]: p for p in downloads.glob("*.whl")}
        carry, met = closure(top, wheels, image, target_environment(python_version), set(dropped))
        staged = Path(tmp) / "staged"
        staged.mkdir()
        for name in carry:
            shutil.copy2(wheels[name], staged / wheels[name].name)
        files = sorted(staged.glob("*.whl"))
        manifest = {"python_version": python_version, "platforms": platforms, "requirements": top,
                    "wheels": [{"file": p.name, "name": wheel_metadata(p)[0], "version": wheel_metadata(p)[1],
                                "bytes": p.stat().st_size} for p in files],
                    "total_bytes": sum(p.stat().st_size for p in files), "image_packages_needed": sorted(met),
                    "dropped": dropped, "left_out": GRADING_LEFT_OUT if grading else LEFT_OUT}
        (staged / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
        old = dest.with_name(dest.name + ".old")
        shutil.rmtree(old, ignore_errors=True)
        if dest.exists():
            dest.rename(old)
        shutil.move(str(staged), dest)  # the new folder whole, or (if this fails) the old one kept beside it
        shutil.rmtree(old, ignore_errors=True)
    return manifest


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="gpu-wheels", description=__doc__.split("\n\n")[0])
    parser.add_argument("--dest", help="the wheel folder (default: .whl/, with --grading .whl-grade/)")
    parser.add_argument("--python-version", default="3.12", help="the GPU machine's Python (default 3.12)")
    parser.add_argument("--platform", action="append", help="wheel platform tags (default: manylinux x86-64)")
    parser.add_argument("--image-packages", help="a `pip list` or `pip freeze` of the GPU machine (default: its "
                        "image as listed in this script)")
    parser.add_argument("--grading", action="store_true", help="fill the folder of what `ttlib grade autograde` "
                        "needs (nbgrader; no simulators): it travels without .whl/")
    args = parser.parse_args(argv)
    args.dest = args.dest or str(GRADING_DEST if args.grading else DEFAULT_DEST)
    manifest = fill(Path(args.dest), args.python_version, args.platform or MANYLINUX_X86_64,
                    read_image_packages(args.image_packages), args.grading)
    for wheel in manifest["wheels"]:
        print(f"{wheel['bytes'] / 2**20:7.2f} MiB  {wheel['file']}")
    print(f"{len(manifest['wheels'])} wheels, {manifest['total_bytes'] / 2**20:.1f} MiB in {args.dest}; the image "
          f"already has {len(manifest['image_packages_needed'])} of what they need; left out: "
          + ", ".join(f"{name} ({why})" for name, why in {**manifest["dropped"], **manifest["left_out"]}.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
