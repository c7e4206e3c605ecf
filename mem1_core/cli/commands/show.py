"""`mem1 show RUN --agent NAME -n N --task K`: one evaluated trajectory, turn by turn, in the
terminal: the `<IS>` written, the query, the `<info>` (trimmed), the answer, the tokens in
context and pruned at each turn, and its outcome as its domain tells it (which objectives came
out right; in WebShop, what was bought and its reward): the same view as the evaluation's
sample artifacts, mem1_core.evaluation.samples."""

from __future__ import annotations

import argparse
from pathlib import Path


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("show", help="print one evaluated trajectory turn by turn")
    p.add_argument("run", help="run directory (its evaluation is RUN/eval)")
    p.add_argument("--agent", required=True, help="agent name (a row of eval/metrics.csv)")
    p.add_argument("-n", "--objectives", type=int, required=True, help="N of the task")
    p.add_argument(
        "--task", default="0", help="the task: its position among the test tasks (0 = first) or id"
    )
    p.add_argument(
        "--eval-dir",
        help="the evaluation's directory (default RUN/eval; a nightly's RUN/nightly/…)",
    )
    p.add_argument("--info-chars", type=int, default=None, help="trim <info> to this many chars")
    p.set_defaults(func=cmd_show)


def cmd_show(args: argparse.Namespace) -> int:
    from mem1_core.cli.main import UserError
    from mem1_core.evaluation.samples import INFO_CHARS, trajectory_file, trajectory_text
    from mem1_core.trajectory.record import read_trajectories

    run = Path(args.run)
    eval_dir = Path(args.eval_dir) if args.eval_dir else run / "eval"
    path = trajectory_file(eval_dir, args.agent, args.objectives)
    if not path.is_file():
        have = sorted(p.stem for p in (eval_dir / "trajectories").glob("*.parquet"))
        raise UserError(
            f"{path}: no trajectories (this evaluation has: {', '.join(have) or 'none'})"
        )
    trajs = read_trajectories(path)
    traj = _pick(trajs, args.task, UserError)
    questions = _questions(run, args.objectives).get(traj.task_id)
    print(f"{args.agent} (memory {traj.memory}), {path}")
    describe = _describe(eval_dir)
    print(trajectory_text(traj, questions, args.info_chars or INFO_CHARS, describe), end="")
    print(behaviour_lines(traj, trajs))
    return 0


def behaviour_lines(traj, trajs) -> str:
    """The task's behaviour and its cell's mean over every task, one line each."""
    from mem1_core.evaluation.behaviour import task_behaviour

    def line(b: dict, n: int) -> str:
        def f(key: str, digits: int = 2) -> str:
            return "–" if b[key] is None else f"{b[key]:.{digits}f}"

        return (
            f"answered {f('answered', 1)} of {n}, queries {f('queries', 1)} "
            f"({f('distinct_queries', 1)} distinct), turns {f('turns', 1)} of "
            f"{f('turns_budget', 0)}, answered early {f('early')}, format errors "
            f"{f('format_errors', 1)}, found {f('found')}, retention {f('retention')}"
        )

    rows = [task_behaviour(t) for t in trajs]
    mean = {
        k: (sum(v) / len(v) if (v := [r[k] for r in rows if r[k] is not None]) else None)
        for k in rows[0]
    }
    return (
        f"behaviour of this task: {line(task_behaviour(traj), traj.n_objectives)}\n"
        f"behaviour of its cell ({len(trajs)} tasks, mean): {line(mean, traj.n_objectives)}"
    )


def _describe(eval_dir: Path):
    """How the evaluation's domain tells an outcome: the domain its headline records (one
    written before headlines recorded it: QA's view, per objective)."""
    import json

    from mem1_core.domains.outcome import objectives_outcome
    from mem1_core.domains.registry import get_domain
    from mem1_core.evaluation.headline import HEADLINE_FILE

    path = eval_dir / HEADLINE_FILE
    domain = json.loads(path.read_text()).get("domain") if path.is_file() else None
    return get_domain(domain).sample_outcome if domain else objectives_outcome


def _pick(trajs, task: str, error: type[Exception]):
    if task.isdigit():
        k = int(task)
        if k >= len(trajs):
            raise error(f"--task {k}: there are {len(trajs)} tasks (0..{len(trajs) - 1})")
        return trajs[k]
    for t in trajs:
        if t.task_id == task:
            return t
    raise error(f"--task {task!r}: no such task id (e.g. {trajs[0].task_id if trajs else '—'})")


def _questions(run: Path, n: int) -> dict[str, list[str]]:
    """task id -> questions from the run's test tasks, where the run still has them."""
    path = run / "tasks" / f"test_n{n}.parquet"
    if not path.is_file():
        return {}
    import pyarrow.parquet as pq

    table = pq.read_table(path, columns=["task_id", "questions"]).to_pylist()
    return {r["task_id"]: r["questions"] for r in table}
