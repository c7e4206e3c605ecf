"""A WebShop run's shops, tasks and tokenizer text, made into the run directory where missing
(as mem1_core.data.run_tasks makes a QA run's world and tasks).

- `shops/shop{seed}/`: the embedded shops (mem1_core.webshop.catalog), the training shop
  (`env.shop_seed`) and the held-out shop (`env.eval_shop_seed`); or the converted shop
  `env.shop_dir` for both splits, its goals divided as WebShop divides its goals (the first
  500 for testing, the rest for training; a smaller shop: a quarter for testing).
- `tasks/{split}_n1.parquet`: the split's goals as rollout tasks (the task file columns, plus
  `difficulty`: the goal's attributes plus options, the domain's stand-in for N). Every WebShop
  task counts as one objective, so the pipeline's N is 1.
- the tiny tokenizer's text (`tokenizer_texts`): products, prompts and rendered pages.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.parquet as pq

from mem1_core.runs import atomic
from mem1_core.webshop.catalog import Shop, generate_shop
from mem1_core.webshop.env import FORMAT_HINT, WebShopEnvironment, shop_tasks, webshop_prompt
from mem1_core.webshop.pages import Page, PageKind, render

if TYPE_CHECKING:
    from mem1_core.config import Config
    from mem1_core.runs.layout import RunPaths

TASKS_VERSION = "webshop-tasks-2"
"""Written into a task file's metadata; a file of another version is written again."""

WEBSHOP_TEST_GOALS = 500
"""WebShop's split of its goals: the first 500 are the test set."""

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

    pages = [
        render(Page(PageKind.ITEM, asin=p.asin), shop.product, 10) for p in shop.products[:n_pages]
    ]
    listed = tuple(p.asin for p in shop.products[:n_pages])
    pages += [render(Page(PageKind.RESULTS, results=listed), shop.product, 10), FORMAT_HINT]
    prompts = [webshop_prompt(g.instruction) for g in shop.goals]
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


def split_goals(cfg: Config, split: str) -> tuple[str, range | None]:
    """(shop name, goal indices) of a split: the whole embedded shop of the split's seed, or
    WebShop's division of a converted shop's goals."""
    if split not in ("train", "test"):
        raise ValueError(f"split must be train or test, got {split!r}")
    if cfg.env.shop_dir is None:
        seed = cfg.env.shop_seed if split == "train" else cfg.env.eval_shop_seed
        return shop_name(seed), None
    n = len(Shop.load(cfg.env.shop_dir).goals)
    cut = WEBSHOP_TEST_GOALS if n > 2 * WEBSHOP_TEST_GOALS else max(1, n // 4)
    return "shop", range(cut) if split == "test" else range(cut, n)


def ensure_shop_tasks(cfg: Config, paths: RunPaths, split: str, n: int) -> Path:
    """The split's tasks file (capped as QA's: `data.max_train_tasks`, `data.eval_tasks`)."""
    if n != 1:
        raise ValueError(
            f"a WebShop task is one objective (N=1), not {n}: set data.train_objectives=1, "
            "data.eval_objectives=[1] and sft.warm_start_objectives=[1]"
        )
    out = paths.task_file(split, n)
    cap = cfg.data.max_train_tasks if split == "train" else cfg.data.eval_tasks(n)
    if out.exists() and (pq.read_schema(out).metadata or {}).get(b"generator") == (
        TASKS_VERSION.encode()
    ):
        meta = pq.read_schema(out).metadata or {}
        if meta.get(b"cap") == str(cap).encode():
            return out
    name, indices = split_goals(cfg, split)
    shop = run_shops(cfg, paths)[name]
    chosen = list(indices if indices is not None else range(len(shop.goals)))[:cap]
    tasks = {t.task_id: t for t in shop_tasks(shop, name)}
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
    table = table.replace_schema_metadata({"generator": TASKS_VERSION, "cap": str(cap)})
    return atomic.write_parquet(table, out)


def make_webshop_env(cfg: Config, paths: RunPaths, tokenizer) -> WebShopEnvironment:
    """The run's environment: its training and held-out shops, its page sizes."""
    return WebShopEnvironment(
        tokenizer,
        run_shops(cfg, paths),
        results_per_page=cfg.env.results_per_page,
        max_results=cfg.env.max_results,
        chat_template=cfg.rollout.chat_template,
    )
