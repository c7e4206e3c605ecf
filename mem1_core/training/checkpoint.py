"""Training checkpoints, written atomically (docs/design.md §4.7).

A checkpoint is a directory `<root>/iter_{K:06d}` holding the state after K completed
iterations (0..K-1); a resumed run continues with iteration K:

    policy/          save_pretrained (safetensors) + the tokenizer, loadable on its own
    critic/          the critic (mem1_core.rl.critic), if the run has one
    optimizer.pt     torch.save of every optimiser's state_dict (an FSDP learner's: the
                     full one, keyed by parameter name; mem1_core.training.fsdp_learner);
                     only in the newest checkpoint (`drop_optimizer`)
    rng.pt           torch (CPU and CUDA), Python and NumPy RNG states
    config.json      the run's Config
    state.json       iteration counter, elapsed time, counters the loop carries on
    manifest.json    the size and sha256 of every other file (written last)

It is written into a temporary sibling directory and renamed into place (`io.atomic_dir`),
so a checkpoint that exists is complete, whatever moment a SIGKILL chose. Only the newest
`keep` are kept. Everything is read back with `torch.load(weights_only=True)`: RNG states
are stored as tensors and plain Python values, not as pickled NumPy objects.

A complete checkpoint can still go bad afterwards: a disk that truncates or flips bits, a
copy cut short. The manifest's checksums catch that: `load_checkpoint` refuses a
checkpoint whose files do not match, and a resume takes the newest checkpoint that does
(`latest_intact_checkpoint`), moving bad ones aside to `iter_K.corrupt` with a warning
that names the file. Checkpoints written before the manifest existed still load, with a
warning that they are unverified. Hashing reads every byte once more per save and load:
about a second per GB, small beside writing a paper-scale checkpoint.
"""

from __future__ import annotations

import json
import logging
import random
import shutil
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import save_file
from torch import nn

from mem1_core.rl.critic import VALUE_HEAD_FILE, Critic
from mem1_core.runs.atomic import atomic_dir, file_sha256, write_json
from mem1_core.runs.layout import (
    CORRUPT_SUFFIX,
    PREFIX,
    STATE_FILE,
    checkpoint_name,
    latest_checkpoint,  # noqa: F401  (its home is layout; importable from here as before)
    list_checkpoints,
)

MANIFEST_FILE = "manifest.json"
MANIFEST_VERSION = 1
log = logging.getLogger(__name__)


class CorruptCheckpoint(ValueError):
    """A checkpoint's files do not match the checksums in its manifest."""


@dataclass(frozen=True)
class TrainState:
    """What the training loop carries across a restart, besides weights and optimisers."""

    iteration: int
    """Completed iterations; the next one to run."""
    elapsed_seconds: float = 0.0
    """Training wall time so far, summed over restarts (for the `ppo.minutes` budget)."""
    extra: dict[str, Any] = field(default_factory=dict)
    """JSON-able counters and identifiers (non-finite counts, estimator, init, W&B id)."""


# ---- integrity -------------------------------------------------------------------------------


def write_manifest(ckpt: Path) -> Path:
    """Record the size and sha256 of every file under `ckpt` in its manifest.json."""
    files = {
        p.relative_to(ckpt).as_posix(): {"bytes": p.stat().st_size, "sha256": file_sha256(p)}
        for p in sorted(ckpt.rglob("*"))
        if p.is_file() and p.name != MANIFEST_FILE
    }
    return write_json({"format_version": MANIFEST_VERSION, "files": files}, ckpt / MANIFEST_FILE)


def checkpoint_problems(path: str | Path) -> list[str] | None:
    """What is wrong with checkpoint `path` against its manifest: [] if every file matches,
    None if it has no manifest (written before checksums existed). Sizes are compared
    first, so a truncated file is named as such without hashing the rest."""
    path = Path(path)
    try:
        manifest = json.loads((path / MANIFEST_FILE).read_text())
        files = manifest["files"]
    except FileNotFoundError:
        return None
    except (ValueError, KeyError, TypeError) as e:
        return [f"{MANIFEST_FILE} is unreadable ({type(e).__name__}: {e})"]
    problems = []
    for rel, want in files.items():
        p = path / rel
        if not p.is_file():
            problems.append(f"{rel} is missing")
        elif (size := p.stat().st_size) != want["bytes"]:
            cut = " (truncated)" if size < want["bytes"] else ""
            problems.append(f"{rel} has {size} bytes, the manifest {want['bytes']}{cut}")
        elif file_sha256(p) != want["sha256"]:
            problems.append(f"{rel} does not match its sha256 in {MANIFEST_FILE} (corrupted)")
    return problems


def verify_checkpoint(path: str | Path) -> None:
    """Raise CorruptCheckpoint naming the bad file(s) if `path` fails its checksums; warn if
    it has none to check."""
    problems = checkpoint_problems(path)
    if problems is None:
        log.warning(
            "checkpoint %s has no %s (written before checksums): loading it unverified",
            path,
            MANIFEST_FILE,
        )
    elif problems:
        raise CorruptCheckpoint(f"checkpoint {path} is corrupt: {'; '.join(problems)}")


def quarantine(ckpt: Path) -> Path:
    """Rename a bad checkpoint to `iter_K.corrupt` (then `.corrupt1`, …): out of every
    reader's way, kept for whoever wants to look at it."""
    for n in range(1000):
        aside = ckpt.with_name(f"{ckpt.name}{CORRUPT_SUFFIX}{n or ''}")
        if not aside.exists():
            ckpt.rename(aside)
            return aside
    raise FileExistsError(f"too many {ckpt.name}{CORRUPT_SUFFIX}* beside {ckpt}")


def latest_intact_checkpoint(root: str | Path) -> Path | None:
    """The newest checkpoint under `root` that passes `verify_checkpoint`. Newer ones that
    fail are moved aside (`quarantine`) with a warning naming the bad file, so the run
    resumes from the one before. None if there are no checkpoints; CorruptCheckpoint if
    there are and none is intact (starting over would silently drop the run's progress)."""
    found = list_checkpoints(root)
    for ckpt in reversed(found):
        try:
            verify_checkpoint(ckpt)
            return ckpt
        except CorruptCheckpoint as e:
            aside = quarantine(ckpt)
            log.warning(
                "%s; moved it aside to %s, resuming from an older checkpoint", e, aside.name
            )
    if found:
        raise CorruptCheckpoint(
            f"none of the {len(found)} checkpoints under {root} passed verification (moved aside "
            f"as *{CORRUPT_SUFFIX}): restore them from a copy, or start a new run (another "
            "--out, --init from a policy)"
        )
    return None


def remove_partial(root: str | Path) -> list[Path]:
    """Delete staging leftovers of an interrupted save (`.iter_*.tmp`, `.iter_*.old`)."""
    root = Path(root)
    removed = []
    if root.is_dir():
        for p in root.iterdir():
            if p.name.startswith(f".{PREFIX}") and p.name.endswith((".tmp", ".old")):
                shutil.rmtree(p, ignore_errors=True) if p.is_dir() else p.unlink()
                removed.append(p)
    return removed


# ---- RNG -------------------------------------------------------------------------------------


def rng_state() -> dict[str, Any]:
    """Every global RNG a training process draws from, in torch.load(weights_only)-safe form."""
    name, keys, pos, has_gauss, gauss = np.random.get_state(legacy=True)
    state: dict[str, Any] = {
        "torch": torch.get_rng_state(),
        "python": random.getstate(),
        "numpy": (name, torch.from_numpy(keys.astype(np.int64)), pos, has_gauss, gauss),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    version, internal, gauss_next = state["python"]
    random.setstate((version, tuple(internal), gauss_next))
    name, keys, pos, has_gauss, gauss = state["numpy"]
    np.random.set_state((name, keys.numpy().astype(np.uint32), pos, has_gauss, gauss))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


# ---- save / load -----------------------------------------------------------------------------


def save_checkpoint(
    root: str | Path,
    state: TrainState,
    *,
    policy: nn.Module,
    optimizers: dict[str, torch.optim.Optimizer | dict[str, Any]],
    config: Any,
    critic: Critic | None = None,
    tokenizer: Any = None,
    keep: int = 3,
    policy_state: dict[str, torch.Tensor] | None = None,
    critic_state: dict[str, torch.Tensor] | None = None,
) -> Path:
    """Write `<root>/iter_{state.iteration:06d}` atomically, then drop all but the newest
    `keep` checkpoints. `config` is a dataclass (the run's Config) or a JSON-able dict.

    A sharded learner (mem1_core.training.fsdp_learner) holds no whole model: it passes the full
    state dicts it gathered as `policy_state` / `critic_state` (written in the files the
    modules would write, so every reader is the same) and, in `optimizers`, a gathered
    optimiser state dict in place of an optimiser."""
    if keep < 1:
        raise ValueError(f"keep must be >= 1, got {keep}")
    root = Path(root)
    out = root / checkpoint_name(state.iteration)
    with atomic_dir(out) as tmp:
        policy.save_pretrained(tmp / "policy", safe_serialization=True, state_dict=policy_state)
        if tokenizer is not None:
            tokenizer.save_pretrained(tmp / "policy")
        if critic is not None and critic_state is not None:
            _save_critic_state(critic, critic_state, tmp / "critic")
        elif critic is not None:
            critic.save(tmp / "critic")
        optim = {k: o if isinstance(o, dict) else o.state_dict() for k, o in optimizers.items()}
        torch.save(optim, tmp / "optimizer.pt")
        torch.save(rng_state(), tmp / "rng.pt")
        cfg = config if isinstance(config, dict) else asdict(config)
        write_json(cfg, tmp / "config.json")
        write_json(asdict(state), tmp / STATE_FILE)
        write_manifest(tmp)  # last: it covers every file above
    kept = list_checkpoints(root)
    for old in kept[:-keep]:
        shutil.rmtree(old)
    for older in kept[-keep:-1]:
        drop_optimizer(older)
    return out


def drop_optimizer(ckpt: Path) -> None:
    """Remove an older checkpoint's optimiser state (and re-seal its manifest).

    Why: AdamW keeps two float32 moments per parameter, so at 135M parameters the optimiser
    state is 2.1 GB of a 3.1 GB checkpoint; three kept whole took ~9 GB. Only the newest
    checkpoint is ever resumed with its optimiser; an older one still holds the weights (an
    evaluation's input, or a resume after the newest is found corrupt, which then restarts the
    optimiser with a warning)."""
    opt = ckpt / "optimizer.pt"
    if not opt.is_file():
        return
    # The manifest first (atomically), then the file: a kill in between leaves a file the
    # manifest does not list, which no check reads, never a listed file that is missing.
    manifest = ckpt / MANIFEST_FILE
    if manifest.is_file():
        record = json.loads(manifest.read_text())
        record["files"].pop(opt.name, None)
        write_json(record, manifest)
    opt.unlink()


def _save_critic_state(critic: Critic, state: dict[str, torch.Tensor], out: Path) -> None:
    """What `critic.save(out)` writes, from a full state dict of the critic (keys
    `backbone.*`, `value_head.*`): `critic` lends only its config and class."""
    parts: dict[str, dict[str, torch.Tensor]] = {"backbone.": {}, "value_head.": {}}
    for key, value in state.items():
        prefix = next((p for p in parts if key.startswith(p)), None)
        if prefix is None:
            raise ValueError(f"unexpected key {key!r} in a critic state dict")
        parts[prefix][key.removeprefix(prefix)] = value
    critic.backbone.save_pretrained(out, safe_serialization=True, state_dict=parts["backbone."])
    head = {k: v.detach().cpu().contiguous() for k, v in parts["value_head."].items()}
    save_file(head, str(out / VALUE_HEAD_FILE))


def checkpoint_memory(path: str | Path) -> str | None:
    """The memory policy the checkpoint's run trained under, from its config.json
    (`rollout.memory`), or None."""
    config = Path(path) / "config.json"
    if not config.is_file():
        return None
    rollout = json.loads(config.read_text()).get("rollout", {})
    return rollout.get("memory")


def read_state(path: str | Path) -> TrainState:
    data = json.loads((Path(path) / STATE_FILE).read_text())
    return TrainState(**data)


def load_checkpoint(
    path: str | Path,
    *,
    policy: nn.Module,
    optimizers: dict[str, torch.optim.Optimizer] | None = None,
    critic: Critic | None = None,
    restore_rng: bool = True,
    verify: bool = True,
) -> TrainState:
    """Load a checkpoint into existing objects (so optimisers keep pointing at the same
    parameters) and return its TrainState. Missing pieces the caller asks for raise, and
    so does a file that fails its checksum (`verify=False`: the caller has just verified
    it, e.g. with `latest_intact_checkpoint`)."""
    path = Path(path)
    if not (path / STATE_FILE).is_file():
        raise FileNotFoundError(f"{path} is not a checkpoint (no {STATE_FILE})")
    if verify:
        verify_checkpoint(path)
    _load_weights(policy, type(policy).from_pretrained(str(path / "policy"), use_safetensors=True))
    if critic is not None:
        if not (path / "critic").is_dir():
            raise FileNotFoundError(f"{path} has no critic/, but this run trains one")
        _load_weights(critic, Critic.load(path / "critic"))
    if optimizers and not (path / "optimizer.pt").is_file():
        # an older checkpoint (drop_optimizer): the weights resume, the moments start afresh
        log.warning(
            "%s holds no optimiser state (only the newest checkpoint keeps it): resuming its "
            "weights with fresh optimiser moments",
            path,
        )
        for opt in optimizers.values():
            opt.state.clear()
    elif optimizers:
        saved = torch.load(path / "optimizer.pt", map_location="cpu", weights_only=True)
        missing = set(optimizers) - set(saved)
        if missing:
            raise ValueError(f"{path}/optimizer.pt has no state for {sorted(missing)}")
        for name, opt in optimizers.items():
            opt.load_state_dict(saved[name])  # moves state to each parameter's device
    if restore_rng:
        set_rng_state(torch.load(path / "rng.pt", weights_only=True))
    return read_state(path)


def _load_weights(target: nn.Module, source: nn.Module) -> None:
    # From a freshly loaded copy: from_pretrained restores tied weights that safetensors
    # stores once, and load_state_dict keeps `target`'s parameter objects (and dtype/device).
    target.load_state_dict(source.state_dict())
