"""The GPU check: one prepared script for a machine with a GPU; JSON lines out.

    python benchmarks/gpu_check.py --out runs/gpu_check                   # CUDA, ~6 min, one H200
    python benchmarks/gpu_check.py --device cpu --quick --out /tmp/gpu_check   # CPU, ~1-2 min

Sections (`--only` picks some), each a module of benchmarks/gpu/ with its own docstring,
each printing JSON lines with "check" and, where there is a pass criterion, "ok"; a section
that raises prints its error and the others still run:

- exactness: the tree contract with FlexAttention against the definition, in fp32 and bf16.
- train_step: one training step over the flattened tree vs re-running every turn: time, memory.
- ppo: a few PPO iterations through the trainer: rollout and training tokens/s.
- text_stops: tags as text under a pretrained tokenizer: stop strings end a turn at its closing tag (HF, vLLM).
- vllm: greedy agreement of vLLM and Hugging Face generation, before and after a weight sync.
- vllm_deployment: the deployment's vLLM rollouts driven from the Prefect venv (CUDA only).

Exit status 0 if every "ok" is true. Rows also go to OUT/gpu_check.jsonl.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a file: the checkout

import torch  # noqa: E402

from benchmarks.gpu import (  # noqa: E402
    exactness,
    ppo,
    smol,
    text_stops,
    train_step,
    vllm_agreement,
    vllm_deployment,
)
from benchmarks.gpu.base import Check, sizes_for  # noqa: E402

SECTIONS: dict[str, Callable[[Check], None]] = {
    "exactness": exactness.run,
    "train_step": train_step.run,
    "ppo": ppo.run,
    "smol": smol.run,
    "text_stops": text_stops.run,
    "vllm": vllm_agreement.run,
    "vllm_deployment": vllm_deployment.run,
}
"""Section name (--only) -> its run, in the order they run: vLLM last but one, because the
engine keeps its share of GPU memory; the deployment last, in its own processes."""


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True)
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    p.add_argument("--quick", action="store_true", help="smallest sizes (the CPU smoke test)")
    p.add_argument("--only", nargs="+", choices=list(SECTIONS), default=list(SECTIONS))
    p.add_argument("--threads", type=int, default=None, help="torch threads (CPU)")
    p.add_argument(
        "--prefect-python",
        default=None,
        help="vllm_deployment: the Prefect venv's python (default $MEM1_VENV or ./.venv)",
    )
    args = p.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        print("no CUDA device: run with --device cpu --quick for the CPU smoke", file=sys.stderr)
        return 2
    if args.threads:
        torch.set_num_threads(args.threads)
    # fp32 means fp32: TF32 matmuls would blur the exactness check.
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    os.environ.setdefault("WANDB_MODE", "offline")
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    sizes = sizes_for(args.device, args.quick)
    rows: list[dict] = []
    sink = (out / "gpu_check.jsonl").open("w")

    def emit(row: dict) -> None:
        rows.append(row)
        line = json.dumps(row, sort_keys=True)
        print(line, flush=True)
        sink.write(line + "\n")
        sink.flush()

    emit(
        {
            "check": "setup",
            "device": args.device,
            "quick": args.quick,
            "torch": torch.__version__,
            "gpu": torch.cuda.get_device_name() if args.device == "cuda" else None,
            "sizes": asdict(sizes),
        }
    )
    check = Check(args.device, sizes, out, emit, args.prefect_python)
    for name, section in SECTIONS.items():
        if name not in args.only:
            continue
        t0 = time.perf_counter()
        try:
            section(check)
        except Exception as e:  # report and go on: one device session should yield all rows
            emit(
                {
                    "check": name,
                    "error": f"{type(e).__name__}: {e}",
                    "ok": False,
                    "traceback": traceback.format_exc()[-2000:],
                }
            )
        emit({"check": f"{name}_done", "seconds": time.perf_counter() - t0})
        gc.collect()  # the next section (Ray actors, the vLLM engine) wants the GPU memory
        if args.device == "cuda":
            torch.cuda.empty_cache()
    sink.close()
    failed = [r["check"] for r in rows if r.get("ok") is False]
    print(json.dumps({"check": "summary", "failed": failed, "ok": not failed}), flush=True)
    return 0 if not failed else 1


if __name__ == "__main__":
    sys.exit(main())
