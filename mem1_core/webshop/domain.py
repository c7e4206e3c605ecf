"""The WebShop domain (mem1_core.webshop): WebShop's shopping tasks, one goal a task, searched
and clicked in a shop its environment holds (no index for the run to build)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from mem1_core.domains.base import Domain, Units
from mem1_core.domains.outcome import Outcome


class WebShopDomain(Domain):
    name = "webshop"
    units = Units(
        "reward",
        "goals",
        scale=100.0,
        success=1.0,
        per_objective=False,
        held_out="goals (none of them a training goal)",
        scoring=(
            "Scored with WebShop's reward (the bought item's attributes, options, price and "
            "type against the goal's, 0..1), ×100 as WebShop and MEM1 report it; success: "
            "reward 1."
        ),
        credited="successful tasks (reward 1)",
    )
    """WebShop's units: the average reward ×100 and the success rate (reward 1), over held-out
    goals (WebShop's `web_agent_site/envs/web_agent_text_env.py` and MEM1's WebShop table)."""

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

    def sample_outcome(self, traj, questions: Sequence[str] | None = None) -> Outcome:
        """What was bought (the item's title as a results page listed it, its asin and the
        options chosen: the trajectory's last click before Buy Now) and its reward."""
        return purchase_outcome(traj, questions, self.units.success)

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


def purchase_outcome(traj, questions: Sequence[str] | None, success: float | None) -> Outcome:
    """A WebShop trajectory's outcome: its reward (and whether it is a success), the
    instruction where known, and what was bought, or that nothing was."""
    from mem1_core.webshop.env import purchase
    from mem1_core.webshop.views import listed_title

    reward = traj.reward
    bought = purchase(traj.answer)
    facts = [("instruction", questions[0])] if questions else []
    if bought is None:
        what = "nothing"
        facts.append(("bought", "nothing: the episode ended without a purchase"))
    else:
        asin, options = bought
        title = listed_title((t.info_text for t in traj.turns), asin)
        what = asin
        item = f"{title} ({asin})" if title else asin
        facts.append(("bought", f"{item}, options: {options or 'none chosen'}"))
    won = success is not None and reward == success
    facts.append(("reward", f"{reward:.2f}" + (", a success" if won else "")))
    return Outcome(f"reward {reward:.2f}, bought {what}", facts=tuple(facts))
