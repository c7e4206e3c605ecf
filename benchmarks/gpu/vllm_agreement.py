"""vllm: greedy agreement of vLLM (mem1_core.rollout.generation_vllm.VLLMBackend) and Hugging
Face generation on the same weights, before and after a weight sync; skipped if vLLM is
missing. Last but one, because the engine keeps its share of GPU memory."""

from __future__ import annotations

import random
import tempfile

import torch

from benchmarks.gpu.base import Check, qwen2
from mem1_core.config import ModelConfig


def run(c: Check) -> None:
    device, s, emit = c.device, c.sizes, c.emit
    try:
        import vllm  # noqa: F401

        from mem1_core.rollout.generation_vllm import VLLMBackend
    except ImportError as e:
        emit({"check": "vllm", "skipped": f"vLLM or its backend is not available: {e}"})
        return
    from mem1_core.rollout.generation import HFBackend, SamplingParams

    cfg = ModelConfig(
        hidden_size=256, num_layers=4, num_heads=4, num_kv_heads=2, intermediate_size=768
    )
    dtype = "bfloat16" if device == "cuda" else "float32"
    model = qwen2(cfg, s.vocab, "sdpa", dtype, device)
    with torch.no_grad():  # peaky next-token distributions: greedy is not decided by rounding
        model.get_input_embeddings().weight.mul_(10.0)
    rng = random.Random(3)
    contexts = [[rng.randrange(s.vocab - 2) for _ in range(rng.randint(8, 160))] for _ in range(32)]
    params = SamplingParams(max_new_tokens=48, stop_ids=(), temperature=0.0)
    with tempfile.TemporaryDirectory() as tmp:
        model.save_pretrained(tmp, safe_serialization=True)
        engine = VLLMBackend.from_pretrained_dir(
            tmp, dtype=dtype, max_model_len=1024, enforce_eager=True, gpu_memory_utilization=0.2
        )
        hf = HFBackend(model, pad_id=s.vocab - 1, eos_id=None, max_batch=32)
        for stage in ("initial", "after_weight_sync"):
            if stage == "after_weight_sync":  # other weights, sent the way the learner sends them
                other = qwen2(cfg, s.vocab, "sdpa", dtype, device, seed=1)
                with torch.no_grad():
                    other.get_input_embeddings().weight.mul_(10.0)
                model.load_state_dict(other.state_dict())
                engine.load_state_dict({k: v.detach().cpu() for k, v in model.state_dict().items()})
            a, b = hf.generate(contexts, params), engine.generate(contexts, params)
            prefix, gaps = [], [0.0]
            for x, y in zip(a, b, strict=True):
                n = next(
                    (i for i, (u, v) in enumerate(zip(x.ids, y.ids, strict=False)) if u != v),
                    min(len(x.ids), len(y.ids)),
                )
                prefix.append(n / max(len(x.ids), 1))
                gaps += [abs(u - v) for u, v in zip(x.logprobs[:n], y.logprobs[:n], strict=True)]
            agree = sum(p == 1.0 for p in prefix) / len(prefix)
            emit(
                {
                    "check": "vllm",
                    "stage": stage,
                    "dtype": dtype,
                    "sequences": len(contexts),
                    "identical_fraction": agree,
                    "mean_agreeing_prefix": sum(prefix) / len(prefix),
                    "max_abs_dlogp_agreeing": max(gaps),
                    "ok": sum(prefix) / len(prefix) >= 0.9,
                }
            )
        del engine
