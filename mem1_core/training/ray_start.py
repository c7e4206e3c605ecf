"""Ray start-up and where an actor runs: connect to a cluster or start a private local Ray
sized for the run's actors; an actor's device and torch threads."""

from __future__ import annotations

import math
import os

import torch

from mem1_core.config import ResourcesConfig

RETRIEVER_CPUS = 1.0
"""Logical CPUs the retriever actor asks for (BM25 is light; a dense encoder is not)."""


def actor_device(gpus: float) -> torch.device:
    return torch.device("cuda" if gpus > 0 and torch.cuda.is_available() else "cpu")


def set_threads(threads: int | None) -> None:
    if threads:
        torch.set_num_threads(threads)


def start_ray(resources: ResourcesConfig, *, log_to_driver: bool = False) -> bool:
    """Connect to `resources.ray_address`, or start a private local Ray sized for the actors.
    Returns True if this call started (and so should shut down) Ray."""
    import ray

    if ray.is_initialized():
        return False
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    # Under `uv run`, Ray would rebuild the venv in every worker; the package is installed.
    os.environ.setdefault("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "0")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    if resources.ray_address:
        ray.init(
            address=resources.ray_address, log_to_driver=log_to_driver, configure_logging=False
        )
    else:
        # A private cluster living as long as this run, on localhost, dashboard off: token
        # auth (Ray's default) would only write a token file. Set RAY_AUTH_MODE to override.
        os.environ.setdefault("RAY_AUTH_MODE", "disabled")
        need = (
            resources.num_rollout_workers * resources.cpus_per_worker
            + resources.learner_world * resources.learner_cpus
            + RETRIEVER_CPUS
        )
        ray.init(
            num_cpus=max(os.cpu_count() or 1, math.ceil(need)),
            include_dashboard=False,
            log_to_driver=log_to_driver,
            configure_logging=False,
        )
    gpus = ray.cluster_resources().get("GPU", 0.0)
    if max(resources.gpus_per_worker, resources.learner_gpus) > gpus:
        ray.shutdown()
        raise ValueError(
            f"resources.gpus_per_worker={resources.gpus_per_worker} / resources.learner_gpus={resources.learner_gpus} "
            f"but the Ray cluster has {gpus:g} GPUs; set them to 0 on a CPU machine"
        )
    return True
