"""A WebShop run's shops, tasks and tokenizer text, made into the run directory where missing
(as mem1_core.qa.tasks makes a QA run's world and tasks).

- `shops/shop{seed}/`: the embedded shops (mem1_core.webshop.generate), the training shop
  (`env.shop_seed`) and the held-out shop (`env.eval_shop_seed`); or the converted shop
  `env.shop_dir` for every split, its goals divided as WebShop's text environment divides
  them: shuffled with Python's `random.seed(233)` and `random.shuffle`, then goals 0-499 are
  the test set and 500-1,499 the dev set (`env.goal_split: webshop`; WebShop's baselines
  train on the rest), or MEM1's division, the first 500 for testing and all the rest for
  training (`env.goal_split: mem1`). A shop with too few goals for those sizes (not
  WebShop's) is cut in the same order by quarters: a quarter test, a quarter dev (`webshop`),
  the rest train.
- `tasks/{split}_n1.parquet`: the split's goals as rollout tasks (the task file columns, plus
  `difficulty`: the goal's attributes plus options, the domain's stand-in for N). Every WebShop
  task counts as one objective, so the pipeline's N is 1.
- the tiny tokenizer's text (`tokenizer_texts`): products, prompts and rendered pages.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.parquet as pq

from mem1_core.runs import atomic
from mem1_core.webshop.catalog import Shop, shop_size
from mem1_core.webshop.env import FORMAT_HINT, WebShopEnvironment, shop_tasks, webshop_prompt
from mem1_core.webshop.generate import generate_shop
from mem1_core.webshop.pages import Page, PageKind
from mem1_core.webshop.views import OBSERVATIONS, observe, render

if TYPE_CHECKING:
    from mem1_core.config import Config
    from mem1_core.runs.layout import RunPaths

TASKS_VERSION = "webshop-tasks-3"
"""Written into a task file's metadata; a file of another version is written again."""

WEBSHOP_SPLIT_SEED = 233
"""The seed WebShop's text environment shuffles its goals with (`random.seed(233)`)."""
WEBSHOP_TEST_GOALS = 500
"""WebShop's test set: the first 500 goals after the shuffle."""
WEBSHOP_DEV_GOALS = 1000
"""WebShop's dev set: the next 1,000 (goals 500-1,499)."""
SPLITS = ("train", "dev", "test")
GOAL_SPLITS = ("webshop", "mem1")

TASK_SCHEMA = pa.schema(
    [
        ("task_id", pa.string()),
        ("sources", pa.list_(pa.string())),
        ("n_objectives", pa.int32()),
        ("questions", pa.list_(pa.string())),
        ("golden_answers", pa.list_(pa.list_(pa.string()))),
        ("plans", pa.list_(pa.string())),
        ("prompt", pa.string()),
        ("split", pa.string()),
        ("difficulty", pa.int32()),
    ]
)


def training_shop_texts(cfg: Config, paths: RunPaths) -> list[str]:
    """The tiny tokenizer's training text for a run: its training shop's (never the held-out
    shop's, whose words it meets split into pieces, as an unseen name in QA)."""
    name, _ = split_goals(cfg, "train")
    return tokenizer_texts(run_shops(cfg, paths)[name])


def tokenizer_texts(shop: Shop, n_pages: int = 200) -> list[str]:
    """Text to train a tiny tokenizer on for a shop: every product's search text, every task
    prompt, and rendered results and item pages (their brackets, `< Prev`, `$` prices and the
    format hint must be in its vocabulary, or they read as unknown tokens)."""
    from mem1_core.webshop.search import product_text

    listed = tuple(p.asin for p in shop.products[:n_pages])
    shown = [Page(PageKind.ITEM, asin=a) for a in listed] + [Page(PageKind.RESULTS, results=listed)]
    instruction = shop.goals[0].instruction if shop.goals else ""
    pages = [render(page, shop.product, 10) for page in shown] + [FORMAT_HINT]
    pages += [observe("webshop", page, shop.product, 10, instruction) for page in shown[-3:]]
    prompts = [webshop_prompt(g.instruction, o) for g in shop.goals for o in OBSERVATIONS]
    return [product_text(p) for p in shop.products] + prompts + pages


def shop_name(seed: int) -> str:
    return f"shop{seed}"


def ensure_shop(cfg: Config, paths: RunPaths, seed: int) -> Path:
    """The embedded shop of `seed` under the run's `shops/`, generated where missing."""
    out = paths.root / "shops" / shop_name(seed)
    if not (out / "manifest.json").is_file():
        generate_shop(seed, cfg.env.n_products, cfg.env.n_goals).save(out)
    return out


def run_shops(cfg: Config, paths: RunPaths) -> dict[str, Shop]:
    """shop name -> shop of a run: the training and the held-out embedded shops, or the
    converted shop `env.shop_dir` (named `shop`)."""
    if cfg.env.shop_dir is not None:
        return {"shop": Shop.load(cfg.env.shop_dir)}
    return {
        shop_name(s): Shop.load(ensure_shop(cfg, paths, s))
        for s in (cfg.env.shop_seed, cfg.env.eval_shop_seed)
    }


def webshop_goal_order(n_goals: int) -> list[int]:
    """The goals' indices in the order WebShop's text environment holds them: its goal list
    shuffled with Python's `random` seeded 233."""
    order = list(range(n_goals))
    random.Random(WEBSHOP_SPLIT_SEED).shuffle(order)  # the same draws as random.seed + shuffle
    return order


def split_bounds(n_goals: int, goal_split: str = "webshop") -> dict[str, tuple[int, int]]:
    """split -> [start, end) in the shuffled order (module docstring); a split the division
    lacks (MEM1's has no dev set) is absent."""
    if goal_split not in GOAL_SPLITS:
        raise ValueError(f"env.goal_split={goal_split!r}: use one of {', '.join(GOAL_SPLITS)}")
    full = WEBSHOP_TEST_GOALS + (WEBSHOP_DEV_GOALS if goal_split == "webshop" else 0)
    if n_goals > full:
        test, dev = WEBSHOP_TEST_GOALS, full
    else:  # a small shop: quarters in the same order
        test = max(1, n_goals // 4)
        dev = 2 * test if goal_split == "webshop" else test
    bounds = {"test": (0, test), "dev": (test, dev), "train": (dev, n_goals)}
    if goal_split == "mem1":
        del bounds["dev"]
    return bounds


def split_goals(cfg: Config, split: str) -> tuple[str, list[int] | None]:
    """(shop name, goal indices in task order) of a split: the whole embedded shop of the
    split's seed (None: all its goals, in order), or a converted shop's goals divided as
    `env.goal_split` says (module docstring)."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {', '.join(SPLITS)}, got {split!r}")
    if cfg.env.shop_dir is None:
        if split == "dev":
            raise ValueError(
                "the embedded shops have no dev split (a training shop and a held-out shop): "
                "a dev split needs a converted shop, env.shop_dir"
            )
        seed = cfg.env.shop_seed if split == "train" else cfg.env.eval_shop_seed
        return shop_name(seed), None
    n = shop_size(cfg.env.shop_dir)["goals"]
    bounds = split_bounds(n, cfg.env.goal_split)
    if split not in bounds:
        raise ValueError(
            f"env.goal_split={cfg.env.goal_split} has no {split} split (MEM1 tests on the "
            "first 500 goals and trains on the rest): use env.goal_split=webshop"
        )
    start, end = bounds[split]
    return "shop", webshop_goal_order(n)[start:end]


def ensure_shop_tasks(cfg: Config, paths: RunPaths, split: str, n: int) -> Path:
    """The split's tasks file (capped as QA's: `data.max_train_tasks`, `data.eval_tasks`)."""
    if n != 1:
        raise ValueError(
            f"a WebShop task is one objective (N=1), not {n}: set data.train_objectives=1, "
            "data.eval_objectives=[1] and sft.warm_start_objectives=[1]"
        )
    out = paths.task_file(split, n)
    cap = cfg.data.max_train_tasks if split == "train" else cfg.data.eval_tasks(n)
    made_with = {
        "generator": TASKS_VERSION,
        "cap": str(cap),
        "observation": cfg.env.observation,
        "goal_split": cfg.env.goal_split,
    }
    if out.exists():
        meta = pq.read_schema(out).metadata or {}
        if all(meta.get(k.encode()) == v.encode() for k, v in made_with.items()):
            return out
    name, indices = split_goals(cfg, split)
    shop = run_shops(cfg, paths)[name]
    chosen = list(indices if indices is not None else range(len(shop.goals)))[:cap]
    tasks = {t.task_id: t for t in shop_tasks(shop, name, observation=cfg.env.observation)}
    rows = []
    for i in chosen:
        t, goal = tasks[f"{name}/{i}"], shop.goals[i]
        rows.append(
            {
                "task_id": t.task_id,
                "sources": [name],
                "n_objectives": 1,
                "questions": t.questions,
                "golden_answers": t.golden_answers,
                "plans": [],
                "prompt": t.prompt,
                "split": split,
                "difficulty": goal.difficulty,
            }
        )
    table = pa.Table.from_pylist(rows, schema=TASK_SCHEMA)
    table = table.replace_schema_metadata(made_with)
    return atomic.write_parquet(table, out)


def make_webshop_env(cfg: Config, paths: RunPaths, tokenizer) -> WebShopEnvironment:
    """The run's environment: its shops, page sizes, observation format, what a broken turn
    costs, and the reward's noun parser and option matching (all recorded with the run's
    config)."""
    return WebShopEnvironment(
        tokenizer,
        run_shops(cfg, paths),
        results_per_page=cfg.env.results_per_page,
        max_results=cfg.env.max_results,
        chat_template=cfg.rollout.chat_template,
        nouns=cfg.env.noun_parser,
        option_match=cfg.env.option_match,
        observation=cfg.env.observation,
        format_error=cfg.env.format_error,
    )
