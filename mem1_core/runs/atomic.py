"""Atomic writes: every artifact is written to a temporary sibling and renamed, so a
killed process never leaves a half-written file or directory behind (docs/design.md §4.7).

A write that fails because the disk is full raises `DiskFull`, saying which file and how
much space is left, whatever the writing library made of ENOSPC (torch.save reports it as
a bare `RuntimeError: unexpected pos`, safetensors as a `SafetensorError`); the temporary
is removed and the file it would have replaced is left as it was.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from mem1_core.runs.faults import DiskFull

FULL_BELOW_BYTES = 1 << 20
"""A write that fails while less than this is free on its file system failed for want of
space (a failed write fills the disk to the last block before it gives up)."""


def _disk_full(error: BaseException, path: Path) -> DiskFull | None:
    """`error` as a DiskFull naming `path`, if it came from a full disk (ENOSPC anywhere in
    its chain, or next to no space left), else None."""
    chain, e = [], error
    while e is not None and len(chain) < 8:
        chain.append(e)
        e = e.__cause__ or e.__context__
    try:
        free = shutil.disk_usage(path.parent).free
    except OSError:
        free = None
    enospc = any(getattr(x, "errno", None) == errno.ENOSPC for x in chain) or any(
        "No space left on device" in str(x) for x in chain
    )
    if not enospc and (free is None or free >= FULL_BELOW_BYTES):
        return None
    left = "" if free is None else f" ({free} bytes free)"
    return DiskFull(
        errno.ENOSPC,
        f"no space left on the device of {path.parent}{left} while writing {path.name}; the "
        "previous files are intact: free some space, then rerun (a training run: with --resume)",
    )


@contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary file path beside `path`; rename it onto `path` on success."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    tmp_path = Path(tmp)
    try:
        yield tmp_path
        os.replace(tmp_path, path)
    except Exception as e:
        # Checked before the temporary goes; a DiskFull from a nested write already names it.
        if not isinstance(e, DiskFull) and (full := _disk_full(e, path)) is not None:
            raise full from e
        raise
    finally:
        if tmp_path.exists():
            tmp_path.unlink()


@contextmanager
def atomic_dir(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary directory beside `path`; on success it replaces `path` whole."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent))
    try:
        yield tmp
        if path.exists():
            old = path.with_name(f".{path.name}.old")
            if old.exists():
                shutil.rmtree(old)
            os.replace(path, old)
            os.replace(tmp, path)
            shutil.rmtree(old)
        else:
            os.replace(tmp, path)
    except Exception as e:
        # Named after the directory, not the file inside its temporary that hit the limit.
        if (full := _disk_full(e, path)) is not None:
            raise full from e
        raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp)


def file_sha256(path: str | os.PathLike, chunk: int = 1 << 22) -> str:
    """The SHA-256 of a file's bytes, read in chunks (checkpoint manifests, model caches)."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def write_parquet(table: pa.Table, path: str | os.PathLike) -> Path:
    """Write `table` atomically; deterministic bytes for identical tables."""
    with atomic_path(path) as tmp:
        pq.write_table(table, tmp, compression="zstd", write_statistics=False)
    return Path(path)


def write_text(text: str, path: str | os.PathLike) -> Path:
    with atomic_path(path) as tmp:
        tmp.write_text(text)
    return Path(path)


def write_json(obj: Any, path: str | os.PathLike, default: Callable | None = str) -> Path:
    return write_text(json.dumps(obj, indent=2, sort_keys=True, default=default) + "\n", path)


def write_figure(fig, path: str | os.PathLike, dpi: int = 120) -> Path:
    """A matplotlib figure as a PNG at `path`, atomically, and closed (its memory freed)."""
    import matplotlib.pyplot as plt

    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=dpi, bbox_inches="tight")
    plt.close(fig)
    return Path(path)
