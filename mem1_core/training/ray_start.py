"""Ray start-up and where an actor runs: connect to a cluster or start a private local Ray
sized for the run's actors; an actor's device and torch threads."""

from __future__ import annotations

import logging
import math
import os

import torch

from mem1_core.config import ResourcesConfig

log = logging.getLogger(__name__)

RETRIEVER_CPUS = 1.0
"""Logical CPUs the retriever actor asks for (BM25 is light; a dense encoder is not)."""
LOCAL_START_ATTEMPTS = 3
"""Tries to start the private local Ray. On a loaded machine its raylet can miss Ray's fixed
30 s start-up wait (it waits for the dashboard agent's port file and aborts: "The current node
timed out during startup"): 4 of 6 starts on this 2-core machine, beside other Ray jobs, while
issue 15 was built. The run then fails before any work; a fresh start gets another chance."""


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
        for attempt in range(1, LOCAL_START_ATTEMPTS + 1):
            try:
                ray.init(
                    num_cpus=max(os.cpu_count() or 1, math.ceil(need)),
                    include_dashboard=False,
                    log_to_driver=log_to_driver,
                    configure_logging=False,
                )
                break
            except Exception as e:  # Ray raises a bare Exception for this
                if "timed out during startup" not in str(e) or attempt == LOCAL_START_ATTEMPTS:
                    raise
                log.warning("the local Ray did not come up (%s); starting it again", e)
                ray.shutdown()
    gpus = ray.cluster_resources().get("GPU", 0.0)
    if max(resources.gpus_per_worker, resources.learner_gpus) > gpus:
        ray.shutdown()
        raise ValueError(
            f"resources.gpus_per_worker={resources.gpus_per_worker} / resources.learner_gpus={resources.learner_gpus} "
            f"but the Ray cluster has {gpus:g} GPUs; set them to 0 on a CPU machine"
        )
    return True
