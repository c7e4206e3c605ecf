"""The scripted WebShop teacher's ceiling: its reward on an embedded shop, under MEM1 and the
full context, one JSON line per memory.

    python benchmarks/webshop_teacher.py --seed 1 --products 2000 --goals 200

The shop is `generate_shop(seed, products, goals)` (seed 1: the held-out shop of the default
config); the tokenizer is the tiny one trained on that shop's text and pages; the budget is
`--turns` turns of up to 128 tokens, `--per-page` results a page of 50. Each line: reward ×100
and its standard error over goals, success rate (reward 1), turns, format errors, the share
of goals where it bought the exact target, mean peak tokens, and seconds. Under a minute on
one core.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time


def main() -> None:
    from mem1_core.models.compute import cpu_info

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--products", type=int, default=2000)
    ap.add_argument("--goals", type=int, default=200)
    ap.add_argument("--turns", type=int, default=10)
    ap.add_argument("--per-page", type=int, default=10)
    args = ap.parse_args()

    from mem1_core.config import RolloutConfig
    from mem1_core.models.tokenizer import train_tiny_tokenizer
    from mem1_core.rollout.loop import rollout
    from mem1_core.webshop.env import WebShopEnvironment, shop_tasks
    from mem1_core.webshop.generate import generate_shop
    from mem1_core.webshop.run import tokenizer_texts
    from mem1_core.webshop.teacher import WebShopTeacher

    shop = generate_shop(args.seed, args.products, args.goals)
    tok = train_tiny_tokenizer(tokenizer_texts(shop), 3000)
    env = WebShopEnvironment(tok, {"shop": shop}, results_per_page=args.per_page)
    tasks = shop_tasks(shop, "shop")
    cfg = RolloutConfig(
        turns_base=args.turns,
        turns_per_objective=0,
        gen_tokens_base=128,
        gen_tokens_per_objective=0,
    )
    for memory in ("mem1", "full"):
        t0 = time.perf_counter()
        trajs = rollout(tasks, WebShopTeacher(tok, env), env, cfg, memory=memory, greedy=True)
        rewards = [t.reward for t in trajs]
        m = env.metrics(trajs)
        exact = [(t.answer or "").split(" ")[0] == t.golden_answers[0][0] for t in trajs]
        print(
            json.dumps(
                {
                    "memory": memory,
                    "shop_seed": args.seed,
                    "products": args.products,
                    "goals": len(trajs),
                    "reward_x100": round(m["reward_x100"], 2),
                    "reward_x100_se": round(
                        100 * statistics.stdev(rewards) / len(rewards) ** 0.5, 2
                    ),
                    "success_rate": round(m["success_rate"], 3),
                    "turns": round(m["turns"], 2),
                    "format_errors": m["format_errors"],
                    "bought_target": round(sum(exact) / len(exact), 3),
                    "peak_tokens": round(statistics.mean(t.peak_tokens for t in trajs), 1),
                    "seconds": round(time.perf_counter() - t0, 1),
                    "cpu": cpu_info().describe(),
                }
            )
        )


if __name__ == "__main__":
    main()
