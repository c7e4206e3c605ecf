"""Does recall pay? `mem1+recall` against plain MEM1 on a generated world with forgetting on,
one JSON line per measurement.

    python benchmarks/recall.py teacher --out runs/recall          # (a) the scripted teacher
    python benchmarks/recall.py sft --memory mem1 --out runs/recall --steps 50     # (b) SFT
    python benchmarks/recall.py sft --memory mem1+recall --out runs/recall --steps 50
    python benchmarks/recall.py eval --out runs/recall --policy base     # the shipped base
    python benchmarks/recall.py eval --out runs/recall --policy mem1     # runs/recall/sft_mem1
    python benchmarks/recall.py eval --out runs/recall --policy mem1+recall

`teacher`: the `tiny` world (seed 0), test split, for each N the first ceil(objectives / N)
tasks; the scripted teacher under `mem1` and `mem1+recall` at `teacher.forget_rate` (0.6, the
`tiny` profile's), and the perfect teacher under `mem1` as the ceiling. `sft`: the shipped base
(`data/base`) fine-tuned for `--steps` (within `--minutes`) on the forgetful teacher's N=2
training trajectories under one memory, saved to `OUT/sft_<memory>/policy`. `eval`: greedy, under the policy's
memory, on the test tasks of each N. Each line has EM (fraction of objectives, and its standard
error over tasks), peak tokens (mean and max over tasks), turns, recalls and generated tokens
per task; a `mem1+recall` line also has `paired_gain`, the mean per-task EM gain over `mem1`
on the same tasks, with its standard error (the `eval` lines need both policies' runs).
Each subcommand stays under a few minutes on one core, so they run one at a time.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

RECALL = "mem1+recall"


def setup(args):
    from mem1_core.config import load_config
    from mem1_core.domains.inputs import ensure_tokenizer, make_env, prepare

    over = [f"data.eval_objectives_per_n={args.objectives}", *args.overrides]
    cfg = load_config(args.profile, None, over)
    paths = prepare(cfg, Path(args.out).resolve() / "assets")
    tok = ensure_tokenizer(cfg, paths)
    return cfg, paths, tok, make_env(cfg, paths, tok)


def row(part: str, memory: str, n: int, trajs, seconds: float, **extra) -> dict:
    from mem1_core.evaluation.summary import summarize

    s = summarize(trajs, seconds)
    return {
        "part": part,
        "memory": memory,
        "n": n,
        **extra,
        "tasks": s["tasks"],
        "objectives": s["tasks"] * n,
        "em_frac": round(s["em_frac"], 4),
        "em_frac_se": round(s["em_frac_se"], 4),
        "unknown_rate": round(s["unknown_rate"], 4),
        "format_error_rate": round(s["format_error_rate"], 4),
        "peak_tokens": round(s["peak_tokens"], 1),
        "peak_tokens_max": s["peak_tokens_max"],
        "turns": round(s["turns"], 2),
        "recalls": round(s["recalls"], 2),
        "gen_tokens_per_task": round(s["gen_tokens"] / max(s["tasks"], 1), 1),
        "seconds_per_task": round(s["seconds_per_task"], 4),
    }


def paired_gain(base, other) -> dict:
    """Mean per-task EM-fraction gain of `other` over `base` (the same tasks), and its paired
    SE (mem1_core.evaluation.headline.paired_se; 0 for a single task)."""
    from mem1_core.evaluation.headline import paired_se

    a, b = ({t.task_id: t.reward for t in ts} for ts in (other, base))
    if set(a) != set(b):
        raise ValueError("paired_gain: the two plays are of different tasks")
    mean = sum(a[t] - b[t] for t in a) / len(a)
    return {"paired_gain": round(mean, 4), "paired_gain_se": round(paired_se(a, b) or 0.0, 4)}


def emit(record: dict) -> None:
    print(json.dumps(record), flush=True)


def cmd_teacher(args) -> None:
    from mem1_core.domains.inputs import load_tasks
    from mem1_core.qa.teacher import ScriptedTeacher
    from mem1_core.rollout.loop import rollout

    cfg, paths, tok, env = setup(args)
    rate = cfg.teacher.forget_rate
    for n in args.n:
        tasks = load_tasks(cfg, paths, "test", n)[: math.ceil(args.objectives / n)]
        plays = {}
        for name, memory, forget in (
            ("perfect", "mem1", 0.0),
            ("mem1", "mem1", rate),
            (RECALL, RECALL, rate),
        ):
            teacher = ScriptedTeacher(tok, tasks, forget_rate=forget, seed=cfg.teacher.seed)
            t0 = time.perf_counter()
            plays[name] = rollout(tasks, teacher, env, cfg.rollout, memory=memory)
            extra = {"agent": f"teacher-{name}", "forget_rate": forget}
            if name == RECALL:
                extra |= paired_gain(plays["mem1"], plays[name])
            emit(row("teacher", memory, n, plays[name], time.perf_counter() - t0, **extra))


def cmd_sft(args) -> None:
    from mem1_core.domains.inputs import load_tasks
    from mem1_core.models.model import save_model
    from mem1_core.models.policy import initial_policy
    from mem1_core.training.sft import step_options, teacher_trajectories, train_on_trajectories
    from mem1_core.trajectory.record import write_trajectories

    cfg, paths, tok, env = setup(args)
    out = Path(args.out).resolve() / f"sft_{args.memory}"
    n = cfg.data.train_objectives
    tasks = load_tasks(cfg, paths, "train", n)[: args.train_tasks]
    t0 = time.perf_counter()
    trajs = teacher_trajectories(
        tasks,
        tok,
        env,
        cfg.rollout,
        memory=args.memory,
        teacher=cfg.teacher,
    )
    write_trajectories(trajs, out / "teacher_trajectories.parquet")
    emit(row("sft-data", args.memory, n, trajs, time.perf_counter() - t0))
    model = initial_policy(cfg, tok)  # the shipped base (`model.base`)
    result = train_on_trajectories(
        model,
        trajs,
        tok.pad_token_id,
        minutes=args.minutes,
        max_steps=args.steps,
        **step_options(cfg),
        progress=False,
    )
    save_model(model, tok, out / "policy")
    emit(
        {
            "part": "sft",
            "memory": args.memory,
            "n": n,
            "teacher_trajectories": len(trajs),
            "steps": result.steps,
            "seconds": round(result.seconds, 1),
            "final_loss": round(result.final_loss, 4),
            "policy": str(out / "policy"),
        }
    )


def cmd_eval(args) -> None:
    from mem1_core.domains.inputs import load_tasks
    from mem1_core.evaluation.evaluate import run_eval
    from mem1_core.models.model import load_model
    from mem1_core.models.policy import initial_policy
    from mem1_core.trajectory.record import read_trajectories, write_trajectories

    cfg, paths, tok, env = setup(args)
    root = Path(args.out).resolve()
    if args.policy == "base":
        model, memories = initial_policy(cfg, tok), ["mem1"]
    else:
        model = load_model(root / f"sft_{args.policy}" / "policy", cfg.model, tok)
        memories = [args.policy]
    for n in args.n:
        tasks = load_tasks(cfg, paths, "test", n)[: math.ceil(args.objectives / n)]
        for memory in memories:
            trajs, seconds = run_eval(model, tok, env, tasks, cfg.rollout, memory=memory)
            agent = f"{args.policy}" if args.policy == "base" else f"sft-{args.policy}"
            out = root / "eval" / f"{agent}_n{n}.parquet"
            write_trajectories(trajs, out)
            extra = {"agent": agent}
            other = root / "eval" / f"sft-mem1_n{n}.parquet"
            if args.policy == RECALL and other.exists():
                extra |= paired_gain(read_trajectories(other), trajs)
            emit(row("eval", memory, n, trajs, seconds, **extra))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    for name, default_n, default_obj in (("teacher", [1, 2, 4, 8], 512), ("sft", [2], 128),
                                         ("eval", [2, 4], 128)):  # fmt: skip
        s = sub.add_parser(name)
        s.add_argument("--out", required=True)
        s.add_argument("--profile", default="tiny")
        s.add_argument("--n", type=int, nargs="+", default=default_n, help="objectives per task")
        s.add_argument(
            "--objectives", type=int, default=default_obj, help="objectives per N (tasks: /N)"
        )
        s.add_argument("--set", dest="overrides", action="append", default=[])
        if name == "sft":
            s.add_argument("--memory", required=True, choices=["mem1", RECALL])
            s.add_argument("--minutes", type=float, default=3.0, help="a cap on the wall time")
            s.add_argument(
                "--steps", type=int, default=50, help="optimizer steps (the same for both arms)"
            )
            s.add_argument("--train-tasks", type=int, default=2000)
        if name == "eval":
            s.add_argument("--policy", required=True, choices=["base", "mem1", RECALL])
    args = p.parse_args(argv)
    {"teacher": cmd_teacher, "sft": cmd_sft, "eval": cmd_eval}[args.cmd](args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
