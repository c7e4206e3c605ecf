"""The machine a model computes on: which CPU it is, and the compute dtype it is fast at.

`model.autocast: auto` (the `smol` profile's value) computes in bfloat16 only where this
machine computes bf16 natively, and in float32 elsewhere. The speeds differ by two orders of
magnitude between CPUs of one cloud instance type: on an AMD EPYC with AVX512-BF16 a bf16
matmul runs ~2.5x float32's speed; on one with AVX2 alone oneDNN has no bf16 kernel and the
reference path runs at 0.9 GFLOP/s against float32's 186 (206x slower; SmolLM2 generated 4.2x
slower under bf16 autocast).

How it decides (once per process, `bf16_check`): a probe. A 256 x 256 matmul is timed in
float32 and in bfloat16 on one thread, interleaved, best of several repetitions (~5 ms where
bf16 is native, ~0.1 s where it is not); bf16 wins where it is at least `BF16_MIN_SPEEDUP`
times float32's speed. One thread, because a multi-threaded matmul on a machine whose other
cores are busy waits at OpenMP's barriers for a descheduled thread: on 2 cores with another
process running, a 256 x 256 float32 matmul on 2 threads took 13-24 ms instead of 0.4, which
drowned the ratio; on one thread it measured 0.4 ms either way. Why a probe and not the CPU flags alone: the flags say what the silicon
has, the probe what this torch build does with it: a oneDNN capped by ONEDNN_MAX_CPU_ISA, a
hypervisor that hides or fakes a flag, a torch without the bf16 kernel, a new ISA the flag
list does not know (AMX, arm64's BF16/SME). And it is reliable because the two regimes are
far apart: native bf16 measures 1.5-3x float32 (AMX more), emulated 1/40-1/200; timing noise,
even with the other core busy, moves the ratio by tens of percent, not by 50x. The flags and
torch's own query (`torch.ops.mkldnn._is_mkldnn_bf16_supported`) are reported beside it.

On a CUDA device `auto` is bfloat16 where the GPU supports it (`torch.cuda.is_bf16_supported`).
An explicit `bfloat16` on a CPU that emulates it is honoured, with one warning that gives the
measured ratio.
"""

from __future__ import annotations

import functools
import logging
import os
import platform
import time
from dataclasses import asdict, dataclass
from pathlib import Path

log = logging.getLogger(__name__)

AUTO = "auto"
BF16_MIN_SPEEDUP = 1.2
"""bf16 is chosen where the probe runs it at least this many times float32's speed: native
bf16 measures 1.5-3x (AVX512-BF16), emulated 0.005-0.03x; 1.2 keeps a CPU where bf16 merely
ties float32 (AVX-512 without BF16, where oneDNN converts) in float32, which is exact."""

BF16_FLAGS = ("avx512_bf16", "amx_bf16", "bf16")
"""CPU flags that name native bf16 arithmetic: x86 AVX512-BF16 and AMX-BF16, arm64's BF16
(as /proc/cpuinfo's `Features` spells it)."""
SHOWN_FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile", "neon", "asimd",
               "bf16", "sve")  # fmt: skip
"""The flags a CPU description keeps: those that decide a dtype's speed."""


@dataclass(frozen=True)
class CpuInfo:
    """What a timing ran on: `model` and the flags that decide a dtype's speed."""

    model: str
    flags: tuple[str, ...]
    arch: str
    cores: int

    def to_dict(self) -> dict:
        return {**asdict(self), "flags": list(self.flags)}

    def describe(self) -> str:
        """One line: `AMD EPYC (x86_64, 2 cores; avx2 avx512f avx512_bf16)`."""
        flags = " ".join(self.flags) or "none of " + "/".join(SHOWN_FLAGS[:4])
        return f"{self.model} ({self.arch}, {self.cores} cores; {flags})"


def _parse_cpuinfo(text: str) -> tuple[str, set[str]]:
    model, flags = "", set()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key = key.strip().lower()
        if key in ("model name", "cpu model", "hardware") and not model:
            model = value.strip()
        elif key in ("flags", "features") and not flags:
            flags = set(value.split())
    return model, flags


@functools.cache
def cpu_info() -> CpuInfo:
    """This machine's CPU, from /proc/cpuinfo (Linux), else the platform module."""
    path = Path("/proc/cpuinfo")
    model, flags = _parse_cpuinfo(path.read_text()) if path.is_file() else ("", set())
    return CpuInfo(
        model=model or platform.processor() or platform.machine() or "unknown",
        flags=tuple(f for f in SHOWN_FLAGS if f in flags),
        arch=platform.machine(),
        cores=os.cpu_count() or 1,
    )


@dataclass(frozen=True)
class Bf16Check:
    """The probe's answer: is bf16 native here, and why."""

    native: bool
    speedup: float
    """bf16 matmul speed over float32's (the probe's; >1: bf16 faster)."""
    flags: tuple[str, ...]
    """The CPU's bf16 flags (BF16_FLAGS it has)."""
    onednn_bf16: bool | None
    """torch's own query (`torch.ops.mkldnn._is_mkldnn_bf16_supported`), where it exists."""

    @property
    def reason(self) -> str:
        flags = ", ".join(self.flags) or "no bf16 flag"
        return (
            f"a 256x256 bf16 matmul ran at {self.speedup:.3g}x float32's speed on "
            f"{cpu_info().model} ({flags}; oneDNN bf16: {self.onednn_bf16})"
        )


def decide_bf16(speedup: float) -> bool:
    """The rule, apart from the measuring: bf16 where the probe measured it at least
    BF16_MIN_SPEEDUP times float32's speed."""
    return speedup >= BF16_MIN_SPEEDUP


def probe_speedup(size: int = 256, repeats: int = 5) -> float:
    """bf16 matmul speed over float32's on this CPU: best of `repeats`, interleaved so that a
    burst of load from another process hits both dtypes alike."""
    import torch  # here, not at the top: flows import this module and must load no torch

    gen = torch.Generator().manual_seed(0)
    a32, b32 = (torch.randn(size, size, generator=gen) for _ in range(2))
    a16, b16 = a32.bfloat16(), b32.bfloat16()
    best = {torch.float32: float("inf"), torch.bfloat16: float("inf")}
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for i in range(repeats + 1):
            for a, b in ((a32, b32), (a16, b16)):
                t = time.perf_counter()
                a @ b
                if i:  # the first round warms oneDNN's kernel choice up
                    best[a.dtype] = min(best[a.dtype], time.perf_counter() - t)
    finally:
        torch.set_num_threads(threads)
    return best[torch.float32] / max(best[torch.bfloat16], 1e-9)


def _onednn_bf16() -> bool | None:
    import torch

    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        return None


@functools.cache
def bf16_check() -> Bf16Check:
    """The probe, once per process (~5 ms where bf16 is native, ~0.1 s where not)."""
    speedup = probe_speedup()
    flags = tuple(f for f in BF16_FLAGS if f in cpu_info().flags)
    return Bf16Check(decide_bf16(speedup), speedup, flags, _onednn_bf16())


@functools.cache
def resolve_autocast(autocast: str | None, device: str = "cpu") -> str | None:
    """The compute dtype `model.autocast` means on `device` in this process: `auto` ->
    bfloat16 where it is native, else None (compute in the weights' dtype). Logged once;
    an explicit bfloat16 on a CPU that emulates it warns once."""
    if device != "cpu":
        if autocast != AUTO:
            return autocast
        import torch

        native = device == "cuda" and torch.cuda.is_available() and torch.cuda.is_bf16_supported()
        choice = "bfloat16" if native else None
        log.info("model.autocast=auto -> %s on %s", choice or "the weights' dtype", device)
        return choice
    if autocast not in (AUTO, "bfloat16"):
        return autocast
    check = bf16_check()
    if autocast == AUTO:
        choice = "bfloat16" if check.native else None
        log.info(
            "model.autocast=auto -> %s: %s", "bfloat16" if check.native else "float32", check.reason
        )
        return choice
    if not check.native:
        log.warning(
            "model.autocast=bfloat16 on a CPU without native bf16: %s; everything that computes "
            "under autocast runs that much slower (model.autocast=auto picks float32 here)",
            check.reason,
        )
    return autocast


def describe_auto(device: str = "cpu") -> str:
    """What `auto` resolves to here and why, for `mem1 config show`."""
    choice = resolve_autocast(AUTO, device)
    if device != "cpu":
        return f"{choice or 'the weights dtype'} on {device}"
    return f"{choice or 'float32'} on this machine: {bf16_check().reason}"


def machine_record(autocast: str | None = None) -> dict:
    """What a run ran on, for its run.json: the CPU, torch, a GPU if any, and the compute dtype
    `model.autocast` resolved to in the process that wrote it."""
    import torch

    cuda = torch.cuda.is_available()
    record: dict = {"cpu": cpu_info().to_dict(), "torch": torch.__version__}
    if cuda:
        record["gpu"] = torch.cuda.get_device_name(0)
    if autocast is not None:
        resolved = resolve_autocast(autocast, "cuda" if cuda else "cpu")
        record["autocast"] = {"value": autocast, "computes_in": resolved or "weights' dtype"}
    return record
