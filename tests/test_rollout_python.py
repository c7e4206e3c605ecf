"""Rollout workers under the vLLM venv's Python: which interpreter is chosen, the
version check against the driver (with fake interpreters that report other versions), the
worker options that carry the runtime env, and (marked `vllm`, run by `./dev test-vllm`) a smoke
PPO iteration driven from the Prefect venv whose rollout workers generate with vLLM under
`.venv-vllm`'s Python."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from mem1_core.config import load_config
from mem1_core.runs import rollout_python
from mem1_core.runs.rollout_python import (
    IncompatiblePython,
    check_compatible,
    probe,
    this_interpreter,
    vllm_python,
    worker_pythonpath,
)


def fake_python(tmp_path: Path, name: str, **fields) -> str:
    """An executable that answers the probe like a Python would, with the given versions
    (the driver's where not given)."""
    me = this_interpreter()
    report = {
        "python": "ignored",
        "python_version": me.python_version,
        "ray": me.ray,
        "torch": me.torch,
        "vllm": "0.32.0",
        "mem1_core": me.mem1_core,
    } | fields
    path = tmp_path / name
    path.write_text(f"#!/bin/sh\ncat <<'EOF'\n{json.dumps(report)}\nEOF\n")
    path.chmod(0o755)
    return str(path)


@pytest.fixture
def no_vllm_here(monkeypatch):
    """This process cannot import vLLM (as in the Prefect venv), whichever venv runs the test."""
    monkeypatch.setitem(sys.modules, "vllm", None)


@pytest.fixture
def no_default_venv(monkeypatch, tmp_path):
    """No .venv-vllm beside the checkout and no $MEM1_VLLM_PYTHON."""
    monkeypatch.setattr(rollout_python, "CHECKOUT", tmp_path / "checkout")
    monkeypatch.delenv(rollout_python.VLLM_PYTHON_ENV, raising=False)


# ---- which Python ----------------------------------------------------------------------------


def test_the_interpreter_comes_from_the_config_then_the_environment_then_the_checkout(
    tmp_path, monkeypatch, no_default_venv
):
    assert vllm_python(None) is None
    default = rollout_python.CHECKOUT / ".venv-vllm" / "bin" / "python"
    default.parent.mkdir(parents=True)
    default.write_text("#!/bin/sh\n")
    assert vllm_python(None) == str(default)
    env = fake_python(tmp_path, "env-python")
    monkeypatch.setenv(rollout_python.VLLM_PYTHON_ENV, env)
    assert vllm_python(None) == env
    given = fake_python(tmp_path, "given-python")
    assert vllm_python(given) == given


def test_a_python_asked_for_but_missing_is_an_error(tmp_path, monkeypatch, no_default_venv):
    with pytest.raises(FileNotFoundError, match=r"resources.rollout_python=.*setup-vllm"):
        vllm_python(str(tmp_path / "nothing"))
    monkeypatch.setenv(rollout_python.VLLM_PYTHON_ENV, str(tmp_path / "nothing"))
    with pytest.raises(FileNotFoundError, match=r"\$MEM1_VLLM_PYTHON="):
        vllm_python(None)


def test_auto_means_vllm_with_ray_when_a_vllm_python_is_there(tmp_path, no_vllm_here):
    from mem1_core.training.vllm_engine import choose_backend

    cfg = load_config(
        "paper", overrides=[f"resources.rollout_python={fake_python(tmp_path, 'python')}"]
    )
    assert choose_backend(cfg, use_ray=True) == "vllm"
    # without Ray the workers run in this process, which has no vLLM
    assert choose_backend(cfg, use_ray=False) == "hf"


def test_auto_means_hf_without_any_vllm(no_vllm_here, no_default_venv):
    from mem1_core.training.vllm_engine import choose_backend

    assert choose_backend(load_config("paper"), use_ray=True) == "hf"


# ---- the version check -----------------------------------------------------------------------


def test_the_probe_reads_a_real_interpreter_as_this_process_does():
    """The probe's code, run by this very Python, reports what this process knows."""
    assert probe(sys.executable, worker_pythonpath()) == this_interpreter()


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"ray": "2.40.0"}, r"Ray 2\.40\.0 there, .* here.*same Ray and Python.*setup-vllm"),
        ({"python_version": "3.10.14"}, r"Python 3\.10\.14 there"),
        ({"ray": "2.40.0", "python_version": "3.12.1"}, r"Ray 2\.40\.0 there.*; Python 3\.12\.1"),
        ({"vllm": None}, r"cannot import vLLM.*setup-vllm"),
    ],
)
def test_another_ray_or_python_or_no_vllm_is_refused(tmp_path, fields, message):
    worker = probe(fake_python(tmp_path, "python", **fields))
    with pytest.raises(IncompatiblePython, match=message):
        check_compatible(this_interpreter(), worker)


def test_a_patch_release_or_another_torch_only_warns(tmp_path, caplog):
    me = this_interpreter()
    major, minor, _ = me.python_version.split(".")
    worker = probe(
        fake_python(tmp_path, "python", python_version=f"{major}.{minor}.999", torch="2.14.0")
    )
    with caplog.at_level("WARNING", logger=rollout_python.__name__):
        check_compatible(me, worker)
    text = caplog.text
    assert f"{major}.{minor}.999" in text and "torch 2.14.0" in text


def test_a_python_that_fails_says_so(tmp_path):
    bad = tmp_path / "python"
    bad.write_text("#!/bin/sh\necho 'ModuleNotFoundError: no json' >&2\nexit 1\n")
    bad.chmod(0o755)
    with pytest.raises(IncompatiblePython, match="failed to report its versions: ModuleNotFound"):
        probe(str(bad))


# ---- the workers' options ---------------------------------------------------------------------


def test_worker_options_carry_the_runtime_env_only_when_asked():
    from mem1_core.training.actor_start import worker_options
    from mem1_core.training.runtime import WORKER_RESTARTS

    resources = load_config("smoke").resources
    plain = worker_options(resources, None)
    assert "runtime_env" not in plain and plain["max_restarts"] == WORKER_RESTARTS
    env = {"py_executable": "/venv/bin/python", "env_vars": {"PYTHONPATH": "/repo"}}
    assert worker_options(resources, env)["runtime_env"] == env


def test_vllm_workers_of_a_driver_without_vllm_get_the_vllm_python(tmp_path, no_vllm_here):
    from mem1_core.training.vllm_engine import rollout_workers_env

    python = fake_python(tmp_path, "python")
    cfg = load_config(
        "smoke", overrides=["rollout.backend=vllm", f"resources.rollout_python={python}"]
    )
    env = rollout_workers_env(cfg, use_ray=True)
    assert env["py_executable"] == python
    assert env["env_vars"]["PYTHONPATH"].split(os.pathsep)[0] == str(rollout_python.CHECKOUT)
    assert rollout_workers_env(cfg, use_ray=False) is None  # no Ray: no other process
    hf = load_config("smoke", overrides=[f"resources.rollout_python={python}"])
    assert rollout_workers_env(hf, use_ray=True) is None


def test_an_incompatible_vllm_python_stops_the_run_before_ray_starts(tmp_path, no_vllm_here):
    from mem1_core.runs.layout import RunPaths
    from mem1_core.training.actor_start import start_runtime

    (tmp_path / "bin").mkdir()
    python = fake_python(tmp_path / "bin", "python", ray="2.40.0")
    cfg = load_config(
        "smoke", overrides=["rollout.backend=vllm", f"resources.rollout_python={python}"]
    )
    run = tmp_path / "run"
    run.mkdir()
    with pytest.raises(IncompatiblePython, match="Ray 2.40.0 there"):
        start_runtime(cfg, RunPaths(run), init=None, use_ray=True)
    assert not any(run.iterdir())  # no index, no policy, no Ray
    ray = sys.modules.get("ray")
    assert ray is None or not ray.is_initialized()


# ---- the real thing: the Prefect venv drives, .venv-vllm rolls out ----------------------------

CROSS_VENV_OVERRIDES = [
    "rollout.backend=vllm",
    "model.hidden_size=64",  # vLLM's CPU attention needs head_size >= 32: 64 / 2 heads
    "model.num_heads=2",
    "model.num_kv_heads=1",
    "ppo.iterations=1",
    "ppo.minutes=60",
    "ppo.tasks_per_iteration=4",
    "ppo.minibatch_size=4",
    "ppo.micro_batch_size=4",
    "rollout.gen_tokens_base=12",
    "rollout.gen_tokens_per_objective=2",
    "data.max_eval_tasks=2",
]
DRIVER = textwrap.dedent(
    """
    import json, sys
    from mem1_core.config import load_config
    from mem1_core.training.train_rl import train_rl
    from mem1_core.training.vllm_engine import vllm_importable

    assert not vllm_importable(), "the driver must be a Python without vLLM"
    out, overrides = sys.argv[1], json.loads(sys.argv[2])
    result = train_rl(load_config("smoke", overrides=overrides), out, use_ray=True, show=False)
    print("RESULT", json.dumps({"iterations": result["iterations"]}))
    """
)


def prefect_python() -> Path:
    """The Prefect venv's Python (`./dev`'s MEM1_VENV, else the checkout's .venv)."""
    venv = Path(os.environ.get("MEM1_VENV") or rollout_python.CHECKOUT / ".venv")
    return venv / "bin" / "python"


@pytest.mark.vllm
@pytest.mark.slow
def test_ppo_from_the_prefect_venv_rolls_out_with_vllm_under_the_vllm_venv(tmp_path):
    """Run from .venv-vllm (`./dev test-vllm`): the driver is the Prefect venv's Python,
    which cannot import vLLM; its Ray rollout worker runs under this Python
    (resources.rollout_python), generates with vLLM and gets the learner's weights through
    Ray's object store: the metrics say so, and the rollout's log-probs are the learner's."""
    vllm = pytest.importorskip("vllm")
    driver = prefect_python()
    if not driver.is_file():
        pytest.skip(f"no Prefect venv at {driver.parent.parent} (./dev setup makes it)")
    overrides = [*CROSS_VENV_OVERRIDES, f"resources.rollout_python={sys.executable}"]
    env = os.environ | {
        "PYTHONPATH": str(rollout_python.CHECKOUT),  # the driver imports this checkout's code
        "WANDB_MODE": "offline",
        "VLLM_CPU_KVCACHE_SPACE": "1",  # GiB; else half the host's memory
        "VLLM_CPU_OMP_THREADS_BIND": os.environ.get("VLLM_CPU_OMP_THREADS_BIND", "nobind"),
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0",  # the engine inside the actor's process
    }
    env.pop("VIRTUAL_ENV", None)
    out = tmp_path / "run"
    done = subprocess.run(
        [str(driver), "-c", DRIVER, str(out), json.dumps(overrides)],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
        cwd=rollout_python.CHECKOUT,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
    assert '"iterations": 1' in done.stdout
    (row,) = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    turns = {k: v for k, v in row.items() if k.startswith("train/logp_mismatch_max/turn_")}
    print(
        f"rollout_backend={row['rollout_backend']} vllm_version={row['vllm_version']} "
        f"rollout_python={row['rollout_python']} logp_mismatch_max="
        f"{row['train/logp_mismatch_max']:.2e} per turn {[f'{v:.2e}' for v in turns.values()]} "
        f"rollout_seconds={row['rollout_seconds']:.1f}"
    )
    assert row["rollout_backend"] == "vllm" and row["vllm_version"] == vllm.__version__
    assert row["rollout_python"] == sys.executable
    # The worker started from the learner's weights (the first sync): fp32 log-probs agree.
    assert turns and row["train/logp_mismatch_max"] < 1e-3
