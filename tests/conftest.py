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
    from mem1_core.data.world import generate_world

    return generate_world(small_world_config)


@pytest.fixture(scope="session")
def small_world_dir(small_world, tmp_path_factory):
    from mem1_core.data.world import write_world

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


@pytest.fixture(scope="session")
def small_tokenizer(small_world):
    from mem1_core.models.tokenizer import train_tiny_tokenizer

    return train_tiny_tokenizer(small_world.corpus["contents"].to_pylist(), 2400)


@pytest.fixture(scope="session")
def small_index(small_world_dir, tmp_path_factory):
    from mem1_core.retrieval import build_index, load_index

    out = tmp_path_factory.mktemp("index") / "bm25"
    build_index(small_world_dir / "corpus.parquet", "bm25", out, show_progress=False)
    return load_index(out)


@pytest.fixture(scope="session")
def small_tasks(small_world):
    from mem1_core.data.compose import compose
    from mem1_core.data.qa_data import world_questions
    from mem1_core.rollout.loop import tasks_from_table

    table, _ = compose(world_questions(small_world.questions).table, 2, split="test")
    return tasks_from_table(table)
