"""The shipped base model of the embedded default (`data/base/`): where it is, what it must
agree with, and the refusal when it does not.

The base is the analogue of the pretrained LLM the paper starts from (mem1_core.training.
pretrain builds it). A base holds weights, its tokenizer and `manifest.json` (the command
that built it, its config, the code commit, the tokenizer's hash, the world seeds, its
training curve and held-out figures). Before anything reads it, `check_base` compares the
manifest with the current code: the tokenizer files must still hash to the manifest's
value, and the format (tags, task instructions, the environment's hints, FORMAT_VERSION)
must be the one the code writes today. A mismatch is refused with the command that
rebuilds the base: a model that reads another format than the one it was trained on
silently scores 0.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

MANIFEST = "manifest.json"
FORMAT_VERSION = 2
"""Bump when the prompt, the tags, the hints or the teacher's writing change, so that an
older base is refused instead of read in a format it was not trained on."""

REPO_ROOT = Path(__file__).resolve().parents[2]
REBUILD = (
    "rebuild it with `mem1 pretrain --profile tiny --out runs/pretrain` (docs/training.md, 'The "
    "pretrained base'; hours on 2 cores) and copy runs/pretrain/base to data/base, or train "
    "from scratch with `--set model.base=null`"
)


class BaseMismatch(ValueError):
    """The base on disk does not fit the current code (or is not a base at all)."""


def tokenizer_hash(tok) -> str:
    """A stable fingerprint of a tokenizer: its vocabulary and its special tokens."""
    blob = json.dumps(
        {"vocab": sorted(tok.get_vocab().items()), "special": sorted(tok.all_special_tokens)}
    )
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def format_fingerprint() -> dict:
    """What a base must agree with to read and write the format the code uses now."""
    from mem1_core.data.prompts import FORMAT_HINT, TAGS, task_prompt, turns_left_hint

    prompt = task_prompt(["A?", "B?"])  # the instructions and the prompt's template
    text = "\n".join([prompt, turns_left_hint(3), turns_left_hint(1), FORMAT_HINT])
    return {
        "format_version": FORMAT_VERSION,
        "tags": list(TAGS),
        "text_sha": hashlib.sha256(text.encode()).hexdigest()[:16],
    }


def resolve_base(path: str | Path) -> Path:
    """A base path as given, or relative to the repository (`data/base` from anywhere)."""
    p = Path(path).expanduser()
    if not p.is_absolute() and not p.exists() and (REPO_ROOT / p).exists():
        p = REPO_ROOT / p
    return p.resolve()


def check_base(path: str | Path) -> dict:
    """The base's manifest, after checking weights, tokenizer and format against the code.
    Raises BaseMismatch, naming the file and how to rebuild."""
    from mem1_core.models.tokenizer import load_tokenizer

    base = resolve_base(path)
    manifest_file = base / MANIFEST
    if not manifest_file.is_file():
        raise BaseMismatch(f"{manifest_file}: no base manifest there; {REBUILD}")
    manifest = json.loads(manifest_file.read_text())
    if not (base / "model.safetensors").is_file():
        raise BaseMismatch(f"{base}: the base has no model.safetensors; {REBUILD}")
    tok = load_tokenizer(base)
    if tokenizer_hash(tok) != manifest.get("tokenizer_sha"):
        raise BaseMismatch(
            f"{base}: its tokenizer hashes to {tokenizer_hash(tok)}, the manifest says "
            f"{manifest.get('tokenizer_sha')} (a changed tokenizer reads other ids); {REBUILD}"
        )
    want, have = format_fingerprint(), manifest.get("format")
    if have != want:
        raise BaseMismatch(
            f"{base} was trained on format {have}, the code writes {want} (the prompt, "
            f"tags or hints changed since); {REBUILD}"
        )
    return manifest
