"""Policy models: the `tiny` Qwen2-architecture LM built from config, or any hub causal LM.

Weights are saved and loaded with `save_pretrained` / `from_pretrained` in safetensors only.
`from_config` mutates the config's attention setting, so configs are deep-copied first.
"""

from __future__ import annotations

import copy
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, PreTrainedModel, Qwen2Config, Qwen2ForCausalLM

from mem1_core.config import ModelConfig

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def tiny_qwen2_config(cfg: ModelConfig, vocab_size: int, pad_id: int, eos_id: int) -> Qwen2Config:
    return Qwen2Config(
        vocab_size=vocab_size,
        hidden_size=cfg.hidden_size,
        num_hidden_layers=cfg.num_layers,
        num_attention_heads=cfg.num_heads,
        num_key_value_heads=cfg.num_kv_heads,
        intermediate_size=cfg.intermediate_size,
        max_position_embeddings=cfg.max_positions,
        tie_word_embeddings=True,
        pad_token_id=pad_id,
        eos_token_id=eos_id,
        bos_token_id=None,
        rope_theta=10000.0,
    )


AUTOCAST_ATTR = "mem1_autocast"
"""The attribute by which a loaded model carries `model.autocast` (its compute dtype) to
whatever runs it: the generation backend, SFT and the learner (`compute_context`)."""


def set_compute(model: torch.nn.Module, cfg: ModelConfig) -> torch.nn.Module:
    """Record `cfg.autocast` on `model` (in place); returns it."""
    setattr(model, AUTOCAST_ATTR, cfg.autocast)
    return model


def model_autocast(model: torch.nn.Module) -> str | None:
    """The dtype `model` computes in under autocast, on the device it is on now: its recorded
    `model.autocast`, with `auto` resolved for this process and device
    (mem1_core.models.compute); None: in its weights' dtype."""
    from mem1_core.models.compute import resolve_autocast

    dtype = getattr(model, AUTOCAST_ATTR, None)
    if dtype is None:
        return None
    return resolve_autocast(dtype, next(model.parameters()).device.type)


def compute_context(model: torch.nn.Module):
    """torch.autocast in the model's `model.autocast` dtype on its device, else a null
    context. Weights stay as they are (float32 on CPU), so optimiser steps keep full precision."""
    import contextlib

    dtype = model_autocast(model)
    if dtype is None:
        return contextlib.nullcontext()
    device = next(model.parameters()).device
    return torch.autocast(device_type=device.type, dtype=DTYPES[dtype])


def build_tiny_model(cfg: ModelConfig, tokenizer) -> PreTrainedModel:
    """A freshly initialised Qwen2 model sized by `cfg`, its vocabulary the tokenizer's."""
    torch.manual_seed(cfg.seed)
    qcfg = tiny_qwen2_config(cfg, len(tokenizer), tokenizer.pad_token_id, tokenizer.eos_token_id)
    model = Qwen2ForCausalLM._from_config(
        copy.deepcopy(qcfg), attn_implementation=cfg.attn, dtype=DTYPES[cfg.dtype]
    )
    return set_compute(model.eval(), cfg)


WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json")
"""What a saved model directory holds its weights in: one file, or the index of shards."""


def check_model_dir(path: str | Path) -> Path:
    """`path` if it is a loadable model directory (config.json and safetensors weights),
    else a FileNotFoundError naming what is missing and where a policy comes from."""
    path = Path(path)
    fix = (
        "point at a policy that finished saving: a checkpoint's policy/ "
        "(<run>/checkpoints/iter_K/policy), an SFT output's policy/, or a save_pretrained directory"
    )
    if not (path / "config.json").is_file():
        raise FileNotFoundError(f"{path} is not a model directory (no config.json): {fix}")
    if not any((path / name).is_file() for name in WEIGHT_FILES):
        raise FileNotFoundError(
            f"{path} holds no weights (no {' or '.join(WEIGHT_FILES)}; .bin weights are "
            f"not read): {fix}"
        )
    return path


def load_model(name_or_path: str | Path, cfg: ModelConfig, tokenizer=None) -> PreTrainedModel:
    """A saved tiny model or any hub causal LM, its embedding table as it was saved.

    Nothing is resized: a hub tokenizer keeps MEM1's tags as text (mem1_core.models.tags), and
    a policy directory holds the embeddings of its own tokenizer. A tokenizer with ids beyond
    the table is not this model's (resizing would read those ids through random rows, as
    `mem1 rollout --policy-dir` once did: docs/design.md §8), so it is an error. A `.gguf`
    file or a shipped model's short name is read from its de-quantized cache
    (mem1_core.models.gguf)."""
    from mem1_core.models.gguf import resolve_pretrained

    name_or_path = resolve_pretrained(name_or_path)
    if Path(name_or_path).exists():  # a local directory, not a hub name
        check_model_dir(name_or_path)
    model = AutoModelForCausalLM.from_pretrained(
        str(name_or_path),
        dtype=DTYPES[cfg.dtype],
        attn_implementation=cfg.attn,
        use_safetensors=True,
    )
    rows = model.get_input_embeddings().num_embeddings
    if tokenizer is not None and len(tokenizer) > rows:
        raise ValueError(
            f"the tokenizer has {len(tokenizer)} tokens but {name_or_path} has {rows} embedding "
            "rows: load the tokenizer saved with this model (load_tokenizer on its directory)"
        )
    return set_compute(model.eval(), cfg)


def save_model(model: PreTrainedModel, tokenizer, out_dir: str | Path) -> Path:
    """save_pretrained for model and tokenizer (safetensors), atomically."""
    from mem1_core.runs.atomic import atomic_dir

    with atomic_dir(out_dir) as tmp:
        model.save_pretrained(tmp, safe_serialization=True)
        if tokenizer is not None:
            tokenizer.save_pretrained(tmp)
    return Path(out_dir)


def master_weights(model: torch.nn.Module, dtype: str):
    """Train a low-precision model on float32 master weights: casts `model`'s parameters to
    float32 in place and returns the autocast context that computes in `dtype` on the
    model's device (a null context for float32).

    Why: an AdamW step is about lr in size; at the paper's actor lr of 1e-6 that is far
    below half of bf16's rounding step for a weight of typical size (2^-8 relative), so
    bf16 parameters updated in place mostly do not change at all."""
    if DTYPES[dtype] == torch.float32:
        return compute_context(model)  # float32 weights, computing as `model.autocast` says
    model.float()
    device = next(model.parameters()).device
    return torch.autocast(device_type=device.type, dtype=DTYPES[dtype])


def enable_gradient_checkpointing(model: torch.nn.Module) -> torch.nn.Module:
    """Hugging Face activation checkpointing (non-reentrant) on every decoder layer of a
    causal LM or a bare transformer (a critic's backbone), in place; returns the model.

    Hugging Face checkpoints a layer only while that layer is in training mode, but the
    learner keeps its models in eval mode (mem1_core.rl.ppo: the PPO ratio must compare the
    function that sampled). So only the decoder layer modules themselves are flagged as
    training, not their children: attention dropout (and any other) stays off, the layers
    compute exactly what they compute in eval mode, and they are recomputed in backward.
    Checkpointing engages only with gradients on, so no-grad passes (scoring, generation)
    run as before, KV cache included. A later `model.eval()` turns it off again."""
    from transformers.modeling_layers import GradientCheckpointingLayer

    model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    for module in model.modules():
        if isinstance(module, GradientCheckpointingLayer):
            module.training = True  # this module only: nn.Module.train() would recurse
    return model


def is_checkpointing(model: torch.nn.Module) -> bool:
    """True if `enable_gradient_checkpointing` is in effect on some layer of `model`."""
    from transformers.modeling_layers import GradientCheckpointingLayer

    return any(
        isinstance(m, GradientCheckpointingLayer) and m.gradient_checkpointing and m.training
        for m in model.modules()
    )


def count_parameters(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())
