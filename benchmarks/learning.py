"""Does training learn? Warm start -> PPO and -> SFT from the same warm start, then greedy
held-out reward (EM fraction on test tasks, whose entities no training task mentions) of each,
with wall times; prints the table and the PPO reward curve and writes a PNG.

    python benchmarks/learning.py --out runs/learning                # everything, tiny profile
    python benchmarks/learning.py --out runs/l2 --init runs/learning/warm_start --objectives 1
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
    p.add_argument("--eval-tasks", type=int, default=48)
    p.add_argument("--no-ray", action="store_true")
    p.add_argument("--set", dest="overrides", action="append", default=[])
    args = p.parse_args(argv)

    from mem1_core.config import load_config

    over = list(args.overrides)
    if args.objectives:
        over.append(f"data.train_objectives={args.objectives}")
    if args.ppo_minutes is not None:
        over += [f"ppo.minutes={args.ppo_minutes}", "ppo.iterations=100000"]
    cfg = load_config(args.profile, None, over)
    out = Path(args.out).resolve()
    walls: dict[str, float] = {}

    from mem1_core.ray_runtime import resolve_init
    from mem1_core.sft import train_sft
    from mem1_core.train_rl import train_rl

    warm = Path(args.init).resolve() if args.init else out / "warm_start"
    if not args.init:
        t0 = time.perf_counter()
        train_sft(cfg, warm, warm_start=True, assets_dir=out, resume=True,
                  minutes=args.warm_minutes)
        walls["warm start"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    ppo_dir = out / "ppo"
    train_rl(cfg, ppo_dir, resume=ppo_dir.exists(), init=warm, use_ray=not args.no_ray)
    walls["ppo"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    sft_dir = out / "sft"
    train_sft(cfg, sft_dir, objectives=cfg.data.train_objectives, init=resolve_init(warm),
              assets_dir=out, resume=True, minutes=args.sft_minutes)
    walls["sft"] = time.perf_counter() - t0

    rows = heldout(cfg, out, {"warm start": resolve_init(warm), "after SFT": resolve_init(sft_dir),
                              "after PPO": resolve_init(ppo_dir)}, args.eval_tasks)
    curve = [json.loads(x) for x in (ppo_dir / "metrics.jsonl").read_text().splitlines() if x]
    print(f"held-out greedy reward (EM fraction), N={cfg.data.train_objectives}, "
          f"{args.eval_tasks} test tasks:")
    for name, r in rows.items():
        print(f"  {name:<11} {r:.4f}")
    print("wall seconds: " + ", ".join(f"{k} {v:.0f}" for k, v in walls.items()))
    print("PPO iteration, train reward (sampled), held-out reward:")
    for r in curve:
        print(f"  {r['iteration']:>4} {r['reward']:.3f} {r.get('eval/reward', '')}")
    png = plot(curve, rows, out / "learning.png")
    (out / "learning.json").write_text(json.dumps({"heldout": rows, "walls": walls}, indent=1))
    print(f"plot: {png}")
    return 0


def heldout(cfg, out: Path, policies: dict[str, Path], n_tasks: int) -> dict[str, float]:
    from mem1_core.assets import ensure_tokenizer, load_tasks, make_env, prepare
    from mem1_core.evaluate import evaluate_policy
    from mem1_core.model import load_model

    paths = prepare(cfg, out)
    tok = ensure_tokenizer(cfg, paths)
    env = make_env(cfg, paths, tok)
    tasks = load_tasks(cfg, paths, "test", cfg.data.train_objectives)[:n_tasks]
    return {name: evaluate_policy(load_model(p, cfg.model, tok), tok, env, tasks, cfg.rollout,
                                  policy="mem1")["em_frac"] for name, p in policies.items()}


def plot(curve: list[dict], heldout: dict[str, float], path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot([r["iteration"] for r in curve], [r["reward"] for r in curve], ".-",
            label="PPO train reward (sampled)")
    ev = [(r["iteration"], r["eval/reward"]) for r in curve if r.get("eval/reward") is not None]
    if ev:
        ax.plot(*zip(*ev, strict=True), "o-", label="PPO held-out (greedy)")
    for (name, v), style in zip(heldout.items(), ("--", ":", "-."), strict=False):
        ax.axhline(v, linestyle=style, color="gray", label=f"{name} held-out {v:.3f}")
    ax.set_xlabel("PPO iteration")
    ax.set_ylabel("reward (EM fraction)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.savefig(path, dpi=120, bbox_inches="tight")
    return path


if __name__ == "__main__":
    sys.exit(main())
