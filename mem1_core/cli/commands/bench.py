"""`mem1 bench <name>`: micro-benchmarks, each printing one JSON object per measured cell.

The benchmarks live in the repository's `benchmarks/` package, not in the library; a command
imports its module from there (the checkout's root goes on sys.path when it is not already).
Add a benchmark by writing an `add_arguments(parser)` and a `run(args) -> int` and listing
them in BENCHES.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

# mem1 is installed editable (`pip install -e`), so the checkout sits above the package.
CHECKOUT = Path(__file__).resolve().parents[3]


@dataclass(frozen=True)
class Bench:
    help: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]


# Flag -> TrajectoryBenchConfig field; unset flags keep the config's defaults (not
# repeated here, and importing torch only when the bench runs keeps `mem1 --help` fast).
_TRAJECTORY_FLAGS: dict[str, tuple[type, str]] = {
    "turns": (int, "numbers of turns T (default 2 4 8 16)"),
    "memories": (str, "memory policies: mem1 full truncate (default mem1 full)"),
    "trajectories": (int, "trajectories per batch B"),
    "prompt_len": (int, "mean prompt tokens"),
    "gen_len": (int, "mean generated tokens per turn"),
    "info_len": (int, "mean info block tokens"),
    "jitter": (float, "lengths drawn in mean * [1 - jitter, 1 + jitter]"),
    "model": (
        str,
        "a pretrained model instead of the tiny one: hub name, directory, .gguf, or "
        "smollm2-135m-instruct",
    ),
    "vocab_size": (int, "tiny Qwen2 vocabulary"),
    "hidden_size": (int, "tiny Qwen2 hidden size"),
    "num_layers": (int, "tiny Qwen2 layers"),
    "num_heads": (int, "tiny Qwen2 attention heads"),
    "num_kv_heads": (int, "tiny Qwen2 key/value heads"),
    "intermediate_size": (int, "tiny Qwen2 MLP width"),
    "repeats": (int, "timed forward passes per measurement (best of)"),
    "seed": (int, "seed of the synthetic trajectories and the model"),
    "threads": (int, "torch intra-op threads (default: torch's)"),
    "clock": (
        str,
        "wall (default) or cpu: process CPU time, steadier on a shared machine (with --threads 1)",
    ),
}
_MANY = {"turns", "memories"}


def load_benchmark(name: str) -> ModuleType:
    """The module `benchmarks.<name>` of the checkout this package is installed from."""
    if not (CHECKOUT / "benchmarks" / f"{name}.py").is_file():
        raise SystemExit(
            f"{CHECKOUT / 'benchmarks' / name}.py not found: `mem1 bench` needs the repository "
            "checkout (install it with `pip install -e .`)"
        )
    if str(CHECKOUT) not in sys.path:
        sys.path.insert(0, str(CHECKOUT))
    return importlib.import_module(f"benchmarks.{name}")


def _trajectory_args(p: argparse.ArgumentParser) -> None:
    for name, (kind, help_) in _TRAJECTORY_FLAGS.items():
        flag = "--" + name.replace("_", "-")
        p.add_argument(flag, type=kind, nargs="+" if name in _MANY else None, help=help_)
    p.add_argument("--no-flex", dest="flex", action="store_false", help="skip FlexAttention")
    p.add_argument("--out", default=None, help="also write the rows here as JSON lines")


def _trajectory_run(args: argparse.Namespace) -> int:
    from mem1_core.runs.atomic import write_text

    bench = load_benchmark("bench_trajectory")
    TrajectoryBenchConfig, run_trajectory_bench = (
        bench.TrajectoryBenchConfig,
        bench.run_trajectory_bench,
    )
    given = {k: getattr(args, k) for k in _TRAJECTORY_FLAGS if getattr(args, k) is not None}
    given = {k: tuple(v) if k in _MANY else v for k, v in given.items()}
    cfg = TrajectoryBenchConfig(**given, flex=args.flex)
    rows = run_trajectory_bench(cfg, emit=lambda row: print(json.dumps(row), flush=True))
    if args.out:
        write_text("".join(json.dumps(r) + "\n" for r in rows), args.out)
    return 0


BENCHES: dict[str, Bench] = {
    "trajectory": Bench(
        help="flattened tree of turn contexts vs per-turn recompute (exactness, tokens, time)",
        add_arguments=_trajectory_args,
        run=_trajectory_run,
    ),
}


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("bench", help="micro-benchmarks (one JSON object per line)")
    benches = p.add_subparsers(dest="bench", required=True, metavar="BENCH")
    for name, bench in BENCHES.items():
        bp = benches.add_parser(name, help=bench.help)
        bench.add_arguments(bp)
        bp.set_defaults(func=bench.run)
