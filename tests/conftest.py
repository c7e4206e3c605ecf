"""Shared fixtures: a small world generated once per session (the smoke profile's size)."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@pytest.fixture(scope="session")
def small_world_config():
    from mem1_core.config import load_config

    return load_config("smoke").world


@pytest.fixture(scope="session")
def small_world(small_world_config):
    from mem1_core.world import generate_world

    return generate_world(small_world_config)


@pytest.fixture(scope="session")
def small_world_dir(small_world, tmp_path_factory):
    from mem1_core.world import write_world

    out = tmp_path_factory.mktemp("world")
    write_world(small_world, out)
    return out


def pytest_collection_modifyitems(config, items):
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs CUDA")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
