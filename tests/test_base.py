"""The pretrained base of the embedded default: built by `mem1 pretrain`, refused when it does
not fit the code, and the shipped one (data/base) loads and plays."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from mem1_core.config import load_config
from mem1_core.models.base import (
    MANIFEST,
    REPO_ROOT,
    BaseMismatch,
    check_base,
    format_fingerprint,
    tokenizer_hash,
)

SHIPPED = REPO_ROOT / "data" / "base"


def _fake_base(out: Path, tokenizer) -> Path:
    """A base as `pretrain` leaves it: weights, tokenizer and a manifest of the current code."""
    from mem1_core.models.model import build_tiny_model, save_model

    model = build_tiny_model(load_config("smoke").model, tokenizer)
    save_model(model, tokenizer, out)
    manifest = {"tokenizer_sha": tokenizer_hash(tokenizer), "format": format_fingerprint()}
    (out / MANIFEST).write_text(json.dumps(manifest))
    return out


def test_a_base_of_the_current_code_passes_its_checks(small_tokenizer, tmp_path):
    base = _fake_base(tmp_path / "base", small_tokenizer)
    assert check_base(base)["tokenizer_sha"] == tokenizer_hash(small_tokenizer)


@pytest.mark.parametrize(
    "tamper, says",
    [
        (lambda m: m.update(tokenizer_sha="0" * 16), "tokenizer hashes"),
        (lambda m: m["format"].update(format_version=0), "format"),
        (lambda m: m["format"].update(tags=["<search>"]), "format"),
        (lambda m: m["format"].update(text_sha="x"), "format"),
    ],
)
def test_a_mismatched_base_is_refused_with_how_to_rebuild(small_tokenizer, tmp_path, tamper, says):
    base = _fake_base(tmp_path / "base", small_tokenizer)
    manifest = json.loads((base / MANIFEST).read_text())
    tamper(manifest)
    (base / MANIFEST).write_text(json.dumps(manifest))
    with pytest.raises(BaseMismatch, match=says) as err:
        check_base(base)
    assert "mem1 pretrain" in str(err.value) and "model.base=null" in str(err.value)


def test_a_directory_without_a_manifest_or_weights_is_refused(small_tokenizer, tmp_path):
    with pytest.raises(BaseMismatch, match="no base manifest"):
        check_base(tmp_path)
    base = _fake_base(tmp_path / "base", small_tokenizer)
    (base / "model.safetensors").unlink()
    with pytest.raises(BaseMismatch, match="no model.safetensors"):
        check_base(base)


def test_a_run_with_a_base_adopts_its_tokenizer_and_refuses_another(small_tokenizer, tmp_path):
    from mem1_core.domains.inputs import ensure_tokenizer
    from mem1_core.models.tokenizer import train_tiny_tokenizer
    from mem1_core.runs.layout import RunPaths

    base = _fake_base(tmp_path / "base", small_tokenizer)
    cfg = load_config("smoke", overrides=[f"model.base={base}"])
    tok = ensure_tokenizer(cfg, RunPaths(tmp_path / "run"))
    assert tok.get_vocab() == small_tokenizer.get_vocab()
    # a run directory that already holds another tokenizer is an error, not a silent mix
    other = train_tiny_tokenizer(["Kovar Masun lived in 1742."] * 50, 700)
    other.save_pretrained(tmp_path / "run2" / "tokenizer")
    with pytest.raises(ValueError, match="another tokenizer"):
        ensure_tokenizer(cfg, RunPaths(tmp_path / "run2"))


@pytest.mark.skipif(not (SHIPPED / MANIFEST).exists(), reason="no shipped base in data/base")
def test_the_shipped_base_loads_and_plays(tmp_path):
    """The base in data/base fits the code and answers held-out single-objective questions of
    a world it never saw (smoke-sized, seed 777) in the format, from what it retrieves."""
    from mem1_core.domains.inputs import ensure_tokenizer, load_tasks, make_env, prepare
    from mem1_core.evaluation.evaluate import evaluate_policy
    from mem1_core.models.policy import initial_policy

    manifest = check_base(SHIPPED)
    assert manifest["steps"] > 0 and manifest["held_out"]
    cfg = load_config(
        "smoke",
        overrides=["model.base=data/base", "world.seed=777", "data.max_eval_tasks=32"],
    )
    paths = prepare(cfg, tmp_path / "run")
    tok = ensure_tokenizer(cfg, paths)
    model = initial_policy(cfg, tok)
    tasks = load_tasks(cfg, paths, "test", 1)[:32]
    m = evaluate_policy(model, tok, make_env(cfg, paths, tok), tasks, cfg.rollout, memory="mem1")
    assert m["format_error_rate"] < 0.2
    assert m["answered_rate"] > 0.8
    assert m["em_frac"] > 0.1  # an untrained model of this size scores 0
    shutil.rmtree(tmp_path / "run")
