"""The WebShop domain (mem1_core.webshop): WebShop's shopping tasks, one goal a task, searched
and clicked in a shop its environment holds (no index for the run to build)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mem1_core.domains.base import Domain, Units


class WebShopDomain(Domain):
    name = "webshop"
    units = Units("reward", "goals")

    def ensure_tasks(self, cfg, paths, split: str, n: int) -> Path:
        from mem1_core.webshop.run import ensure_shop_tasks

        return ensure_shop_tasks(cfg, paths, split, n)

    def make_env(self, cfg, paths, tokenizer, retriever=None):
        from mem1_core.webshop.run import make_webshop_env

        return make_webshop_env(cfg, paths, tokenizer)

    def has_teacher(self, cfg) -> bool:
        return True

    def tokenizer_texts(self, cfg, paths) -> list[str]:
        from mem1_core.webshop.run import training_shop_texts

        return training_shop_texts(cfg, paths)

    def evaluation_extras(self, cfg, paths, out: Path, agents: list[str], ns) -> dict[str, Any]:
        """Reward and peak tokens by instruction difficulty, WebShop's stand-in for N."""
        return {"difficulty": difficulty_tables(cfg, paths, out, agents, ns)}


def difficulty_tables(cfg, paths, out: Path, agents: list[str], ns) -> dict[str, str]:
    """Reward and peak tokens by instruction difficulty (mem1_core.webshop.difficulty), from the
    cells' trajectories and the test task file's difficulty column."""
    import pyarrow.parquet as pq

    from mem1_core.trajectory.record import read_trajectories
    from mem1_core.webshop.difficulty import write_difficulty
    from mem1_core.webshop.run import ensure_shop_tasks

    difficulty: dict[str, int] = {}
    trajs = {}
    for n in ns:
        t = pq.read_table(
            ensure_shop_tasks(cfg, paths, "test", n), columns=["task_id", "difficulty"]
        )
        difficulty |= dict(zip(*t.to_pydict().values(), strict=True))
        for agent in agents:
            cell = out / "trajectories" / f"{agent}_n{n}.parquet"
            if cell.is_file():
                trajs.setdefault(agent, []).extend(read_trajectories(cell))
    return write_difficulty(trajs, difficulty, out)
