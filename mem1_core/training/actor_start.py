"""Starting a training run's actors (mem1_core.training.runtime.Runtime): the rollout
workers, the learner (or its FSDP ranks) and the retriever as Ray actors, or the workers and
the learner as plain objects in this process (`use_ray=False`).

On a laptop everything shares one local Ray with CPU resources; the resource requests come
from `ResourcesConfig`, so the same code asks for GPUs on a cluster (`resources.ray_address`).
Actors are reused across the runs of a pipeline inside `actor_pool.reuse_actors()`.

Placement (mem1_core.training.placement). Before any actor starts, the run's actors are
checked against the cluster (a run it can never hold fails at once, a busy one waits, with a
line, up to `resources.wait_seconds`) and reserved as placement groups; on more than one node
the run directory must be shared (checked). Each actor is started in its bundle. A rollout
worker may restart `WORKER_RESTARTS` times (the driver redoes its share, Runtime.collect); the
retriever `RETRIEVER_RESTARTS` times, its interrupted searches retried.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from mem1_core.config import Config, ResourcesConfig
from mem1_core.runs.layout import RunPaths
from mem1_core.training import actor_pool
from mem1_core.training.learner import Learner
from mem1_core.training.placement import RETRIEVER_CPUS, memory_option, place_run, run_demands
from mem1_core.training.ray_start import start_ray
from mem1_core.training.runtime import WORKER_RESTARTS, Runtime
from mem1_core.training.vllm_engine import choose_backend, require_vllm, rollout_workers_env
from mem1_core.training.workers import RolloutWorker

log = logging.getLogger(__name__)
RETRIEVER_RESTARTS = 3
"""Times Ray restarts the retriever actor (it only reads its index) and retries a search
that its death interrupted, e.g. with the node it ran on."""


def worker_options(resources: ResourcesConfig, runtime_env: dict | None) -> dict[str, Any]:
    """Ray actor options of a rollout worker; `runtime_env` (another Python for vLLM,
    rollout_python.rollout_runtime_env) only when given."""
    options: dict[str, Any] = dict(
        num_cpus=resources.cpus_per_worker,
        num_gpus=resources.gpus_per_worker,
        max_restarts=WORKER_RESTARTS,  # the driver retries the call (`Runtime._rollout_share`)
    )
    options |= memory_option(resources.worker_memory_gb)
    if runtime_env is not None:
        options["runtime_env"] = runtime_env
    return options


def start_runtime(
    cfg: Config,
    paths: RunPaths,
    *,
    init: Path | None,
    use_ray: bool = True,
    log_to_driver: bool = False,
) -> Runtime:
    """Start a run's actors: rollout workers, learner (or FSDP ranks) and retriever as Ray
    actors on the placement groups reserved for them, or parked ones of an earlier run of the
    same shape (reset for this one); with `use_ray=False`, workers and learner as plain objects
    in this process."""
    init_s = None if init is None else str(init)
    resources, root = cfg.resources, str(paths.root)
    fsdp = resources.learner_strategy == "fsdp"
    if fsdp and not use_ray:
        raise ValueError(
            "resources.learner_strategy=fsdp runs each learner rank as a Ray actor: run with Ray "
            "(drop --no-ray), or use resources.learner_strategy=single"
        )
    backend = choose_backend(cfg, use_ray=use_ray)  # once, for every worker
    # Before Ray starts, not as an actor's constructor error: the vLLM venv's Python for
    # the workers when this one has no vLLM (checked against this one), or the way out.
    worker_env = rollout_workers_env(cfg, use_ray, backend)
    require_vllm(backend, elsewhere=worker_env is not None)
    if not use_ray:
        workers = [
            RolloutWorker(cfg, root, init_s, backend=backend)
            for _ in range(resources.num_rollout_workers)
        ]
        return Runtime(workers, [Learner(cfg, root, init_s)], remote=False)
    import ray

    from mem1_core.domains.registry import domain_of
    from mem1_core.retrieval.ray_actor import start_retriever_actor

    domain = domain_of(cfg)
    index = domain.ensure_index(cfg, paths) if domain.uses_index(cfg) else None
    # Not reused: an FSDP group (its process group) and vLLM engines (a second engine in
    # the same process would not get the first one's GPU memory back).
    reusable = not fsdp and backend != "vllm"
    key = actor_pool.reuse_key(cfg, index, backend) if reusable else None
    if key is not None and (parked := actor_pool.take(key)) is not None:
        try:
            parked.reset(cfg, root, init_s, backend)
            return parked
        except Exception:  # noqa: BLE001 - a dead actor: start afresh instead
            log.warning("parked Ray actors could not be reset; starting new ones", exc_info=True)
            parked.shutdown(park=False)
    owns = start_ray(resources, log_to_driver=log_to_driver)
    # Before any actor: can the cluster hold the run (now or once it is less busy), and
    # does every node it uses see the run directory?
    demands = run_demands(resources, retriever=index is not None)
    try:
        inputs = [p for p in (init, index) if p is not None]
        placement = place_run(resources, demands, [paths.root, *inputs])
    except BaseException:
        if owns:
            ray.shutdown()
        raise
    retriever = None
    if index is not None:  # else an HTTP retriever is already shared
        retriever = start_retriever_actor(
            index,
            num_cpus=RETRIEVER_CPUS,
            actor_options=dict(
                max_restarts=RETRIEVER_RESTARTS,
                max_task_retries=RETRIEVER_RESTARTS,  # a search only reads: safe to redo
                **placement.options("retriever"),
            ),
        )
    options = worker_options(resources, worker_env)
    threads = max(1, int(resources.cpus_per_worker))
    workers = [
        ray.remote(RolloutWorker)
        .options(**options, **placement.options(f"rollout_worker_{i}"))
        .remote(cfg, root, init_s, retriever, threads, backend)
        for i in range(resources.num_rollout_workers)
    ]
    runtime = Runtime(
        workers, [], remote=True, owns_ray=owns, retriever=retriever, placement=placement
    )
    runtime.reuse_key, runtime.demands = key, demands
    try:
        if fsdp:  # waits until the group has formed and loaded its shards
            from mem1_core.training.fsdp_learner import start_learner_group

            ranks = [placement.options(f"learner_rank_{r}") for r in range(resources.learner_world)]
            runtime.learners = start_learner_group(cfg, root, init_s, ranks)
        else:
            learner = (
                ray.remote(Learner)
                .options(
                    num_cpus=resources.learner_cpus,
                    num_gpus=resources.learner_gpus,
                    **memory_option(resources.learner_memory_gb),
                    **placement.options("learner"),
                )
                .remote(cfg, root, init_s, max(1, int(resources.learner_cpus)))
            )
            runtime.learners = [learner]
    except BaseException:
        runtime.shutdown()
        raise
    return runtime
