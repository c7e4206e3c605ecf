"""Reuse a finished training run's Ray actors for the next run of the same shape.

A training run on Ray starts a rollout worker per `resources.num_rollout_workers`, a learner and a
retriever, each a process that imports torch and transformers before it can do anything:
about 30 s on a 2-core laptop, against 4 s of training in the `smoke` profile. The `mem1`
pipeline trains two PPO agents one after the other (the `mem1` and `full` memory policies),
so inside `reuse_actors()` a run's `Runtime.shutdown` parks its actors here instead of
killing them, and the next `start_runtime` with the same key (`reuse_key`: the resources
the actors hold and the index the retriever serves) takes them back and has each rebuild its
state from the new run's config, policy and run directory. Outside the context (the CLI, a
single training flow) nothing is kept: a run's actors end with the run, as before.

Only the processes are shared, never state: a reset worker or learner runs its constructor
again (models, optimisers, environment), so a reused run trains exactly as a fresh one.
"""

from __future__ import annotations

import gc
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from mem1_core.config import Config

log = logging.getLogger(__name__)

_parked: dict[tuple, Any] | None = None
"""key -> a parked Runtime; None outside `reuse_actors()`."""


@contextmanager
def reuse_actors() -> Iterator[None]:
    """Within: training runs park their actors at shutdown and reuse parked ones at start.
    On exit every parked runtime is shut down for good (and the Ray it started with it).
    Nested uses share the outermost pool."""
    global _parked
    if _parked is not None:
        yield
        return
    _parked = {}
    try:
        yield
    finally:
        parked, _parked = _parked, None
        for runtime in parked.values():
            try:
                runtime.shutdown(park=False)
            except Exception:  # noqa: BLE001 - the others must still be stopped
                log.exception("stopping parked Ray actors failed")


def park(key: tuple, runtime: Any) -> bool:
    """Keep `runtime` for a later `take(key)`; False (keep nothing) outside `reuse_actors()`.
    A runtime already parked under the same key is shut down: one per shape is enough."""
    if _parked is None:
        return False
    old = _parked.pop(key, None)
    _parked[key] = runtime
    if old is not None and old is not runtime:
        old.shutdown(park=False)
    return True


def take(key: tuple) -> Any | None:
    """The runtime parked under `key` (removed from the pool), or None."""
    if _parked is None:
        return None
    return _parked.pop(key, None)


def reuse_key(cfg: Config, index: Path | None, backend: str) -> tuple:
    """What a parked runtime must share with a new run to serve it:
    the resources and placement of its actors, the generation backend (as the driver chose
    it: vllm_engine.choose_backend) and model family they loaded, and the corpus its retriever
    serves (by fingerprint: each stage of a pipeline has its own copy of the same index)."""
    from mem1_core.retrieval.base import read_manifest

    resources = cfg.resources
    corpus = None if index is None else read_manifest(index).corpus_fingerprint
    return (
        resources.num_rollout_workers,
        resources.cpus_per_worker,
        resources.gpus_per_worker,
        resources.learner_cpus,
        resources.learner_gpus,
        resources.worker_memory_gb,
        resources.learner_memory_gb,
        resources.placement,
        resources.ray_address,
        backend,
        cfg.model.name_or_path,
        cfg.retrieval.kind,
        cfg.retrieval.url,
        corpus,
    )


def drop_state(actor: object) -> None:
    """Free an actor's models before it builds new ones: on a GPU, two policies (and a
    learner's optimiser states) at once may not fit."""
    actor.__dict__.clear()
    gc.collect()
    import torch  # here, not at the top: the flows import this module (see runs/layout.py)

    if torch.cuda.is_available():
        torch.cuda.empty_cache()
