"""The three ways to score a pruned trajectory (`trajectory.mode`: tree, turns, concat) side by
side on SmolLM2-135M-Instruct (the `smol` profile's model), on the same trajectories:

    python benchmarks/trajectory_modes.py [--ns 2,4,8] [--tasks 1] [--threads 2] [--layers 30]
        [--micro-batch-tokens T]

Trajectories: the scripted teacher plays `--tasks` held-out tasks at each N with MEM1 memory
(the smol profile's prompt, chat template and retriever), so every mode sees the same turns.
The rollout's log-probs are what the sampler computes for those tokens, teacher-forced: each
turn's real context re-run alone (mem1_core.trajectory.logprobs.per_turn_logprobs), float32.

`--layers K` keeps only SmolLM2's first K of its 30 decoder layers (the embeddings, the final
norm and the head stay): the same token layouts and attention patterns at 1/(30/K) of the layer
cost, for a run that must fit a few minutes on a shared machine. The modes' learner-time ratio
per layer is the full model's; the head's cost (generated tokens only, the same in every mode)
weighs more at small K, which pulls the ratios towards 1. Float rounding grows with depth.

Each mode runs in its own subprocess (a clean peak RSS), float32, `--threads` torch threads,
and at each N takes one learner iteration on those trajectories: the no-grad scoring pass
(old log-probs), advantages (REINFORCE++: no critic, no reference, so the timing is the
policy's passes alone) and one PPO epoch (one minibatch, passes of 4 rows, or of at most
`--micro-batch-tokens` tokens in every mode: a row is a whole tree or one turn). Per mode
and N it prints one JSON line:
- `gap_max/turn_k`, `gap_mean/turn_k`: |learner log-prob - rollout log-prob| over the
  generated tokens of turn k (float rounding for an exact mode);
- `ratio_min`, `ratio_max`: the PPO ratio pi_learner / pi_rollout at the first epoch, over
  the generated tokens (exactly 1 up to rounding for an exact mode);
- `learner_tokens`: tokens the learner's rows hold (padding excluded);
- `learner_seconds`: the iteration's learner time (scoring + advantages + the epoch);
- `peak_rss_mb`: the subprocess's peak RSS so far (the model included; N runs in increasing
  order, so the last N's is the mode's peak).
Then a summary: the CPU model, whether it has AVX512-BF16, and the tree / turns learner-time
ratio per N.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

SMOL = "smollm2-135m-instruct"
MODES = ("tree", "turns", "concat")


def cpu() -> dict:
    """The CPU model and whether it has AVX512-BF16 (bf16 is ~200x slower without it)."""
    text = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    names = [ln.split(":", 1)[1].strip() for ln in text.splitlines() if ln.startswith("model name")]
    return {"cpu": names[0] if names else "unknown", "avx512_bf16": "avx512_bf16" in text}


def emit(row: dict) -> dict:
    print(json.dumps(row), flush=True)
    return row


def smol_model(tok, layers: int | None):
    """SmolLM2-135M-Instruct in float32, cut to its first `layers` decoder layers (None: all)."""
    from mem1_core.config import ModelConfig
    from mem1_core.models.model import load_model

    model = load_model(SMOL, ModelConfig(name_or_path=SMOL), tok)
    total = len(model.model.layers)
    if layers is not None and layers != total:
        if not 1 <= layers <= total:
            raise SystemExit(
                f"--layers {layers}: SmolLM2 has {total} decoder layers; use 1 to {total}"
            )
        model.model.layers = model.model.layers[:layers]
        model.config.num_hidden_layers = layers
        if getattr(model.config, "layer_types", None) is not None:
            model.config.layer_types = list(model.config.layer_types[:layers])
    return model.eval()


def make_trajectories(ns: list[int], tasks: int, out: Path, layers: int | None) -> dict[int, Path]:
    """The teacher's MEM1 trajectories at each N, with the rollout's log-probs filled in."""
    from mem1_core.config import load_config
    from mem1_core.domains.inputs import ensure_tokenizer, load_tasks, make_env, prepare
    from mem1_core.qa.teacher import ScriptedTeacher
    from mem1_core.rollout.loop import rollout
    from mem1_core.trajectory.logprobs import per_turn_logprobs
    from mem1_core.trajectory.record import turn_paths, write_trajectories

    cfg = load_config("smol", overrides=[f"data.max_eval_tasks={tasks}"])
    paths = prepare(cfg, out / "run")
    tok = ensure_tokenizer(cfg, paths)
    env = make_env(cfg, paths, tok)
    model = smol_model(tok, layers)
    files = {}
    for n in ns:
        chosen = load_tasks(cfg, paths, "test", n)[:tasks]
        trajs = rollout(chosen, ScriptedTeacher(tok, chosen), env, cfg.rollout, memory="mem1")
        for traj in trajs:
            for turn, logp in zip(
                traj.turns, per_turn_logprobs(model, turn_paths(traj)), strict=True
            ):
                turn.gen_logprobs = logp.tolist()
        files[n] = write_trajectories(trajs, out / f"n{n}.parquet")
        turns = [len(t.turns) for t in trajs]
        emit({"trajectories": n, "tasks": len(trajs), "turns": turns})
    return files


def learner_iteration(model, trajs, mode: str, pad_id: int, tokens: int | None = None) -> dict:
    """One learner iteration (scoring, advantages, one PPO epoch) under `mode`; passes of 4 rows,
    or of at most `tokens` tokens (`ppo.micro_batch_tokens`)."""
    from mem1_core.config import PPOConfig
    from mem1_core.rl.batch import Models, make_rollout_batch
    from mem1_core.rl.passes import NonFiniteGuard, UpdateSettings, ppo_epochs, score
    from mem1_core.rl.ppo import estimate_advantages
    from mem1_core.trajectory.mismatch import turn_logprob_mismatch

    cfg = PPOConfig(
        adv_estimator="reinforce_plus_plus",
        kl_coef=0.0,
        ppo_epochs=1,
        minibatch_size=max(len(trajs), 4),
        micro_batch_size=4,
        micro_batch_tokens=tokens,
        actor_lr=2e-6,
    )
    settings = UpdateSettings.of(cfg, "sdpa", pad_id=pad_id, trajectory_mode=mode)
    models = Models(model)
    optimizer = {"policy": torch.optim.AdamW(model.parameters(), lr=cfg.actor_lr)}
    t0 = time.perf_counter()
    rb = make_rollout_batch(trajs, pad_id, mode=mode)
    targets = score(models, rb, settings)
    targets, _ = estimate_advantages(rb, targets, settings)
    ppo_epochs(models, optimizer, rb, targets, settings, NonFiniteGuard(3), torch.Generator())
    seconds = time.perf_counter() - t0
    mask = rb.batch.loss_mask
    ratio = torch.exp(targets.old_logp - rb.rollout_logp)[mask]
    gaps = turn_logprob_mismatch(rb.rollout_logp, targets.old_logp, rb.batch.gen_turn, mask)
    row = {
        "learner_tokens": int(rb.batch.seq_lens.sum()),
        "rows": int(mask.shape[0]),
        "gen_tokens": int(mask.sum()),
        "learner_seconds": round(seconds, 2),
        "ratio_min": float(ratio.min()),
        "ratio_max": float(ratio.max()),
    }
    for k, (mean, worst) in enumerate(
        zip(gaps["mean"].tolist(), gaps["max"].tolist(), strict=True)
    ):
        row[f"gap_max/turn_{k}"] = float(f"{worst:.3g}")
        row[f"gap_mean/turn_{k}"] = float(f"{mean:.3g}")
    return row


def child(
    mode: str, files: dict[int, str], threads: int, layers: int | None, tokens: int | None
) -> None:
    """One mode, every N, in this process: print a JSON line per N."""
    from mem1_core.config import load_config
    from mem1_core.domains.inputs import ensure_tokenizer, prepare
    from mem1_core.trajectory.record import read_trajectories

    torch.set_num_threads(threads)
    cfg = load_config("smol")
    root = Path(next(iter(files.values()))).parent / "run"
    tok = ensure_tokenizer(cfg, prepare(cfg, root))
    for n, path in sorted(files.items()):
        model = smol_model(tok, layers)  # fresh weights per N
        row = learner_iteration(model, read_trajectories(path), mode, tok.pad_token_id, tokens)
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        emit({"mode": mode, "n": n} | row | {"peak_rss_mb": round(rss)})


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ns", default="2,4,8", help="objectives per task, comma-separated")
    ap.add_argument("--tasks", type=int, default=1, help="trajectories at each N")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--layers", type=int, default=None, help="SmolLM2's first K layers (all: 30)")
    ap.add_argument(
        "--micro-batch-tokens",
        type=int,
        default=None,
        help="passes of at most this many tokens in every mode (ppo.micro_batch_tokens); "
        "default: 4 rows a pass (a row is a whole tree, or one turn)",
    )
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--files", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        files = {int(k): v for k, v in json.loads(args.files).items()}
        child(args.child, files, args.threads, args.layers, args.micro_batch_tokens)
        return
    torch.set_num_threads(args.threads)
    setting = {"threads": args.threads, "layers": args.layers or 30, "dtype": "float32"}
    setting["micro_batch"] = (
        f"{args.micro_batch_tokens} tokens" if args.micro_batch_tokens else "4 rows"
    )
    emit(cpu() | setting)
    out = Path(tempfile.mkdtemp(prefix="mem1-modes-"))
    files = make_trajectories([int(n) for n in args.ns.split(",")], args.tasks, out, args.layers)
    rows: list[dict] = []
    for mode in args.modes.split(","):
        done = subprocess.run(
            [sys.executable, __file__, "--child", mode, "--threads", str(args.threads),
             "--files", json.dumps({n: str(p) for n, p in files.items()}),
             *(["--layers", str(args.layers)] if args.layers else []),
             *(["--micro-batch-tokens", str(args.micro_batch_tokens)] if args.micro_batch_tokens else [])],
            capture_output=True, text=True, env=os.environ.copy(), check=False,
        )  # fmt: skip
        if done.returncode:
            sys.exit(f"the {mode} subprocess failed:\n{done.stderr[-3000:]}")
        for line in done.stdout.splitlines():
            if line.startswith("{"):
                rows.append(emit(json.loads(line)))
    seconds = {(r["mode"], r["n"]): r["learner_seconds"] for r in rows}
    ratios = {
        n: round(seconds["tree", n] / seconds["turns", n], 2)
        for _, n in seconds
        if ("tree", n) in seconds and ("turns", n) in seconds
    }
    emit({"summary": cpu() | setting | {"tree_over_turns_seconds": ratios}})


if __name__ == "__main__":
    main()
