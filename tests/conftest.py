"""Shared fixtures: a small world generated once per session (the smoke profile's size), and
how pytest-xdist workers share the tests (modules whole; those that share a server together)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
if os.environ.get("PYTEST_XDIST_WORKER"):
    # Under `-n 2` two workers share the cores: torch on every core in each would wait at
    # OpenMP's barriers for a thread the other worker's process holds (docs/performance.md,
    # "Threads"). One thread each, set before torch loads; children inherit it.
    os.environ.setdefault("OMP_NUM_THREADS", "1")

SERVER_MODULES = {
    "test_e2e_deployment.py",
    "test_experiment_deployment.py",
    "test_launch_follow.py",
}
"""The modules that share the test Prefect server's work pool, deployments and worker (one
module's fixture; the others use it or the pool): scheduled as one unit, one test at a time."""


@pytest.hookimpl(optionalhook=True)  # a hook of pytest-xdist: absent under -p no:xdist
def pytest_xdist_make_scheduler(config, log):
    """`./dev test` runs pytest-xdist with `--dist loadfile`: a module's tests run on one
    worker, so its fixtures (a loaded SmolLM2, a trained tiny base) are built once, and the
    SERVER_MODULES run on one worker as one unit. (xdist's own `loadgroup` marks are
    ignored under pytest 9.2, which no longer reads the node id xdist rewrites.) `ray start`
    clusters live in test_cluster.py alone; other Ray tests start private ones."""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class ModuleScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            module = nodeid.split("::", 1)[0]
            return "prefect-server" if Path(module).name in SERVER_MODULES else module

    return ModuleScheduling(config, log)


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

    server = {i.path.name for i in items if i.get_closest_marker("server")}
    unshared = sorted(server - SERVER_MODULES)
    if unshared:  # they would meet the server unit's pool and worker on another xdist worker
        raise pytest.UsageError(f"tests/conftest.py SERVER_MODULES lacks {unshared}")
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


# ---- a stand-in for a pretrained hub model (its tags stay text) ---------------------------


@pytest.fixture(scope="session")
def hub_tokenizer(small_world, small_tasks):
    """A byte-level BPE with Qwen2.5's pre-tokenizer (a few hundred merges) trained on the
    world's text, the task prompts and some lines that use the tags, as web text would: the
    tags end up as a few tokens each (`</`, `query`, `>` or `>.\n`), never one."""
    from mem1_core.models.tokenizer import train_byte_level_tokenizer

    titles = small_world.corpus["title"].to_pylist()[:60]
    lines = [f"<IS> Q1: {t}. </IS><answer> {t}</answer>.\n" for t in titles[:30]]
    lines += [f"<IS> Start. </IS><query> {t} </query>\n" for t in titles[30:]]
    texts = small_world.corpus["contents"].to_pylist() + [t.prompt for t in small_tasks] + lines
    return train_byte_level_tokenizer(texts, 800)


@pytest.fixture(scope="session")
def hub_model_config():
    from mem1_core.config import ModelConfig

    # head_dim 32: the smallest vLLM's CPU attention supports (tests/test_vllm_backend.py)
    return ModelConfig(
        hidden_size=64, num_layers=2, num_heads=2, num_kv_heads=1, intermediate_size=128
    )


@pytest.fixture(scope="session")
def hub_dir(hub_tokenizer, hub_model_config, tmp_path_factory):
    """A Qwen2-architecture model built from config with the hub tokenizer's vocabulary, and
    that tokenizer, saved with save_pretrained as a hub checkpoint is: the tokenizer's class is
    the model family's (Qwen2Tokenizer), so it loads through AutoTokenizer."""
    import json

    from mem1_core.models.model import build_tiny_model

    out = tmp_path_factory.mktemp("hub") / "qwen2-standin"
    build_tiny_model(hub_model_config, hub_tokenizer).save_pretrained(out, safe_serialization=True)
    hub_tokenizer.save_pretrained(out)
    config = out / "tokenizer_config.json"
    meta = json.loads(config.read_text())
    config.write_text(json.dumps({**meta, "tokenizer_class": "Qwen2Tokenizer"}))
    return out


RECITED = (
    # context, what the model writes after it (on past the closing tag, so that only a stop
    # ends the turn there), the action and its text, what the closing tag's last token carries
    ("Question 1: Who wrote it?\n", "<IS> Start. </IS><query> Kalo Vesh </query>\nQ2: and")
    + ("query", "Kalo Vesh", "\n"),
    ("Question 1: In what year?\n", "<IS> Q1: 1874. </IS><answer> 1874</answer>.\nQ2: more")
    + ("answer", "1874", ".\n"),
)


@pytest.fixture(scope="session")
def hub_reciter(hub_dir, hub_model_config):
    """The hub stand-in trained until greedy decoding continues each context of RECITED with
    its script: stops are then checked in real generation. -> (model, cases)."""
    from types import SimpleNamespace

    import torch

    from mem1_core.models.model import load_model
    from mem1_core.models.tokenizer import load_tokenizer

    tok = load_tokenizer(hub_dir)
    enc = lambda t: tok.encode(t, add_special_tokens=False)  # noqa: E731
    cases = [
        SimpleNamespace(context=enc(c), script=enc(s), action=a, text=t, tail=tail)
        for c, s, a, t, tail in RECITED
    ]
    torch.manual_seed(0)
    model = load_model(hub_dir, hub_model_config, tok).train()
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    for step in range(400):
        c = cases[step % len(cases)]
        logits = model(input_ids=torch.tensor([c.context + c.script])).logits[0]
        target = torch.tensor(c.script)
        loss = torch.nn.functional.cross_entropy(logits[len(c.context) - 1 : -1], target)
        opt.zero_grad()
        loss.backward()
        opt.step()
    return model.eval(), cases


MALFORMED_TURNS = [
    ("just words", "needs exactly one <IS>"),
    ("<IS> a </IS> words", "no action"),
    ("<IS> a </IS><query> x <answer> y </answer>", "both a query and an answer"),
    ("<IS> a </IS><query>  </query>", "empty query"),
    ("<IS> a <IS> b </IS><query> x </query>", "needs exactly one <IS>"),
    ("<query> x </query><IS> a </IS>", "tags out of order"),
    ("<IS> a </IS><query> x </query> more", "tags out of order"),
]
"""(turn text, the rule its parse names) for every rule a malformed turn breaks: the
environment's contract under both tag schemes (test_rollout, test_text_tags)."""


@pytest.fixture
def ray_cleanup():
    """Skips without Ray; shuts down a Ray the test started (a local cluster outlives a test)."""
    ray = pytest.importorskip("ray")
    yield
    if ray.is_initialized():
        ray.shutdown()


def load_benchmark(name: str):
    """benchmarks/<name>.py as a module (the scripts are run by path, not imported as a
    package), under a name of its own so a test never shares it with another."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "benchmarks" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"{name}_under_test", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod
