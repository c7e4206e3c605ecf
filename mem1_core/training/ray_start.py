"""Ray start-up and where an actor runs: connect to a cluster or start a private local Ray
sized for the run's actors; an actor's device and torch threads.

A private Ray is private: without `resources.ray_address` the run starts a new local
instance (Ray's `address="local"`) even where `ray start` left a cluster running, or its
record behind (`/tmp/ray/ray_current_cluster`, `RAY_ADDRESS`), which a plain `ray.init()`
would join. `resources.ray_address=auto` joins that cluster on purpose."""

from __future__ import annotations

import logging
import math
import os

import torch

from mem1_core.config import ResourcesConfig
from mem1_core.training.placement import run_demands

log = logging.getLogger(__name__)

LOCAL_START_ATTEMPTS = 3
"""Tries to start the private local Ray. On a loaded machine its raylet can miss Ray's fixed
30 s start-up wait (it waits for the dashboard agent's port file and aborts: "The current node
timed out during startup"): 4 of 6 starts on this 2-core machine, beside other Ray jobs, while
the vLLM rollout workers were built. The run then fails before any work; a fresh start gets another chance."""


def actor_device(gpus: float) -> torch.device:
    return torch.device("cuda" if gpus > 0 and torch.cuda.is_available() else "cpu")


def set_threads(threads: int | None) -> None:
    if threads:
        torch.set_num_threads(threads)


def start_ray(resources: ResourcesConfig, *, log_to_driver: bool = False) -> bool:
    """Connect to `resources.ray_address`, or start a private local Ray sized for the actors.
    Returns True if this call started (and so should shut down) Ray. Whether the cluster can
    hold the run is mem1_core.training.placement's check, made before any actor starts."""
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
        return True
    # A private cluster living as long as this run, on localhost, dashboard off: token
    # auth (Ray's default) would only write a token file. Set RAY_AUTH_MODE to override.
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    need = sum(d.resources.get("CPU", 0.0) for d in run_demands(resources, retriever=True))
    for attempt in range(1, LOCAL_START_ATTEMPTS + 1):
        try:
            ray.init(
                address="local",  # never the cluster `ray start` recorded on the machine
                num_cpus=max(os.cpu_count() or 1, math.ceil(need)),
                include_dashboard=False,
                log_to_driver=log_to_driver,
                configure_logging=False,
            )
            return True
        except Exception as e:  # Ray raises a bare Exception for this
            if "timed out during startup" not in str(e) or attempt == LOCAL_START_ATTEMPTS:
                raise
            log.warning("the local Ray did not come up (%s); starting it again", e)
            ray.shutdown()
    raise AssertionError("unreachable")
