"""`./dev --help` and `./dev VERB --help` print help without setting anything up: no venv is
created, nothing is installed, and they exit 0."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def run_dev(args: list[str], venv: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "MEM1_VENV": str(venv), "MEM1_VLLM_VENV": str(venv) + "-vllm"}
    return subprocess.run(
        [str(ROOT / "dev"), *args], env=env, capture_output=True, text=True, timeout=60
    )


@pytest.mark.parametrize(
    "args",
    [
        [],
        ["--help"],
        ["-h"],
        ["help"],
        ["test", "--help"],
        ["train-eval", "--help"],
        ["train-eval", "--profile", "smol", "-h"],
        ["setup", "--help"],
        ["setup-vllm", "--help"],
        ["test-vllm", "--help"],
        ["server", "--help"],
    ],
)
def test_help_installs_nothing(tmp_path: Path, args: list[str]) -> None:
    venv = tmp_path / "no-venv"
    r = run_dev(args, venv)
    assert r.returncode == 0, r.stderr
    assert "./dev" in r.stdout
    assert not venv.exists() and not Path(str(venv) + "-vllm").exists()
    assert "installing" not in r.stderr and "creating" not in r.stderr


def test_verb_help_is_the_verbs(tmp_path: Path) -> None:
    out = run_dev(["test", "--help"], tmp_path / "v").stdout
    assert out.startswith("./dev test [pytest options]")
    assert "test-vllm" not in out  # a verb's help, not the next verb's


def test_unknown_verb_is_refused_with_usage(tmp_path: Path) -> None:
    r = run_dev(["no-such-verb"], tmp_path / "v")
    assert r.returncode == 2
    assert "unknown verb" in r.stderr and "./dev test" in r.stdout
