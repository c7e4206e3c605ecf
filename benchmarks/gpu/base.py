"""What every section of the GPU check shares: the sizes it runs at (by device and --quick),
the arguments a section gets, a Qwen2-architecture model from config, synthetic trajectories."""

from __future__ import annotations

import copy
import random
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from benchmarks.common import Paths, synthetic_trajectories
from mem1_core.config import ModelConfig
from mem1_core.models.model import DTYPES, tiny_qwen2_config

Emit = Callable[[dict], None]
"""Where a section sends its rows (JSON-able dicts with "check", and "ok" where it passes or
fails)."""


TINY = ModelConfig(hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=128)
"""The CPU's model: the tiny profile's shape, halved."""


@dataclass(frozen=True)
class Sizes:
    """What each section runs on. The defaults are the CPU's; sizes_for picks by device and
    --quick."""

    vocab: int = 512
    """Vocabulary of the models from config (the last two ids: pad, eos)."""
    exact_model: ModelConfig = TINY
    """exactness: the model, its trajectories (MEM1; half as many full-context) and turns."""
    exact_trajectories: int = 2
    exact_turns: int = 3
    step_model: ModelConfig = TINY
    """train_step: the model and the trajectories of its batch (8 turns each)."""
    step_trajectories: int = 2
    prompt_len: int = 60
    """Mean segment lengths: prompt, generated turn, info block (exactness takes a quarter)."""
    gen_len: int = 12
    info_len: int = 30
    repeats: int = 3
    """train_step: timed steps per variant, after a warm-up (the best is reported)."""
    ppo_overrides: tuple[str, ...] = (
        "ppo.iterations=2",
        "ppo.tasks_per_iteration=8",
        "rollout.batch_size=8",
        "rollout.gen_tokens_base=16",
    )
    """ppo: config overrides on the smoke profile (and vllm_deployment's)."""
    stop_rows: int = 8
    """text_stops: rows of the batch that times the per-token stop check."""
    stop_tokens: int = 32
    """text_stops: tokens generated per row there."""


def sizes_for(device: str, quick: bool) -> Sizes:
    if device == "cpu":
        return Sizes(repeats=2 if quick else 3)
    # CUDA: head_dim 64 and sizes large enough that kernels, not launches, dominate.
    small = ModelConfig(
        hidden_size=512, num_layers=4, num_heads=8, num_kv_heads=4, intermediate_size=1536
    )
    step = ModelConfig(
        hidden_size=1024, num_layers=12, num_heads=16, num_kv_heads=8, intermediate_size=2816
    )
    ppo = (
        "ppo.iterations=3",
        "ppo.tasks_per_iteration=64",
        "ppo.minibatch_size=32",
        "ppo.micro_batch_size=16",
        "rollout.batch_size=64",
        "model.hidden_size=512",
        "model.num_layers=8",
        "model.num_heads=8",
        "model.num_kv_heads=4",
        "model.intermediate_size=1536",
        "model.dtype=bfloat16",
        "model.attn=flex_attention",
        "model.gradient_checkpointing=true",
        "resources.gpus_per_worker=0.5",
        "resources.learner_gpus=0.5",
    )
    return Sizes(
        vocab=4096,
        exact_model=small,
        exact_trajectories=4,
        exact_turns=6,
        step_model=step,
        step_trajectories=8,
        prompt_len=400,
        gen_len=200,
        info_len=300,
        ppo_overrides=("ppo.iterations=2", *ppo[1:]) if quick else ppo,
        stop_rows=64,
        stop_tokens=256,
    )


def qwen2(cfg: ModelConfig, vocab: int, attn: str, dtype: str, device: str, seed: int = 0):
    """A Qwen2-architecture causal LM from config (random weights), eval mode."""
    from transformers import Qwen2ForCausalLM

    qcfg = tiny_qwen2_config(cfg, vocab, pad_id=vocab - 1, eos_id=vocab - 2)
    qcfg.max_position_embeddings = 1 << 15
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM._from_config(qcfg, attn_implementation=attn, dtype=DTYPES[dtype])
    return model.to(device).eval()


def same_weights(model, attn: str, dtype: str | None = None):
    """A copy of `model` under another attention implementation (and dtype)."""
    other = copy.deepcopy(model)
    other.set_attn_implementation(attn)
    return other if dtype is None else other.to(DTYPES[dtype])


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


@dataclass(frozen=True)
class Check:
    """What a section runs with: `run(check)` in each module of this package."""

    device: str
    """"cuda" or "cpu"."""
    sizes: Sizes
    out: Path
    """The output directory (sections that train write their run directories here)."""
    emit: Emit
    prefect_python: str | None = None
    """vllm_deployment: the Prefect venv's Python (None: $MEM1_VENV or ./.venv)."""


def synthetic(
    memory: str, turns: int, n: int, vocab: int, lens: tuple[int, int, int], seed: int
) -> list[Paths]:
    """n trajectories of `turns` turns under a memory policy (`mem1`: prompt + last turn +
    last info; `full`: everything), segment lengths jittered +-25% around `lens`; the last
    two ids of `vocab` (pad, eos) are never drawn."""
    rng = random.Random(f"{seed}-{memory}-{turns}")
    return synthetic_trajectories(rng, memory, n, turns, lens, vocab - 2)
