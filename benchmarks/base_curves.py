"""Compare pretrained bases (`mem1 pretrain`) by their held-out curves: EM per N over steps
and wall minutes, one line per base, side by side; prints each base's evaluations and the
first step at which each N reached a threshold, and writes a PNG (plot_base_curves).

    python benchmarks/base_curves.py --base shipped=data/base \
        --base big=/work/ptruns/big1 --out base_curves.png

A base is a finished base directory (its `manifest.json`) or a pretraining run still going
(`<out>/checkpoint/state.json`, its last checkpoint): a run is compared while it trains.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def read_base(path: Path) -> dict:
    """A base's record: `manifest.json` of a base directory, else the last checkpoint's state
    (or the finished base's manifest) of a `mem1 pretrain --out` directory."""
    for candidate in (
        path / "manifest.json",
        path / "base" / "manifest.json",
        path / "checkpoint" / "state.json",
    ):
        if candidate.exists():
            rec = json.loads(candidate.read_text())
            rec["held_out"] = rec.get("held_out") or rec.get("evals") or []
            weights = candidate.parent / "policy" / "model.safetensors"
            if "parameters" not in rec and weights.exists():
                rec["parameters"] = _parameters(weights)
            return rec
    raise SystemExit(f"{path}: neither a base (manifest.json) nor a pretraining run (checkpoint/)")


def _parameters(weights: Path) -> int:
    """Parameter count from a safetensors file's header (no tensors loaded)."""
    from safetensors import safe_open

    with safe_open(str(weights), "pt") as f:
        total = 0
        for key in f.keys():
            n = 1
            for d in f.get_slice(key).get_shape():
                n *= d
            total += n
        return total


def first_reaching(evals: list[dict], n: int, threshold: float) -> dict | None:
    """The first evaluation whose EM at `n` is at least `threshold`, or None."""
    for row in sorted(evals, key=lambda r: r["step"]):
        if row.get(f"em_n{n}", -1.0) >= threshold:
            return row
    return None


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--base", action="append", required=True, metavar="NAME=PATH")
    p.add_argument("--out", default="base_curves.png")
    p.add_argument("--threshold", type=float, default=0.9, help="for 'first step at EM >= x'")
    args = p.parse_args(argv)
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from mem1_core.evaluation.scaling import held_out_series, plot_base_curves

    bases = {}
    for spec in args.base:
        name, sep, path = spec.partition("=")
        if not sep:
            raise SystemExit(f"--base {spec}: expected NAME=PATH")
        bases[name] = read_base(Path(path))
    for name, rec in bases.items():
        series = held_out_series(rec["held_out"])
        ns = list(series)
        print(
            f"\n## {name}: {rec.get('parameters', '?')} parameters, {rec.get('step', rec.get('steps'))} steps"
        )
        print("| step | minutes | " + " | ".join(f"N={n}" for n in ns) + " |")
        print("|---" * (len(ns) + 2) + "|")
        for row in sorted(rec["held_out"], key=lambda r: r["step"]):
            cells = [
                f"{row[f'em_n{n}']:.2f} ± {row.get(f'se_n{n}', 0):.2f}" if f"em_n{n}" in row else ""
                for n in ns
            ]
            print(f"| {row['step']} | {row.get('minutes', '')} | " + " | ".join(cells) + " |")
        for n in ns:
            hit = first_reaching(rec["held_out"], n, args.threshold)
            where = f"step {hit['step']} ({hit.get('minutes')} min)" if hit else "not reached"
            print(f"first EM >= {args.threshold} at N={n}: {where}")
    out = plot_base_curves(bases, Path(args.out))
    print(f"\nwrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
