"""The evaluation's cells played by Hugging Face in this process and by vLLM in the vLLM venv
(`eval.backend=vllm`: mem1_core.evaluation.vllm_cells, the path the evaluation stage takes),
side by side in one run: the same policy, tasks and cells, greedy, one backend after the other.

    python benchmarks/eval_vllm.py --run RUN --policy RUN/policy [--profile smol] \\
        [--threads 2] [--cells mem1:2:16 mem1:8:4 full:8:4] [--compile]

RUN is a run directory with its assets (world, index, tasks: a warm start's has them); a cell
is memory:N:tasks from the test split. Prints one JSON line per cell (each backend's rollout
seconds and generated tokens/s, EM, how many trajectories generated the same ids) and one for
the whole: each backend's wall time from nothing to the last cell, Hugging Face's including
loading the policy, vLLM's including the child's start, imports and engine start. Under bf16
the two engines round differently, so a greedy turn can part where two tokens are nearly tied:
compare EM, not ids alone. `--compile`: the engine with torch.compile on a CPU too (the
evaluation runs it eager there: it starts faster).
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--run", required=True, help="a run directory with its assets")
    ap.add_argument("--policy", required=True, help="the policy to evaluate")
    ap.add_argument("--profile", default="smol")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--cells", nargs="+", default=["mem1:2:16", "mem1:8:4", "full:8:4"])
    ap.add_argument("--compile", action="store_true", help="vLLM with torch.compile on a CPU")
    ap.add_argument("--out", help="where the cells go (default: a temporary directory)")
    args = ap.parse_args()

    import torch

    torch.set_num_threads(args.threads)
    from mem1_core.config import load_config
    from mem1_core.domains.inputs import ensure_tokenizer, load_tasks, make_env, prepare
    from mem1_core.evaluation.cells import (
        Cell,
        cell_record,
        finished_cell,
        record_path,
        trajectories_path,
    )
    from mem1_core.evaluation.evaluate import run_eval
    from mem1_core.evaluation.summary import summarize
    from mem1_core.evaluation.vllm_cells import choose_player, generated_tokens
    from mem1_core.models.model import load_model

    cfg = load_config(args.profile, None, ["eval.backend=vllm"])
    paths = prepare(cfg, args.run)
    tok = ensure_tokenizer(cfg, paths)
    env = make_env(cfg, paths, tok)
    policy = str(Path(args.policy).resolve())
    out = Path(args.out or tempfile.mkdtemp(prefix="eval_vllm."))
    specs = []
    for spec in args.cells:
        memory, n, k = spec.split(":")
        tasks = load_tasks(cfg, paths, "test", int(n))[: int(k)]
        specs.append((f"{memory}-{n}-{k}", memory, int(n), tasks))

    todo = [
        Cell(name, n, tasks, trajectories_path(out, name, n),
             cell_record("bench", policy, memory, cfg.eval.scorer, tasks), policy)
        for name, memory, n, tasks in specs
    ]  # fmt: skip

    # Hugging Face, in this process, as the evaluation stage plays it
    t0 = time.perf_counter()
    model = load_model(policy, cfg.model, tok)
    hf = {}
    for name, memory, _n, tasks in specs:
        trajs, seconds = run_eval(model, tok, env, tasks, cfg.rollout, memory=memory,
                                  scorer=cfg.eval.scorer)  # fmt: skip
        hf[name] = (trajs, seconds)
    hf_wall = time.perf_counter() - t0
    del model

    # vLLM, in the vLLM venv's Python, through the player the stage uses
    player = choose_player(cfg, paths.root)
    if args.compile:
        player.engine = {"enforce_eager": False}
    t0 = time.perf_counter()
    player(todo, lambda cell: None)
    vllm_wall = time.perf_counter() - t0
    engine_seconds = None
    rows = []
    for cell in todo:
        name = cell.agent
        done = finished_cell(cell)
        assert done is not None, f"vLLM did not finish {name}"
        trajs, seconds = done
        record = json.loads(record_path(cell.path).read_text())
        engine_seconds = record["engine_seconds"]
        h_trajs, h_seconds = hf[name]
        same = sum(
            [t.gen_ids for t in a.turns] == [t.gen_ids for t in b.turns]
            for a, b in zip(h_trajs, trajs, strict=True)
        )
        em_same = sum(a.em == b.em for a, b in zip(h_trajs, trajs, strict=True))
        row = {
            "cell": name,
            "hf_seconds": round(h_seconds, 1),
            "vllm_seconds": round(seconds, 1),
            "hf_tokens_per_s": round(generated_tokens(h_trajs) / h_seconds, 1),
            "vllm_tokens_per_s": round(generated_tokens(trajs) / seconds, 1),
            "hf_em": round(summarize(h_trajs)["em_frac"], 3),
            "vllm_em": round(summarize(trajs)["em_frac"], 3),
            "same_ids": f"{same}/{len(trajs)}",
            "same_em": f"{em_same}/{len(trajs)}",
        }
        rows.append(row)
        print(json.dumps(row), flush=True)
    whole = {
        "hf_wall": round(hf_wall, 1),
        "vllm_wall": round(vllm_wall, 1),
        "vllm_engine_start": round(engine_seconds, 1),
        "compile": args.compile,
        "hf_rollout": round(sum(r["hf_seconds"] for r in rows), 1),
        "vllm_rollout": round(sum(r["vllm_seconds"] for r in rows), 1),
        "out": str(out),
    }
    print(json.dumps(whole), flush=True)


if __name__ == "__main__":
    main()
