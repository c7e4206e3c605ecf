"""text_stops: tags as text under a pretrained tokenizer. A byte-level BPE with Qwen2.5's pre-tokenizer trained
on a smoke world (the tags are not tokens of it) and a Qwen2 model from config taught to
recite two turns past their closing tag (` </query>\n`, `</answer>.\n`: 3 tokens each, the
last carrying more characters). Hugging Face generation with stop strings must end each at
the token that completes the tag, and the environment must read the action; the cost of the
per-token stop check is timed on a batch of random contexts. With vLLM (row
`text_stops_vllm`): the engine loads the tokenizer, stops on the strings with the stop text
kept, and its ids must equal Hugging Face's; skipped if vLLM is missing."""

from __future__ import annotations

import json
import math
import random
import tempfile
import time
from pathlib import Path

import torch

from benchmarks.gpu.base import Check, sync
from mem1_core.config import ModelConfig

TEXT_STOP_SCRIPTS = (
    # context, then what the model is taught to write: past the closing tag, so only a stop
    # ends the turn there (the expected action and its text follow)
    (
        "Question 1: Who wrote it?\n",
        "<IS> Start. </IS><query> Kalo Vesh </query>\nQuestion 2: and",
        "query",
        "Kalo Vesh",
    ),
    (
        "Question 1: In what year?\n",
        "<IS> Q1: 1874. </IS><answer> 1874</answer>.\nQuestion 2: more",
        "answer",
        "1874",
    ),
)


def hub_standin(world_texts: list[str], vocab: int):
    """A pretrained tokenizer's stand-in: byte-level BPE, Qwen2.5's pre-tokenizer, trained on
    world text plus lines that use the tags as web text does (the tags stay several tokens)."""
    from mem1_core.models.tokenizer import train_byte_level_tokenizer

    lines = [s for _, s, _, _ in TEXT_STOP_SCRIPTS] * 20
    lines += [f"<IS> Q1: {i}. </IS><answer> {i}</answer>.\n" for i in range(1800, 1830)]
    return train_byte_level_tokenizer(world_texts + lines, vocab)


def run(c: Check) -> None:
    device, s, emit = c.device, c.sizes, c.emit
    from mem1_core.config import load_config
    from mem1_core.data.prompts import TAGS
    from mem1_core.data.world import generate_world
    from mem1_core.models.model import build_tiny_model
    from mem1_core.models.tags import tag_scheme, turn_text
    from mem1_core.qa.env import QAEnvironment
    from mem1_core.rollout.generation import HFBackend, SamplingParams, StopStrings

    world = generate_world(load_config("smoke").world)
    tok = hub_standin(world.corpus["contents"].to_pylist(), 800)
    env = QAEnvironment(tok, retriever=None, topk=1)  # parse only: nothing is searched here
    cfg = ModelConfig(
        hidden_size=64, num_layers=2, num_heads=2, num_kv_heads=1, intermediate_size=128
    )
    model = build_tiny_model(cfg, tok).to(device)
    enc = [
        (tok.encode(c, add_special_tokens=False), tok.encode(w, add_special_tokens=False))
        for c, w, _, _ in TEXT_STOP_SCRIPTS
    ]
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    contexts = [ctx for ctx, _ in enc]
    hf = HFBackend(model, tok.pad_token_id, tok.eos_token_id, tokenizer=tok)

    def recites() -> list:
        model.eval()
        free = hf.generate(contexts, SamplingParams(48, (), 0.0))
        model.train()
        return free

    # Recite each script after its context, checked every 100 steps up to 2000: a fixed 400
    # steps at this lr left one script half-learnt on some machines (the thread count changes
    # the float sums, so the descent), and the check then failed on the model, not the stops.
    model.train()
    for step in range(2000):
        ctx, script = enc[step % len(enc)]
        logits = model(input_ids=torch.tensor([ctx + script], device=device)).logits
        target = torch.tensor(script, device=device)
        loss = torch.nn.functional.cross_entropy(logits[0, len(ctx) - 1 : -1].float(), target)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % 100 == 99:
            free = recites()
            if all(f.ids[: len(w)] == w for f, (_, w) in zip(free, enc, strict=True)):
                break
    model.eval()
    stop = StopStrings(tok, env.stop_strings)
    cuts = [stop.index(script) for _, script in enc]
    params = SamplingParams(48, env.stop_ids, 0.0, stop_strings=env.stop_strings)
    free = hf.generate(contexts, SamplingParams(48, (), 0.0))
    got = hf.generate(contexts, params)
    rows = []
    for (_, script), n, g, f, (_, _, action, said) in zip(
        enc, cuts, got, free, TEXT_STOP_SCRIPTS, strict=True
    ):
        parsed = env.parse(g.ids, g.finish)
        closer = env.codec.find(g.ids)[-1] if env.codec.find(g.ids) else None
        rows.append(
            {
                "recites_past_the_tag": f.ids[: len(script)] == script,
                "closing_tag_tokens": None if closer is None else closer.last - closer.first + 1,
                "ends_at_stop": g.ids == script[:n] and g.finish == "stop",
                "tail_after_tag": turn_text(tok, g.ids).rsplit(">", 1)[-1],
                "parsed": [parsed.action.value, parsed.text],
                "ok": g.ids == script[:n]
                and g.finish == "stop"
                and (parsed.action.value, parsed.text) == (action, said),
            }
        )
    # the per-token stop check's cost: random contexts, nothing stops them
    rng = random.Random(5)
    batch = [[rng.randrange(len(tok) - 1) for _ in range(64)] for _ in range(s.stop_rows)]
    timing = {}
    for name, p in (
        ("ids_only", SamplingParams(s.stop_tokens, (), 1.0)),
        ("stop_strings", SamplingParams(s.stop_tokens, (), 1.0, stop_strings=env.stop_strings)),
    ):
        best = math.inf
        for r in range(2):
            sync(device)
            t0 = time.perf_counter()
            hf.generate(batch, p, torch.Generator(device=device).manual_seed(r))
            sync(device)
            best = min(best, time.perf_counter() - t0)
        timing[name] = best
    emit(
        {
            "check": "text_stops",
            "backend": "hf",
            "tag_scheme": tag_scheme(tok),
            "tags_in_vocab": [t for t in TAGS if t in tok.get_vocab()],
            "scripts": rows,
            "generate_seconds": timing,
            "stop_check_overhead": timing["stop_strings"] / timing["ids_only"] - 1.0,
            "ok": tag_scheme(tok) == "text" and all(r["ok"] for r in rows),
        }
    )
    try:
        import vllm  # noqa: F401

        from mem1_core.rollout.generation_vllm import VLLMBackend
    except ImportError as e:
        emit({"check": "text_stops_vllm", "skipped": f"vLLM is not available: {e}"})
        return
    with tempfile.TemporaryDirectory() as tmp:
        model.save_pretrained(tmp, safe_serialization=True)
        tok.save_pretrained(tmp)
        config = Path(tmp) / "tokenizer_config.json"  # as on the hub: the model family's class
        config.write_text(
            json.dumps({**json.loads(config.read_text()), "tokenizer_class": "Qwen2Tokenizer"})
        )
        engine = VLLMBackend.from_pretrained_dir(
            tmp,
            eos_id=tok.eos_token_id,
            tokenizer=tok,
            dtype="float32",
            max_model_len=512,
            enforce_eager=True,
            gpu_memory_utilization=0.2,
        )
        v = engine.generate(contexts, params)
        both = [
            {
                "ids_equal_hf": a.ids == b.ids,
                "finish": a.finish,
                "parsed": [
                    env.parse(a.ids, a.finish).action.value,
                    env.parse(a.ids, a.finish).text,
                ],
                "max_abs_dlogp": max(
                    (abs(x - y) for x, y in zip(a.logprobs, b.logprobs, strict=False)), default=0.0
                ),
            }
            for a, b in zip(v, got, strict=True)
        ]
        emit(
            {
                "check": "text_stops_vllm",
                "vllm": vllm.__version__,
                "scripts": both,
                "ok": all(r["ids_equal_hf"] and r["finish"] == "stop" for r in both),
            }
        )
        del engine
