"""Does training learn? Warm start -> PPO and -> SFT from the same warm start, then greedy
held-out reward (EM fraction on test tasks, whose entities no training task mentions) of each
at N = the training objectives and more, with wall times; prints the table and the PPO reward
curve and writes a PNG.

    python benchmarks/learning.py --out runs/learning                # tiny profile budgets
    python benchmarks/learning.py --out runs/learning --ppo-minutes 10 --sft-minutes 10 \
        --eval-tasks 128 --eval-objectives 1 2 4 8                   # the README's numbers
    python benchmarks/learning.py --out runs/l2 --init runs/learning/warm_start --objectives 1

With the `tiny` profile's `model.base` (data/base, `mem1 pretrain`) the warm start is the
shipped base itself; `--set model.base=null` trains one from random weights instead.

The unknown rate is the fraction of objectives answered `?`: the habit of a forgetful teacher
(`teacher.forget_rate`), which SFT copies and PPO on the task reward can unlearn.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True)
    p.add_argument("--profile", default="tiny")
    p.add_argument("--init", default=None, help="an existing warm start (skips training one)")
    p.add_argument("--objectives", type=int, default=None, help="N of PPO/SFT (default: config)")
    p.add_argument("--warm-minutes", type=float, default=None)
    p.add_argument("--ppo-minutes", type=float, default=None)
    p.add_argument("--sft-minutes", type=float, default=None)
    p.add_argument("--eval-tasks", type=int, default=64, help="held-out tasks per N")
    p.add_argument(
        "--eval-objectives",
        type=int,
        nargs="+",
        default=None,
        help="N of the held-out evaluation (default: N of training and twice it)",
    )
    p.add_argument("--no-ray", action="store_true")
    p.add_argument("--set", dest="overrides", action="append", default=[])
    args = p.parse_args(argv)

    from mem1_core.config import load_config

    over = list(args.overrides)
    if args.objectives:
        over.append(f"data.train_objectives={args.objectives}")
    if args.ppo_minutes is not None:
        over += [f"ppo.minutes={args.ppo_minutes}", "ppo.iterations=100000"]
    # compose enough test tasks (the profile's cap is the pipeline's, 8 per N for `tiny`)
    over.insert(0, f"data.max_eval_tasks={args.eval_tasks}")
    cfg = load_config(args.profile, None, over)
    ns = args.eval_objectives or [cfg.data.train_objectives, 2 * cfg.data.train_objectives]
    out = Path(args.out).resolve()
    walls: dict[str, float] = {}

    from mem1_core.runs.layout import resolve_init
    from mem1_core.training.sft import train_sft
    from mem1_core.training.train_rl import train_rl

    warm = Path(args.init).resolve() if args.init else out / "warm_start"
    if not args.init:
        t0 = time.perf_counter()
        train_sft(
            cfg, warm, warm_start=True, assets_dir=out, resume=True, minutes=args.warm_minutes
        )
        walls["warm start"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    ppo_dir = out / "ppo"
    train_rl(cfg, ppo_dir, resume=ppo_dir.exists(), init=warm, use_ray=not args.no_ray)
    walls["ppo"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    sft_dir = out / "sft"
    train_sft(
        cfg,
        sft_dir,
        objectives=cfg.data.train_objectives,
        init=resolve_init(warm),
        assets_dir=out,
        resume=True,
        minutes=args.sft_minutes,
    )
    walls["sft"] = time.perf_counter() - t0

    rows = heldout(
        cfg,
        out,
        {
            "warm start": resolve_init(warm),
            "after SFT": resolve_init(sft_dir),
            "after PPO": resolve_init(ppo_dir),
        },
        args.eval_tasks,
        ns,
    )
    curve = [json.loads(x) for x in (ppo_dir / "metrics.jsonl").read_text().splitlines() if x]
    print(
        f"held-out greedy reward (EM fraction) and unknown rate, {args.eval_tasks} test "
        f"tasks per N; trained on N={cfg.data.train_objectives}, teacher forget rate "
        f"{cfg.teacher.forget_rate}:"
    )
    print("  " + " " * 11 + "".join(f"  N={n:<2} EM ± SE     unknown" for n in ns))
    for name, per_n in rows.items():
        print(
            f"  {name:<11}"
            + "".join(
                f"  {per_n[n]['em_frac']:.3f} ± {per_n[n]['em_frac_se']:.3f}  "
                f"{per_n[n]['unknown_rate']:.3f}  "
                for n in ns
            )
        )
    print("wall seconds: " + ", ".join(f"{k} {v:.0f}" for k, v in walls.items()))
    print("PPO iteration, train reward (sampled), unknown rate, held-out reward:")
    for r in curve:
        print(
            f"  {r['iteration']:>4} {r['reward']:.3f} {r.get('unknown_rate', float('nan')):.3f}"
            f" {r.get('eval/reward', '')}"
        )
    png = plot(curve, rows, ns, out / "learning.png")
    (out / "learning.json").write_text(
        json.dumps({"heldout": rows, "walls": walls, "config": cfg.to_dict()}, indent=1)
    )
    print(f"plot: {png}")
    return 0


def heldout(
    cfg, out: Path, policies: dict[str, Path], n_tasks: int, ns: list[int]
) -> dict[str, dict[int, dict]]:
    """Greedy metrics of each policy on the first n_tasks test tasks of each N."""
    from mem1_core.evaluation.evaluate import evaluate_policy
    from mem1_core.models.model import load_model
    from mem1_core.runs.assets import ensure_tokenizer, load_tasks, make_env, prepare

    paths = prepare(cfg, out)
    tok = ensure_tokenizer(cfg, paths)
    env = make_env(cfg, paths, tok)
    tasks = {n: load_tasks(cfg, paths, "test", n)[:n_tasks] for n in ns}
    out_rows: dict[str, dict[int, dict]] = {}
    for name, p in policies.items():
        model = load_model(p, cfg.model, tok)
        out_rows[name] = {
            n: evaluate_policy(model, tok, env, tasks[n], cfg.rollout, memory="mem1") for n in ns
        }
    return out_rows


def plot(curve: list[dict], heldout: dict[str, dict[int, dict]], ns: list[int], path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax, bx) = plt.subplots(1, 2, figsize=(11, 4))
    it = [r["iteration"] for r in curve]
    ax.plot(it, [r["reward"] for r in curve], ".-", label="train reward (sampled)")
    if any("unknown_rate" in r for r in curve):
        ax.plot(it, [r.get("unknown_rate") for r in curve], ".:", label="unknown rate (sampled)")
    ev = [(r["iteration"], r["eval/reward"]) for r in curve if r.get("eval/reward") is not None]
    if ev:
        ax.plot(*zip(*ev, strict=True), "o-", label="held-out reward (greedy)")
    ax.set_xlabel("PPO iteration")
    ax.set_title("PPO")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    width = 0.8 / max(len(heldout), 1)
    for k, (name, per_n) in enumerate(heldout.items()):
        xs = [i + k * width for i in range(len(ns))]
        bars = bx.bar(xs, [per_n[n]["em_frac"] for n in ns], width, label=name)
        bx.bar_label(bars, fmt="%.2f", fontsize=7)
    bx.set_xticks(
        [i + width * (len(heldout) - 1) / 2 for i in range(len(ns))], [f"N={n}" for n in ns]
    )
    bx.set_ylabel("held-out reward (EM fraction, greedy)")
    bx.set_title("held-out test tasks")
    bx.legend(fontsize=8)
    fig.savefig(path, dpi=120, bbox_inches="tight")
    return path


if __name__ == "__main__":
    sys.exit(main())
