"""The evaluation's cells played by vLLM in the vLLM venv (`eval.backend`): which engine `auto`
picks, a child process that fails (one line, or Hugging Face under `auto`), cells played
elsewhere read back as reused ones, and (marked `vllm`, run by `./dev test-vllm`) the same
evaluation from the Prefect venv played by Hugging Face and by vLLM under `.venv-vllm`, whose
records and trajectories agree.

Nothing here imports the plotting modules at import time: `./dev test-vllm` collects this file
under the vLLM venv, which has no matplotlib."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from test_rollout_python import CROSS_VENV_OVERRIDES, fake_python, prefect_python

from mem1_core.config import load_config
from mem1_core.evaluation.cells import Cell, cell_record, write_cell
from mem1_core.evaluation.vllm_cells import VLLMCellPlayer, VLLMUnavailable, choose_player
from mem1_core.runs import rollout_python


@pytest.fixture
def no_default_venv(monkeypatch, tmp_path):
    """No .venv-vllm beside the checkout and no $MEM1_VLLM_PYTHON."""
    monkeypatch.setattr(rollout_python, "CHECKOUT", tmp_path / "checkout")
    monkeypatch.delenv(rollout_python.VLLM_PYTHON_ENV, raising=False)


def shell_python(tmp_path: Path, lines: str) -> str:
    """An executable that runs the shell `lines` whatever it is asked (the player's child)."""
    path = tmp_path / "python"
    path.write_text(f"#!/bin/sh\n{lines}\n")
    path.chmod(0o755)
    return str(path)


# ---- which engine --------------------------------------------------------------------------


def test_auto_means_hf_without_a_vllm_python_and_says_so(no_default_venv, tmp_path, caplog):
    with caplog.at_level(logging.INFO, "mem1_core.evaluation.vllm_cells"):
        assert (
            choose_player(load_config("smoke", overrides=["eval.backend=auto"]), tmp_path) is None
        )
    assert "eval.backend=auto: evaluating with Hugging Face" in caplog.text
    assert choose_player(load_config("smoke"), tmp_path) is None  # hf, the default


def test_vllm_without_a_vllm_python_is_a_one_line_error(no_default_venv, tmp_path):
    with pytest.raises(VLLMUnavailable, match=r"found no vLLM venv: `./dev setup-vllm`") as e:
        choose_player(load_config("smoke", overrides=["eval.backend=vllm"]), tmp_path)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("backend", ["auto", "vllm"])
def test_a_vllm_python_is_used_where_it_imports_vllm(no_default_venv, tmp_path, backend):
    cfg = load_config(
        "smoke",
        overrides=[
            f"eval.backend={backend}",
            f"resources.rollout_python={fake_python(tmp_path, 'python')}",
        ],
    )
    player = choose_player(cfg, tmp_path / "run")
    assert isinstance(player, VLLMCellPlayer)
    assert player.python == cfg.resources.rollout_python
    assert player.run_dir == str((tmp_path / "run").resolve())
    assert player.fallback == (backend == "auto")


def test_a_python_without_vllm_is_hf_under_auto_and_an_error_under_vllm(no_default_venv, tmp_path):
    python = fake_python(tmp_path, "python", vllm=None)
    given = [f"resources.rollout_python={python}"]
    assert (
        choose_player(load_config("smoke", overrides=[*given, "eval.backend=auto"]), tmp_path)
        is None
    )
    with pytest.raises(VLLMUnavailable, match="cannot import vLLM"):
        choose_player(load_config("smoke", overrides=[*given, "eval.backend=vllm"]), tmp_path)


def test_an_unknown_backend_says_which_there_are():
    with pytest.raises(ValueError, match="eval.backend='vlm': use hf, vllm"):
        load_config("smoke", overrides=["eval.backend=vlm"])


# ---- the child process ------------------------------------------------------------------------


def _cells(tmp_path: Path) -> list[Cell]:
    from mem1_core.rollout.loop import Task

    task = Task("t0", "prompt", ["q"], [["a"]], [])
    record = cell_record("k", "src", "mem1", "squad", [task])
    return [Cell("agent", 1, [task], tmp_path / "trajectories" / "agent_n1.parquet", record, "p")]


@pytest.mark.parametrize("fallback", [False, True])
def test_a_failing_child_is_one_line_or_left_to_hf_under_auto(tmp_path, caplog, fallback):
    """Its output is forwarded line by line; its events call back; its exit status decides."""
    event = {"event": "engine", "policy": "p", "seconds": 1.5}
    run = (
        f"echo 'loading'\necho 'mem1-cell {json.dumps(event)}'\necho 'boom: no memory' >&2\nexit 3"
    )
    player = VLLMCellPlayer(load_config("smoke"), shell_python(tmp_path, run), str(tmp_path))
    player.fallback = fallback
    played = []
    with caplog.at_level(logging.INFO):
        if fallback:
            player(_cells(tmp_path), played.append)
        else:
            with pytest.raises(RuntimeError, match=r"exited with 3: boom: no memory \(eval") as e:
                player(_cells(tmp_path), played.append)
            assert "\n" not in str(e.value)
    assert "vllm: loading" in caplog.text
    assert "evaluation with vLLM: engine on p started in 1.5 s" in caplog.text
    assert played == []
    assert ("unfinished cells play with Hugging Face" in caplog.text) == fallback


def test_cells_played_elsewhere_read_back_as_reused_ones(
    small_tokenizer, small_index, small_world, tmp_path
):
    """A player (here: the scripted teacher in this process, writing the cells' files as the
    vLLM child does) finishes some cells; evaluate_scaling reads them back and plays the rest,
    and the table equals one played here throughout."""
    from mem1_core.config import RolloutConfig
    from mem1_core.data.compose import compose
    from mem1_core.data.qa_data import world_questions
    from mem1_core.evaluation.evaluate import run_eval
    from mem1_core.evaluation.scaling import Agent, evaluate_scaling
    from mem1_core.qa.env import QAEnvironment
    from mem1_core.qa.teacher import ScriptedTeacher
    from mem1_core.rollout.loop import tasks_from_table

    pytest.importorskip("matplotlib")  # evaluate_scaling draws; the vLLM venv has no matplotlib
    env = QAEnvironment(small_tokenizer, small_index, topk=3)
    questions = world_questions(small_world.questions).table
    tasks_by_n = {n: tasks_from_table(compose(questions, n, split="test")[0])[:4] for n in (1, 2)}
    every = [t for ts in tasks_by_n.values() for t in ts]
    cfg = RolloutConfig()

    def agents(policy):
        teacher = ScriptedTeacher(small_tokenizer, every)
        return [Agent("a", "mem1", None, teacher, "t", policy=policy)]

    played_by_player, called_back = [], []

    def player(cells, played):
        for cell in cells[:1]:  # it finishes one cell and leaves the other
            trajs, seconds = run_eval(None, small_tokenizer, env, cell.tasks, cfg,
                                      memory="mem1", backend=agents("p")[0].backend)  # fmt: skip
            write_cell(trajs, seconds, cell, backend="elsewhere")
            played_by_player.append((cell.agent, cell.n))
            played(cell)
            called_back.append(cell.n)

    here = evaluate_scaling(agents(None), small_tokenizer, env, tasks_by_n, cfg, tmp_path / "a",
                            False, key="k")  # fmt: skip
    there = evaluate_scaling(agents("p"), small_tokenizer, env, tasks_by_n, cfg, tmp_path / "b",
                             False, key="k", player=player)  # fmt: skip
    assert played_by_player == [("a", 1)] and called_back == [1]
    drop = ["seconds_per_task"]
    assert here.drop(columns=drop).to_dict("records") == there.drop(columns=drop).to_dict("records")
    records = {n: json.loads((tmp_path / "b/trajectories" / f"a_n{n}.cell.json").read_text())
               for n in (1, 2)}  # fmt: skip
    assert records[1]["backend"] == "elsewhere" and records[2]["backend"] == "ScriptedTeacher"


def test_one_engine_takes_every_policy_of_the_same_model(tmp_path, small_tokenizer):
    """The child starts one engine and loads each next policy's weights into it where the
    saved model config is the same but for provenance; another size gets an engine of its
    own. The weights it loads are the saved model's `state_dict()`, every name of it: the LM
    head, tied to the embedding and saved once, included (without it vLLM's in-place reload
    keeps a stale head)."""
    import torch

    from mem1_core.evaluation.vllm_cells import policy_weights, same_architecture
    from mem1_core.models.model import save_model
    from mem1_core.models.policy import initial_policy

    cfg = load_config("smoke")
    model = initial_policy(cfg, small_tokenizer)
    a = save_model(model, small_tokenizer, tmp_path / "a")
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)
    b = save_model(model, small_tokenizer, tmp_path / "b")
    (b / "config.json").write_text(
        json.dumps(json.loads((b / "config.json").read_text()) | {"_name_or_path": "elsewhere"})
    )
    wider = load_config("smoke", overrides=["model.hidden_size=96"])
    c = save_model(initial_policy(wider, small_tokenizer), small_tokenizer, tmp_path / "c")
    assert same_architecture(a, b) and not same_architecture(a, c)
    assert not same_architecture(None, a)
    loaded = policy_weights(b)
    state = model.state_dict()
    assert model.config.tie_word_embeddings and set(loaded) == set(state)
    for name, tensor in loaded.items():
        assert torch.equal(tensor, state[name]), name
    with pytest.raises(FileNotFoundError, match="no \\*.safetensors"):
        policy_weights(tmp_path)


# ---- the real thing: the Prefect venv evaluates, .venv-vllm plays ------------------------------

DRIVER = textwrap.dedent(
    """
    import json, logging, sys
    from pathlib import Path
    import torch
    from mem1_core.config import load_config
    from mem1_core.evaluation.stage import run_objective_scaling
    from mem1_core.models.model import save_model
    from mem1_core.models.policy import initial_policy
    from mem1_core.domains.inputs import prepare
    from mem1_core.domains.inputs import ensure_tokenizer
    from mem1_core.training.vllm_engine import vllm_importable

    assert not vllm_importable(), "the driver must be a Python without vLLM"
    logging.basicConfig(level=logging.INFO, stream=sys.stdout, format="%(name)s %(message)s")
    root, vllm_python, overrides = Path(sys.argv[1]), sys.argv[2], json.loads(sys.argv[3])
    cfg = load_config("smoke", overrides=overrides)
    tok = ensure_tokenizer(cfg, prepare(cfg, root))
    # an untrained model's near-uniform distributions repeat one token: noise sharpens them
    model, g = initial_policy(cfg, tok), torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.2)
    policy = save_model(model, tok, root / "policy")
    # a second policy, other weights on the same model: the engine's weights are replaced
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.2)
    other = save_model(model, tok, root / "other")
    agents = [("one", str(policy), "mem1"), ("one-full", str(policy), "full"),
              ("other", str(other), "mem1")]
    vllm = [f"resources.rollout_python={vllm_python}", "eval.backend=vllm"]
    for name, extra in (("hf", []), ("vllm", vllm), ("hf", vllm)):  # the last: all reused
        print("RUN", name, flush=True)
        cfg = load_config("smoke", overrides=overrides + extra)
        run_objective_scaling(cfg, root, root / name, agents, teacher=False, progress=False)
    """
)
# vLLM's CPU attention needs head_size >= 32 (the PPO test's model sizes); 6 cells of 3 tasks
OVERRIDES = [o for o in CROSS_VENV_OVERRIDES if o.startswith("model.")] + [
    "data.eval_objectives=[1,2]",
    "data.max_eval_tasks=3",
]


@pytest.mark.vllm
@pytest.mark.slow
def test_the_prefect_venv_evaluates_with_vllm_as_with_hf(tmp_path):
    """Run from .venv-vllm (`./dev test-vllm`): the Prefect venv's Python evaluates a random
    smoke-sized policy (two memories on it) and another policy of the same model (other
    weights) with Hugging Face, then with eval.backend=vllm under this Python. float32 both
    ways: every cell's record (but for the backend it names and its seconds) and trajectories
    are the same, so the one engine the child started played the second policy with that
    policy's weights, loaded in place; its progress reached the driver's log; a rerun of the
    vLLM evaluation into the Hugging Face one reuses every cell (the engine is not part of
    what a cell is)."""
    pytest.importorskip("vllm")
    from mem1_core.trajectory.record import read_trajectories

    driver = prefect_python()
    if not driver.is_file():
        pytest.skip(f"no Prefect venv at {driver.parent.parent} (./dev setup makes it)")
    env = os.environ | {"PYTHONPATH": str(rollout_python.CHECKOUT), "WANDB_MODE": "disabled"}
    env.pop("VIRTUAL_ENV", None)
    done = subprocess.run(
        [str(driver), "-c", DRIVER, str(tmp_path), sys.executable, json.dumps(OVERRIDES)],
        env=env, capture_output=True, text=True, timeout=1800, cwd=rollout_python.CHECKOUT,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
    log = done.stdout
    runs = log.split("RUN ")
    assert runs[2].count("engine on") == 1 and "one-full N=2: 3 tasks in" in runs[2]
    assert runs[2].count("loaded into the engine") == 1
    assert "engine on" not in runs[3] and "reused 6 finished cells" in runs[3]
    same = total = 0
    for name in ("one", "one-full", "other"):
        for n in (1, 2):
            cell = f"trajectories/{name}_n{n}"
            hf, vl = (
                json.loads((tmp_path / d / f"{cell}.cell.json").read_text()) for d in ("hf", "vllm")
            )
            assert (hf.pop("backend"), vl.pop("backend")) == ("hf", "vllm")
            assert vl.pop("engine_seconds") > 0
            assert {k: v for k, v in hf.items() if k != "seconds"} == {
                k: v for k, v in vl.items() if k != "seconds"
            }
            a, b = (read_trajectories(tmp_path / d / f"{cell}.parquet") for d in ("hf", "vllm"))
            assert [t.task_id for t in a] == [t.task_id for t in b]
            assert [t.em for t in a] == [t.em for t in b]
            for x, y in zip(a, b, strict=True):
                total += 1
                same += [t.gen_ids for t in x.turns] == [t.gen_ids for t in y.turns]
    print(f"trajectories with the same generated ids under HF and vLLM: {same} of {total}")
    assert same == total


def test_teacher_rows_beside_an_agent_play_in_one_evaluation(tmp_path):
    """The scripted teacher's reference rows and a policy's rows in one evaluation (as every
    pipeline run has them): each row is played by its own player (the teacher's backend for
    its rows, the engine's cell player for the policy's), none in place of another."""
    from mem1_core.config import load_config
    from mem1_core.domains.inputs import ensure_tokenizer, prepare
    from mem1_core.evaluation.stage import run_objective_scaling
    from mem1_core.models.model import save_model
    from mem1_core.models.policy import initial_policy

    cfg = load_config("smoke", overrides=["data.eval_objectives=[1]", "data.max_eval_tasks=2"])
    tok = ensure_tokenizer(cfg, prepare(cfg, tmp_path))
    policy = save_model(initial_policy(cfg, tok), tok, tmp_path / "policy")
    out = run_objective_scaling(
        cfg, tmp_path, tmp_path / "eval", [("one", str(policy), "mem1")], teacher=True,
        progress=False,
    )  # fmt: skip
    rows = {c["agent"]: c for c in out["headline"]}
    assert set(rows) == {"one", "teacher", "teacher-full"}
    assert rows["teacher"]["em_frac"] == 1.0 and rows["teacher-full"]["em_frac"] == 1.0
