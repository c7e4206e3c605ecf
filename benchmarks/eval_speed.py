"""The evaluation's rollout three ways, side by side in one process: `whole`, each turn's
context run whole in one left-padded forward; `gib`, each trajectory's keys and values carried
from one turn to the next (mem1_core.rollout.generation.TurnCache: the task prompt under every
memory, the whole last context under the full context) in a cache of at most 1 GiB, the rest of
each context in one left-padded forward (how it ran before the two changes below); `now`, the
TurnCache sized by the memory free (`HFBackend.turn_cache`) and the prefill in chunks of rows of
similar length where that pays for another forward (`prefill_chunks`). Greedy, the same tasks,
each memory × N cell played every way one after the other (compare the ratios: these machines
are noisy).

    python benchmarks/eval_speed.py --run RUN --policy RUN/warm_start/policy \\
        [--profile smol] [--threads 2] [--ways gib now] [--cells mem1:2:16 full:8:4]

RUN is a run directory with its assets (world, index, tasks, or a WebShop run's shops: a warm
start's has them), and a cell is memory:N:tasks from the test split (WebShop: N=1,
`--profile webshop-smol`). `--ways` picks the ways, the first the baseline. For each cell it
prints one JSON line: each way's wall time, the ratios to the baseline, the tokens each prefill
ran (the model's forward over more than one token, pads included), and how many trajectories
came out with the same generated ids and the same EM as the baseline (under bf16 autocast a
context computed in pieces rounds differently from one computed whole, so a greedy turn can
flip where two tokens are nearly tied; in float32 they agree to float rounding).
"""

from __future__ import annotations

import argparse
import json
import time

import torch


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--run", required=True, help="a run directory with its assets")
    ap.add_argument("--policy", required=True, help="the policy to evaluate")
    ap.add_argument("--profile", default="smol")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--cells", nargs="+", default=["mem1:2:16", "mem1:8:4", "full:8:4"])
    ap.add_argument("--ways", nargs="+", default=["whole", "gib", "now"],
                    choices=["whole", "gib", "now"], help="the first is the baseline")  # fmt: skip
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    from mem1_core.config import load_config
    from mem1_core.domains.inputs import ensure_tokenizer, load_tasks, make_env, prepare
    from mem1_core.evaluation.evaluate import run_eval
    from mem1_core.models.model import load_model
    from mem1_core.rollout import generation
    from mem1_core.rollout.generation import HFBackend

    cfg = load_config(args.profile, None, [])
    paths = prepare(cfg, args.run)
    tok = ensure_tokenizer(cfg, paths)
    env = make_env(cfg, paths, tok)
    model = load_model(args.policy, cfg.model, tok)
    prefill = {"tokens": 0}
    forward = model.forward

    def counted(*a, **kw):
        if kw["input_ids"].shape[1] > 1:
            prefill["tokens"] += kw["input_ids"].numel()
        return forward(*a, **kw)

    model.forward = counted
    ways = tuple(args.ways)
    forward_tokens = generation.PREFILL_FORWARD_TOKENS
    totals = dict.fromkeys(ways, 0.0)
    for cell in args.cells:
        memory, n, k = cell.split(":")
        tasks = load_tasks(cfg, paths, "test", int(n))[: int(k)]
        row: dict = {"memory": memory, "N": int(n), "tasks": len(tasks)}
        trajs = {}
        for way in ways:
            backend = HFBackend(
                model, tok.pad_token_id, tok.eos_token_id, cfg.rollout.batch_size, tokenizer=tok
            )
            backend.reuses_prefixes = way != "whole"
            if way == "gib":
                backend.turn_cache = lambda: generation.TurnCache(2**30)
            # one padded forward (no chunk pays for itself) but `now`
            generation.PREFILL_FORWARD_TOKENS = forward_tokens if way == "now" else float("inf")
            prefill["tokens"] = 0
            t0 = time.perf_counter()
            trajs[way], _ = run_eval(
                model, tok, env, tasks, cfg.rollout, memory=memory, backend=backend
            )
            row[f"{way}_s"] = round(time.perf_counter() - t0, 2)
            row[f"{way}_prefill_tokens"] = prefill["tokens"]
            totals[way] += row[f"{way}_s"]
        base = ways[0]
        a = trajs[base]
        for way in ways[1:]:
            b = trajs[way]
            row[f"speedup_{way}"] = round(row[f"{base}_s"] / row[f"{way}_s"], 2)
            row[f"same_ids_{way}"] = sum(
                [t.gen_ids for t in x.turns] == [t.gen_ids for t in y.turns]
                for x, y in zip(a, b, strict=True)
            )
            row[f"same_em_{way}"] = sum(x.em == y.em for x, y in zip(a, b, strict=True))
        for way in ways:
            row[f"em_{way}"] = round(sum(sum(t.em) / len(t.em) for t in trajs[way]) / len(a), 3)
            row[f"reward_{way}"] = round(sum(t.reward for t in trajs[way]) / len(a), 3)
        print(json.dumps(row), flush=True)
    print(
        "all cells: "
        + ", ".join(f"{w} {totals[w]:.1f} s" for w in ways)
        + f"; {ways[0]} / {ways[-1]} "
        + f"{totals[ways[0]] / max(totals[ways[-1]], 1e-9):.2f}x"
    )


if __name__ == "__main__":
    main()
