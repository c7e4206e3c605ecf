"""The compute dtype from the CPU (mem1_core.models.compute): `model.autocast: auto` is bf16
only where this machine computes bf16 natively. The decision is checked with the probe
stubbed both ways, on the real CPU against its flags, and on the real CPU with torch's
kernels capped to AVX2 (an AVX2-only CPU, as oneDNN and ATen see one)."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from mem1_core.models import compute
from mem1_core.models.compute import (
    _parse_cpuinfo,
    bf16_check,
    cpu_info,
    machine_record,
    resolve_autocast,
)

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def fresh_probe():
    """Each test decides anew (the process caches the probe and each resolution)."""
    for fn in (bf16_check, resolve_autocast):
        fn.cache_clear()
    yield
    for fn in (bf16_check, resolve_autocast):
        fn.cache_clear()


def _stub_probe(monkeypatch, speedup: float) -> list[int]:
    calls: list[int] = []

    def probe(size: int = 256, repeats: int = 5) -> float:
        calls.append(size)
        return speedup

    monkeypatch.setattr(compute, "probe_speedup", probe)
    return calls


def test_auto_is_bf16_where_the_probe_finds_it_fast(monkeypatch, fresh_probe, caplog):
    calls = _stub_probe(monkeypatch, 2.5)  # AVX512-BF16: ~2.5x float32
    with caplog.at_level(logging.INFO, logger="mem1_core.models.compute"):
        assert resolve_autocast("auto") == "bfloat16"
        assert resolve_autocast("auto") == "bfloat16"
        assert resolve_autocast("bfloat16") == "bfloat16"
    assert len(calls) == 1  # once per process
    chosen = [r for r in caplog.records if "auto ->" in r.getMessage()]
    assert len(chosen) == 1 and "2.5x float32" in chosen[0].getMessage()
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


def test_auto_is_float32_where_bf16_is_emulated(monkeypatch, fresh_probe, caplog):
    _stub_probe(monkeypatch, 1 / 206)  # AVX2 only: 0.9 against 186 GFLOP/s
    with caplog.at_level(logging.INFO, logger="mem1_core.models.compute"):
        assert resolve_autocast("auto") is None
        assert resolve_autocast(None) is None
        # an explicit bf16 is honoured, with one warning that says how much slower it is
        assert resolve_autocast("bfloat16") == "bfloat16"
        assert resolve_autocast("bfloat16") == "bfloat16"
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warned) == 1 and "0.00485x float32" in warned[0]
    assert any("auto -> float32" in r.getMessage() for r in caplog.records)


def test_a_tie_stays_in_float32(monkeypatch, fresh_probe):
    # AVX-512 without BF16: oneDNN converts to float32 and back, no faster than float32
    _stub_probe(monkeypatch, 1.0)
    assert resolve_autocast("auto") is None


def test_a_model_computes_in_what_auto_resolves_to(monkeypatch, fresh_probe):
    from mem1_core.config import ModelConfig
    from mem1_core.models.model import compute_context, model_autocast, set_compute

    layer = set_compute(torch.nn.Linear(4, 4), ModelConfig(autocast="auto"))
    _stub_probe(monkeypatch, 0.01)
    assert model_autocast(layer) is None
    with compute_context(layer):
        assert layer(torch.ones(1, 4)).dtype == torch.float32
    for fn in (bf16_check, resolve_autocast):
        fn.cache_clear()
    _stub_probe(monkeypatch, 2.0)
    assert model_autocast(layer) == "bfloat16"
    with compute_context(layer):
        assert layer(torch.ones(1, 4)).dtype == torch.bfloat16


def test_the_real_cpu_agrees_with_its_flags(fresh_probe):
    """Where the flags are conclusive and nothing caps torch's kernels, the probe agrees."""
    if os.environ.get("ONEDNN_MAX_CPU_ISA") or os.environ.get("ATEN_CPU_CAPABILITY"):
        pytest.skip("torch's kernels are capped in this environment")
    flags = set(cpu_info().flags)
    check = bf16_check()
    assert check.speedup > 0
    if flags & {"avx512_bf16", "amx_bf16"}:
        assert check.native, check.reason
    elif cpu_info().arch == "x86_64" and "avx512f" not in flags:
        assert not check.native, check.reason


def test_an_avx2_only_cpu_computes_in_float32():
    """torch with oneDNN and ATen capped at AVX2 (what they do on an AVX2-only CPU, whatever
    this CPU is): bf16 runs tens of times slower, `auto` picks float32, and an explicit
    bfloat16 warns with the measured ratio."""
    if cpu_info().arch != "x86_64":
        pytest.skip("the AVX2 cap is an x86 setting")
    code = (
        "import json, logging; logging.basicConfig(level=logging.INFO)\n"
        "from mem1_core.models.compute import bf16_check, resolve_autocast\n"
        "c = bf16_check()\n"
        "print(json.dumps({'native': c.native, 'speedup': c.speedup, 'onednn': c.onednn_bf16,\n"
        "                  'auto': resolve_autocast('auto'), 'bf16': resolve_autocast('bfloat16')}))"
    )
    env = os.environ | {"ONEDNN_MAX_CPU_ISA": "AVX2", "ATEN_CPU_CAPABILITY": "avx2",
                        "PYTHONPATH": str(ROOT)}  # fmt: skip
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["onednn"] is False
    assert not got["native"] and got["speedup"] < 0.5, got
    assert got["auto"] is None and got["bf16"] == "bfloat16"
    assert "without native bf16" in out.stderr and "x float32's speed" in out.stderr


def test_cpuinfo_is_read_on_x86_and_arm64():
    x86 = "processor\t: 0\nmodel name\t: AMD EPYC\nflags\t\t: fpu avx2 avx512f avx512_bf16\n"
    assert _parse_cpuinfo(x86) == ("AMD EPYC", {"fpu", "avx2", "avx512f", "avx512_bf16"})
    arm = "processor\t: 0\nFeatures\t: fp asimd bf16 sve\nCPU part\t: 0xd40\n"
    model, flags = _parse_cpuinfo(arm)
    assert model == "" and {"asimd", "bf16", "sve"} <= flags


def test_config_show_says_what_auto_is_here(monkeypatch, fresh_probe):
    from mem1_core.config.reference import render_show, resolve

    _stub_probe(monkeypatch, 0.02)
    rows = {r.key: r for r in resolve("smol")}
    auto = rows["model.autocast"]
    assert auto.value == "auto" and auto.source == "profile smol"
    assert auto.here.startswith("float32 on this machine") and "0.02x" in auto.here
    assert auto.to_dict()["here"] == auto.here
    assert all(r.here is None for k, r in rows.items() if k != "model.autocast")
    assert "-> float32 on this machine" in render_show([auto])


def test_machine_record_names_the_cpu(monkeypatch, fresh_probe):
    _stub_probe(monkeypatch, 3.0)
    record = machine_record("auto")
    assert record["cpu"]["model"] == cpu_info().model
    assert record["autocast"] == {"value": "auto", "computes_in": "bfloat16"}
    assert json.loads(json.dumps(record)) == record


def test_no_cpu_profile_forces_a_dtype_the_cpu_may_emulate():
    """A profile meant for the CPU (weights in float32) computes in what the machine is fast
    at: `auto` or float32, never a fixed bfloat16/float16, which an AVX2-only CPU emulates
    ~200x slower (the GPU's `paper` profile keeps its bf16 weights)."""
    from mem1_core.config import load_config
    from mem1_core.config.loader import profile_names

    cpu = {name: load_config(name).model for name in profile_names()}
    cpu = {name: m for name, m in cpu.items() if m.dtype == "float32"}
    assert {"smol", "webshop-smol", "tiny"} <= set(cpu)
    assert {name: m.autocast for name, m in cpu.items() if m.autocast not in (None, "auto")} == {}
    assert cpu["smol"].autocast == cpu["webshop-smol"].autocast == "auto"
