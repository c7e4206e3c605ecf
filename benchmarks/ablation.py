"""PPO runs side by side: which learning rate, which estimator (docs/results.md's ablations).

    python benchmarks/ablation.py --out runs/ablation.png \
        "GAE lr 1e-5=runs/smol-1/ppo_mem1/seed0" "GAE lr 3e-5=runs/smol-lr3/ppo_mem1/seed0" \
        "GRPO lr 1e-5=runs/smol-grpo/ppo_mem1/seed0"

Each argument is NAME=RUN (a `mem1 train ppo|grpo` run directory, or a PPO arm × seed of an
experiment run, `<run>/ppo_mem1/seed<k>` or `<run>/ppo_full/seed<k>`). It
reads each run's metrics.jsonl and prints, per run: iterations, optimiser steps, minutes, the
sampled reward (mean of the first and of the last four iterations), the largest KL to the
start, and every held-out evaluation (greedy, `ppo.eval_every`) at the training N and at the
longer N (`ppo.eval_objectives`) with its standard error. The plot puts the same against the
run's minutes (runs of different estimators cost different time per iteration: equal
minutes is the fair comparison on one machine) and optimiser steps.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

HELD_OUT = "eval/reward"
"""The held-out EM fraction at the training N; `eval/n{N}/reward` at the longer N."""


def read_run(run_dir: Path) -> list[dict]:
    """The run's metrics.jsonl rows, each with its minutes since the start (`minutes`) and
    the optimiser steps taken up to its end (`steps`; metrics.jsonl counts them per
    iteration)."""
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        raise SystemExit(f"{run_dir}: no metrics.jsonl (not a PPO run directory?)")
    rows = [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
    if not rows:
        raise SystemExit(f"{path}: empty (the run has not finished an iteration)")
    steps = 0
    for r in rows:
        r["minutes"] = r.get("elapsed_seconds", 0.0) / 60
        steps += r.get("train/optimizer_steps", 0)
        r["steps"] = steps
    return rows


def held_out(rows: list[dict]) -> dict[str, list[tuple[dict, float, float | None]]]:
    """Per held-out key (`eval/reward`, `eval/n8/reward`, …): (row, EM fraction, SE) where the
    run evaluated it."""
    keys = sorted({k for r in rows for k in r if k == HELD_OUT or _longer_n(k)}, key=_n_order)
    out = {}
    for key in keys:
        se_key = key.replace("reward", "em_frac_se")
        out[key] = [(r, r[key], r.get(se_key)) for r in rows if r.get(key) is not None]
    return out


def _longer_n(key: str) -> bool:
    return key.startswith("eval/n") and key.endswith("/reward")


def _n_order(key: str) -> int:
    return 0 if key == HELD_OUT else int(key[len("eval/n") : -len("/reward")])


def label(key: str) -> str:
    return "the training N" if key == HELD_OUT else f"N={_n_order(key)}"


def summary(name: str, rows: list[dict]) -> list[str]:
    first = [r["reward"] for r in rows[:4]]
    last = [r["reward"] for r in rows[-4:]]
    lines = [
        f"{name}: {len(rows)} iterations, {rows[-1]['steps']} optimiser "
        f"steps, {rows[-1]['minutes']:.1f} min ({rows[-1].get('estimator', '?')}); sampled "
        f"reward {sum(first) / len(first):.3f} -> {sum(last) / len(last):.3f} (first / last "
        f"4 iterations); KL to the start at most {max(r.get('kl', 0.0) for r in rows):.3f}"
    ]
    for key, pts in held_out(rows).items():
        cells = ", ".join(
            f"it {r['iteration'] + 1}: {em:.3f}" + ("" if se is None else f" ± {se:.3f}")
            for r, em, se in pts
        )
        lines.append(f"  held-out, {label(key)}: {cells}")
    return lines


def plot(runs: dict[str, list[dict]], path: Path) -> Path:
    """Held-out EM (training N solid, longer N dashed; ± SE) against minutes and against
    optimiser steps, the sampled reward and the KL against minutes."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 4, figsize=(20, 4.2))
    by_min, by_step, sampled, kl = axes
    for k, (name, rows) in enumerate(runs.items()):
        color = f"C{k}"
        for key, pts in held_out(rows).items():
            style = "o-" if key == HELD_OUT else "s--"
            tag = f"{name}, {label(key)}"
            se = [s or 0.0 for _, _, s in pts]
            em = [e for _, e, _ in pts]
            for ax, x in ((by_min, "minutes"), (by_step, "steps")):
                xs = [r[x] for r, _, _ in pts]
                ax.errorbar(xs, em, yerr=se, fmt=style, color=color, capsize=2, label=tag)
        minutes = [r["minutes"] for r in rows]
        sampled.plot(minutes, [r["reward"] for r in rows], ".-", color=color, label=name)
        kl.plot(minutes, [r.get("kl", 0.0) for r in rows], ".-", color=color, label=name)
    titles = (
        (by_min, "held-out EM (greedy) ± SE", "minutes"),
        (by_step, "held-out EM (greedy) ± SE", "optimiser steps"),
        (sampled, "sampled reward (training N)", "minutes"),
        (kl, "KL to the start (per token)", "minutes"),
    )
    for ax, title, xlabel in titles:
        ax.set_title(title)
        ax.set_xlabel(xlabel)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return path


def parse_run(spec: str) -> tuple[str, Path]:
    name, sep, run = spec.rpartition("=")  # a name may hold "=" (lr=1e-5), a path rarely
    if not sep or not name or not run:
        raise SystemExit(f"{spec!r}: give each run as NAME=RUN_DIR")
    return name, Path(run)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("runs", nargs="+", help="NAME=RUN_DIR, a PPO run each")
    p.add_argument("--out", default=None, help="the plot (PNG); none without it")
    args = p.parse_args(argv)
    runs = dict(parse_run(s) for s in args.runs)
    if len(runs) < len(args.runs):
        raise SystemExit("two runs share a name")
    curves = {name: read_run(d) for name, d in runs.items()}
    for name, rows in curves.items():
        print("\n".join(summary(name, rows)))
    if args.out:
        print(f"plot: {plot(curves, Path(args.out))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
