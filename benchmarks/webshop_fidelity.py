"""What each chosen difference from WebShop changes, measured on a shop: one JSON line.

    python benchmarks/webshop_fidelity.py --shop DIR            # a saved shop (converted)
    python benchmarks/webshop_fidelity.py --seed 1 --products 2000 --goals 200   # embedded

- `option_match`: every purchase of each goal's target with each combination of its option
  values (the purchases an agent can make of the right product) is scored both ways,
  goal.py's (`webshop`: a synthetic goal's options as (group, value) pairs) and by value;
  the line counts the purchases whose reward differs, which way, and an example.
- the scripted teacher's purchases on the goals (its play is the warm start's data), scored
  both ways: how many rewards differ, and each way's mean.
- prices: how many products show a price range, whose page text is not the price the reward
  checks.
"""

from __future__ import annotations

import argparse
import itertools
import json
import time


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shop", default=None, help="a saved shop directory (Shop.save)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--products", type=int, default=2000)
    ap.add_argument("--goals", type=int, default=200)
    ap.add_argument("--max-goals", type=int, default=None, help="the first N goals only")
    ap.add_argument("--turns", type=int, default=10)
    args = ap.parse_args()

    from mem1_core.config import RolloutConfig
    from mem1_core.models.tokenizer import train_tiny_tokenizer
    from mem1_core.rollout.loop import rollout
    from mem1_core.webshop.catalog import Shop
    from mem1_core.webshop.env import WebShopEnvironment, shop_tasks
    from mem1_core.webshop.generate import generate_shop
    from mem1_core.webshop.reward import webshop_reward
    from mem1_core.webshop.run import tokenizer_texts
    from mem1_core.webshop.teacher import WebShopTeacher

    t0 = time.perf_counter()
    shop = (
        Shop.load(args.shop) if args.shop else generate_shop(args.seed, args.products, args.goals)
    )
    goals = shop.goals[: args.max_goals]

    def both(goal, product, chosen) -> tuple[float, float]:
        return tuple(
            webshop_reward(goal, product, chosen, product.price, option_match=m).total
            for m in ("webshop", "value")
        )

    purchases = changed = up = 0
    example = None
    for goal in goals:
        target = shop.target(goal)
        groups = sorted(target.options)
        for combo in itertools.product(*(target.options[g] for g in groups)):
            chosen = dict(zip(groups, combo, strict=True))
            ours, by_value = both(goal, target, chosen)
            purchases += 1
            if ours != by_value:
                changed += 1
                up += by_value > ours
                example = example or {
                    "wanted": goal.options,
                    "bought": chosen,
                    "webshop": round(ours, 4),
                    "value": round(by_value, 4),
                }

    tok = train_tiny_tokenizer(tokenizer_texts(shop), 3000)
    env = WebShopEnvironment(tok, {"shop": shop})
    tasks = shop_tasks(shop, "shop", limit=len(goals))
    cfg = RolloutConfig(
        turns_base=args.turns,
        turns_per_objective=0,
        gen_tokens_base=128,
        gen_tokens_per_objective=0,
    )
    trajs = rollout(tasks, WebShopTeacher(tok, env), env, cfg, memory="mem1", greedy=True)
    teacher = []
    for tr in trajs:
        if tr.answer is None:
            continue
        page = env.page(tr)
        product = shop.product(tr.answer.split(" ")[0])
        teacher.append(both(env.goal(tr.task_id), product, page.options))
    ranged = sum(" to " in p.shown_price for p in shop.products)
    print(
        json.dumps(
            {
                "shop": args.shop or f"embedded seed {args.seed}",
                "products": len(shop.products),
                "goals": len(goals),
                "target_purchases": purchases,
                "target_purchases_changed": changed,
                "changed_higher_by_value": up,
                "example": example,
                "teacher_purchases": len(teacher),
                "teacher_changed": sum(a != b for a, b in teacher),
                "teacher_reward_x100_webshop": 100
                * sum(a for a, _ in teacher)
                / max(1, len(teacher)),
                "teacher_reward_x100_value": 100
                * sum(b for _, b in teacher)
                / max(1, len(teacher)),
                "products_with_a_price_range": ranged,
                "seconds": round(time.perf_counter() - t0, 1),
            }
        )
    )


if __name__ == "__main__":
    main()
