"""The peak memory of one learner update: checkouts and settings side by side, each in a
process of its own (a process's peak RSS is its own), on the same trajectories.

    python benchmarks/learner_memory.py [--profile smol] [--tasks 4] [--objectives 2]
        [--tree PATH ...] [--variant "K=V,K=V" ...] [--threads 2]

The parent prepares a run directory and the scripted teacher's trajectories (real MEM1
trees: the profile's prompt, `<IS>`, queries, `<info>`) once; then for each checkout
(`--tree`: a directory holding a `mem1_core` to import, default this one; e.g. an older
commit's `git archive ... mem1_core data/profiles | tar -x -C DIR`) and each variant (extra
overrides, "" for none) a child builds the profile's learner (policy, reference, critic and
their AdamW) and runs one update of those trajectories in one minibatch. It reports the RSS
after the build and the peak during the update (Linux's VmHWM, reset before it), with the
update's seconds: a busy machine moves the seconds, hardly the bytes.

`--head N` measures the vocabulary head alone instead: the log-probs of N tokens (hidden
states to log-probs, forward and backward, `--dims` H x V), where the variant `unchunked`
takes all N in one chunk (mem1_core.trajectory.logprobs.VOCAB_CHUNK_ELEMENTS).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TREE = os.environ.get("MEM1_TREE")
"""In a child: the checkout whose mem1_core it imports."""
sys.path.insert(0, TREE or str(ROOT))


def _status_gb(field: str) -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024 / 1e9
    raise RuntimeError(f"no {field} in /proc/self/status")


def _overrides(args, variant: str) -> list[str]:
    extra = [v for v in variant.split(",") if v]
    return [
        f"ppo.minibatch_size={args.tasks}",
        f"ppo.micro_batch_size={args.micro_batch}",
        "ppo.ppo_epochs=1",
        *extra,
    ]


def head_child(args) -> dict:
    """The vocabulary head alone: log-probs of `args.head` tokens from random hidden states
    through a (V, H) projection (`args.dims`), forward and backward, under the profile's
    compute dtype; `unchunked` as variant takes every token in one chunk."""
    import torch

    from mem1_core.config import load_config
    from mem1_core.models.compute import resolve_autocast
    from mem1_core.trajectory import logprobs as lp

    torch.set_num_threads(args.threads)
    if (args.variant or [""])[0] == "unchunked":
        lp.VOCAB_CHUNK_ELEMENTS = 1 << 62  # one chunk; ignored by a checkout without chunks
    hidden_size, vocab = (int(x) for x in args.dims.split("x"))
    autocast = resolve_autocast(load_config(args.profile).model.autocast, "cpu")
    n = args.head
    torch.manual_seed(0)
    head = torch.nn.Linear(hidden_size, vocab, bias=False)
    hidden = torch.randn(1, n + 1, hidden_size, requires_grad=True)
    ids = torch.randint(0, vocab, (1, n + 1))
    prev = torch.arange(-1, n)[None]
    built = _status_gb("VmRSS")
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    seconds = []
    for _ in range(3):  # the best of three: a busy machine moves the seconds
        t0 = time.perf_counter()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast == "bfloat16"):
            logp, _ = lp.logprobs_from_hidden(hidden, head, ids, prev)
        logp.sum().backward()
        seconds.append(time.perf_counter() - t0)
    return {
        "head_tokens": n,
        "dims": args.dims,
        "rss_built_gb": round(built, 2),
        "peak_gb": round(_status_gb("VmHWM"), 2),
        "update_rise_gb": round(_status_gb("VmHWM") - built, 2),
        "update_seconds": round(min(seconds), 2),
    }


def head_seconds(args) -> dict[str, float]:
    """The head's forward and backward in this process, whole and in the default chunks,
    interleaved three times (the best of each): side by side on a busy machine."""
    import torch

    from mem1_core.config import load_config
    from mem1_core.models.compute import resolve_autocast
    from mem1_core.trajectory import logprobs as lp

    torch.set_num_threads(args.threads)
    hidden_size, vocab = (int(x) for x in args.dims.split("x"))
    bf16 = resolve_autocast(load_config(args.profile).model.autocast, "cpu") == "bfloat16"
    head = torch.nn.Linear(hidden_size, vocab, bias=False)
    hidden = torch.randn(1, args.head + 1, hidden_size, requires_grad=True)
    ids = torch.randint(0, vocab, (1, args.head + 1))
    prev = torch.arange(-1, args.head)[None]
    chunked = lp.VOCAB_CHUNK_ELEMENTS
    best: dict[str, float] = {}
    for _ in range(3):
        for name, elements in (("whole", 1 << 62), (f"chunks of {chunked} logits", chunked)):
            lp.VOCAB_CHUNK_ELEMENTS = elements
            t0 = time.perf_counter()
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
                logp, _ = lp.logprobs_from_hidden(hidden, head, ids, prev)
            logp.sum().backward()
            best[name] = min(best.get(name, float("inf")), time.perf_counter() - t0)
    lp.VOCAB_CHUNK_ELEMENTS = chunked
    return {k: round(v, 2) for k, v in best.items()}


def child(args) -> None:
    import torch

    if args.head:
        row = {"tree": TREE or str(ROOT), "variant": (args.variant or [""])[0] or "(none)"}
        print("RESULT " + json.dumps(row | head_child(args)), flush=True)
        return

    from mem1_core.config import load_config
    from mem1_core.training.learner import Learner
    from mem1_core.trajectory.record import read_trajectories

    torch.set_num_threads(args.threads)
    variant = (args.variant or [""])[0]
    cfg = load_config(args.profile, overrides=_overrides(args, variant))
    learner = Learner(cfg, args.root)
    trajs = read_trajectories(Path(args.root) / "teacher.parquet")
    built = _status_gb("VmRSS")
    with open("/proc/self/clear_refs", "w") as f:  # VmHWM := VmRSS from here on
        f.write("5")
    t0 = time.perf_counter()
    stats = learner.update(trajs, 0)
    seconds = time.perf_counter() - t0
    peak = _status_gb("VmHWM")
    row = {
        "tree": TREE or str(ROOT),
        "variant": variant or "(none)",
        "rss_built_gb": round(built, 2),
        "peak_gb": round(peak, 2),
        "update_rise_gb": round(peak - built, 2),
        "update_seconds": round(seconds, 1),
        "tree_tokens": stats["tree_tokens"],
        "gen_tokens": stats["gen_tokens"],
    }
    print("RESULT " + json.dumps(row), flush=True)


def teacher_trajectories(args, root: Path) -> None:
    """The scripted teacher's trajectories of `args.tasks` training tasks, into `root`."""
    from mem1_core.config import load_config
    from mem1_core.domains.inputs import ensure_tokenizer, load_tasks, make_env, prepare
    from mem1_core.qa.teacher import ScriptedTeacher
    from mem1_core.rollout.loop import rollout
    from mem1_core.trajectory.record import write_trajectories

    cfg = load_config(args.profile, overrides=_overrides(args, ""))
    paths = prepare(cfg, root)
    tok = ensure_tokenizer(cfg, paths)
    tasks = load_tasks(cfg, paths, "train", args.objectives)[: args.tasks]
    trajs = rollout(tasks, ScriptedTeacher(tok, tasks), make_env(cfg, paths, tok), cfg.rollout)
    for t in trajs:  # rewards that differ: advantages that are not all zero
        t.em = [float(t.group % 2)] * len(t.em)
    write_trajectories(trajs, root / "teacher.parquet")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profile", default="smol")
    ap.add_argument("--tasks", type=int, default=4, help="trajectories, one minibatch")
    ap.add_argument("--micro-batch", type=int, default=4, help="trajectories a pass")
    ap.add_argument("--objectives", type=int, default=2, help="N of the tasks")
    ap.add_argument("--tree", action="append", default=[], help="checkouts to compare")
    ap.add_argument("--variant", action="append", default=None, help='overrides, "" for none')
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--head", type=int, default=0, help="only the vocabulary head: N tokens")
    ap.add_argument("--dims", default="576x49152", help="the head's H x V (SmolLM2's)")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--root", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args)
        return
    args.variant = args.variant if args.variant is not None else [""]
    from mem1_core.models.compute import cpu_info

    print(json.dumps({"cpu": cpu_info().describe(), "threads": args.threads}), flush=True)
    root = Path(tempfile.mkdtemp(prefix="mem1-learner-memory-"))
    if not args.head:
        teacher_trajectories(args, root)
    rows = []
    for tree in args.tree or [str(ROOT)]:
        for variant in args.variant:
            cmd = [sys.executable, __file__, "--child", "--root", str(root)]
            cmd += ["--profile", args.profile, "--tasks", str(args.tasks)]
            cmd += ["--micro-batch", str(args.micro_batch), "--threads", str(args.threads)]
            cmd += ["--variant", variant, "--head", str(args.head), "--dims", args.dims]
            env = {**os.environ, "MEM1_TREE": str(Path(tree).resolve())}
            out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
            found = [ln for ln in out.stdout.splitlines() if ln.startswith("RESULT ")]
            if out.returncode or not found:
                sys.exit(f"{tree} {variant!r} failed:\n{out.stderr[-3000:]}")
            rows.append(json.loads(found[0].removeprefix("RESULT ")))
            print(json.dumps(rows[-1]), flush=True)
    if args.head:
        print(json.dumps({"head_seconds_side_by_side": head_seconds(args)}), flush=True)
    print("\ncheckout | variant | RSS built | peak in the update | rise | update s")
    for r in rows:
        print(
            f"{r['tree']} | {r['variant']} | {r['rss_built_gb']} GB | {r['peak_gb']} GB | "
            f"{r['update_rise_gb']} GB | {r['update_seconds']}"
        )


if __name__ == "__main__":
    main()
