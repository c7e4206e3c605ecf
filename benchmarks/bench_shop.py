"""The embedded shop's costs and difficulty, one JSON line.

    python benchmarks/bench_shop.py [--seed 0] [--products 5000] [--goals 1000]

Times generation, the BM25 index, a search (all goals' queries in one batch) and a reward
call; then, searching each goal's instruction up to " with " (its attributes and type, not
its options or price), where the target ranks (first, first page of 10, top 50) and what two
simple shoppers score: buying the first result, and the best product of the first page, each
with the goal's option values where the product offers them (else its first values).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time


def main() -> None:
    from mem1_core.models.compute import cpu_info
    from mem1_core.webshop.generate import generate_shop
    from mem1_core.webshop.reward import webshop_reward
    from mem1_core.webshop.search import ShopSearch

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--products", type=int, default=5000)
    ap.add_argument("--goals", type=int, default=1000)
    args = ap.parse_args()

    t = time.perf_counter()
    shop = generate_shop(args.seed, args.products, args.goals)
    t_generate = time.perf_counter() - t
    t = time.perf_counter()
    search = ShopSearch(shop.products)
    t_index = time.perf_counter() - t
    queries = [g.instruction.split(" with ")[0] for g in shop.goals]
    t = time.perf_counter()
    results = search.search_many(queries)
    t_search = (time.perf_counter() - t) / len(queries)

    def buy(goal, asin):
        p = shop.product(asin)
        chosen = {
            k: goal.options[k] if goal.options.get(k) in v else v[0] for k, v in p.options.items()
        }
        return webshop_reward(goal, p, chosen, p.price, nouns="standin").total

    t = time.perf_counter()
    first = [buy(g, r[0]) if r else 0.0 for g, r in zip(shop.goals, results, strict=True)]
    t_reward = (time.perf_counter() - t) / len(first)
    page = [
        max((buy(g, a) for a in r[:10]), default=0.0)
        for g, r in zip(shop.goals, results, strict=True)
    ]
    ranks = [
        r.index(g.asin) if g.asin in r else None for g, r in zip(shop.goals, results, strict=True)
    ]
    n = len(ranks)
    print(
        json.dumps(
            {
                "cpu": cpu_info().describe(),
                "seed": args.seed,
                "products": args.products,
                "goals": args.goals,
                "generate_s": round(t_generate, 3),
                "index_s": round(t_index, 3),
                "search_ms": round(t_search * 1e3, 3),
                "reward_us": round(t_reward * 1e6, 1),
                "target_first": round(sum(r == 0 for r in ranks) / n, 3),
                "target_top10": round(sum(r is not None and r < 10 for r in ranks) / n, 3),
                "target_top50": round(sum(r is not None for r in ranks) / n, 3),
                "first_result_reward": round(statistics.mean(first), 3),
                "first_result_success": round(sum(x == 1.0 for x in first) / n, 3),
                "best_of_page_reward": round(statistics.mean(page), 3),
                "best_of_page_success": round(sum(x == 1.0 for x in page) / n, 3),
            }
        )
    )


if __name__ == "__main__":
    main()
