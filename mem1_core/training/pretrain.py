"""The embedded default's pretrained base: the analogue of the pretrained LLM that MEM1 starts
from (MEM1 §4: Qwen2.5-7B base), trained once, long, on freshly generated worlds.

A pretrained LLM brings to MEM1 the skills the tiny model otherwise spends its whole budget
on (docs/design.md §8): reading documents, copying names and years it has never seen, the tag
format, issuing a search and answering from `<info>`. `pretrain` teaches exactly those, and
nothing that would make N >= 4 a memorised setting: every round trains on a new world
(`build_source`; mem1_core.training.pretrain_data says what it holds and why), batches draw
from the newest `pretrain.pool_worlds` of them, and the loss is the teacher turns' plus
`text_weight` times the documents' and drills' next-token loss.

Checkpointed every round (model, optimiser, RNG, curve) and resumable; held-out figures are
measured on worlds no round trained on (`pretrain.eval_world_seeds`).
"""

from __future__ import annotations

import json
import logging
import math
import random
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import torch
from tqdm.auto import tqdm

from mem1_core.models.base import MANIFEST, format_fingerprint, tokenizer_hash
from mem1_core.runs import atomic
from mem1_core.runs.progress import Progress as StageProgress
from mem1_core.training.optim import adamw
from mem1_core.training.pretrain_data import Source, build_source, world_config

log = logging.getLogger(__name__)

CURVE_PNG = "curve.png"  # held-out EM per N and the loss over steps (plot_base_curves)


def text_loss(model, rows: list[list[int]], pad_id: int) -> torch.Tensor:
    """Mean next-token loss over packed text rows (right-padded, padding ignored)."""
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.bool)
    for i, r in enumerate(rows):
        ids[i, : len(r)] = torch.tensor(r)
        mask[i, : len(r)] = True
    dev = next(model.parameters()).device
    ids, mask = ids.to(dev), mask.to(dev)
    logits = model(input_ids=ids, attention_mask=mask.long()).logits[:, :-1]
    target, keep = ids[:, 1:], mask[:, 1:]
    nll = torch.nn.functional.cross_entropy(logits.transpose(1, 2), target, reduction="none")
    return (nll * keep).sum() / keep.sum().clamp(min=1)


def held_out(model, tok, cfg, root: Path, seeds: tuple[int, ...], ns: tuple[int, ...], tasks: int):
    """Greedy EM fraction (and its standard error) of the model under MEM1 memory on
    `tasks` test-split tasks per N of each world in `seeds` (worlds no round trained on)."""
    from mem1_core.domains.inputs import load_tasks, make_env
    from mem1_core.evaluation.evaluate import run_eval
    from mem1_core.runs.layout import RunPaths

    out = {}
    for n in ns:
        rewards = []
        for seed in seeds:
            wcfg = world_config(cfg, seed)
            wcfg = replace(wcfg, data=replace(wcfg.data, max_eval_tasks=tasks))
            paths = RunPaths(root / f"seed{seed}")
            env = make_env(wcfg, paths, tok)
            trajs, _ = run_eval(
                model, tok, env, load_tasks(wcfg, paths, "test", n), cfg.rollout, memory="mem1"
            )
            rewards += [t.reward for t in trajs]
        mean = sum(rewards) / len(rewards)
        var = sum((r - mean) ** 2 for r in rewards) / max(len(rewards) - 1, 1)
        out[f"em_n{n}"] = round(mean, 4)
        out[f"se_n{n}"] = round(math.sqrt(var / len(rewards)), 4)
    return out


def _init_base(path: str) -> Path:
    """`pretrain.init` resolved and checked to be a base (its format may be older: that is
    what continuing is for; the tokenizer is checked when it is adopted)."""
    from mem1_core.models.base import resolve_base

    p = resolve_base(path)
    if not (p / MANIFEST).exists() or not (p / "model.safetensors").exists():
        raise ValueError(f"pretrain.init={path}: not a base directory (no {MANIFEST} / weights)")
    return p


def _git_commit() -> str:
    try:
        return subprocess.run(
            ["git", "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
            cwd=Path(__file__).resolve().parent,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def pretrain(cfg, out_dir: str | Path, *, resume: bool = False, progress: bool = True) -> dict:
    """Train the base into `<out>/base` with `<out>/base/manifest.json`; resumable."""
    from mem1_core.domains.inputs import ensure_tokenizer
    from mem1_core.models.model import build_tiny_model, count_parameters, load_model, save_model
    from mem1_core.models.policy import adopt_init_tokenizer
    from mem1_core.runs.layout import RunPaths
    from mem1_core.training.sft import lr_at, sft_loss

    pcfg = cfg.pretrain
    out = Path(out_dir).resolve()
    ckpt = out / "checkpoint"
    state_file = ckpt / "state.json"
    if (out / "base" / MANIFEST).exists() and resume:
        return json.loads((out / "base" / MANIFEST).read_text())
    worlds = out / "worlds"
    # The tokenizer: trained once, on the first fresh world; it covers every syllable and
    # year by construction (mem1_core.models.tokenizer), so it serves every world after it.
    init = _init_base(pcfg.init) if pcfg.init else None
    if init is not None:  # the base's tokenizer is the tokenizer (an error if out/ has another)
        adopt_init_tokenizer(cfg, RunPaths(out), init)
    tok = ensure_tokenizer(world_config(cfg, pcfg.world_seed), RunPaths(out))
    torch.manual_seed(cfg.model.seed)
    if resume and state_file.exists():
        state = json.loads(state_file.read_text())
        model = load_model(ckpt / "policy", cfg.model, tok)
    else:
        state = {"step": 0, "seconds": 0.0, "round": 0, "curve": [], "evals": [], "tokens": 0}
        model = (
            build_tiny_model(cfg.model, tok) if init is None else load_model(init, cfg.model, tok)
        )
    opt = adamw(model.parameters(), pcfg.lr, pcfg.weight_decay)
    if resume and (ckpt / "optimizer.pt").exists():
        opt.load_state_dict(torch.load(ckpt / "optimizer.pt", weights_only=True))
    rng = random.Random(f"{cfg.model.seed}:{state['round']}")
    budget = pcfg.minutes * 60.0  # a cap: pcfg.steps decides (a slow machine, the same model)
    pool: list[Source] = []
    for r in range(max(0, state["round"] - pcfg.pool_worlds), state["round"]):
        pool.append(build_source(cfg, tok, worlds, pcfg.world_seed + r, pcfg))
    log_lines = [json.dumps(r) for r in state["curve"]]
    bar = tqdm(
        desc="pretrain", unit="step", total=pcfg.steps, initial=state["step"], disable=not progress
    )
    watch = StageProgress(
        "pretrain", total=pcfg.steps, budget_seconds=budget, path=out / "progress.json"
    )
    t_start = time.perf_counter() - state["seconds"]
    stopped_by = "count"

    def due() -> bool:
        return state["step"] % pcfg.eval_every == 0 and all(
            e["step"] != state["step"] for e in state["evals"]
        )

    def elapsed() -> float:
        return time.perf_counter() - t_start

    def evaluate() -> None:
        model.eval()
        row = {"step": state["step"], "minutes": round(elapsed() / 60, 2)}
        row.update(
            held_out(
                model,
                tok,
                cfg,
                worlds,
                pcfg.eval_world_seeds,
                pcfg.eval_objectives,
                pcfg.eval_tasks,
            )
        )
        state["evals"].append(row)
        tqdm.write(f"[pretrain] held-out {json.dumps(row)}")
        plot(out / CURVE_PNG)  # the curve so far, to look at while it trains
        model.train()

    def plot(path: Path) -> None:
        from mem1_core.evaluation.scaling import plot_base_curves

        plot_base_curves({out.name: {"held_out": state["evals"], "curve": state["curve"]}}, path)

    def save() -> None:
        state["seconds"] = elapsed()
        with atomic.atomic_dir(ckpt) as tmp:
            save_model(model, tok, tmp / "policy")
            torch.save(opt.state_dict(), tmp / "optimizer.pt")
            atomic.write_json(state, tmp / "state.json")

    model.train()
    while state["step"] < pcfg.steps:
        if elapsed() >= budget:
            stopped_by = "minutes"
            log.warning(
                "pretrain: its %.4g-minute cap stopped it after %d of %d steps (a slow or busy "
                "machine; raise pretrain.minutes to run all its steps)",
                pcfg.minutes,
                state["step"],
                pcfg.steps,
            )
            break
        if not pool or state["step"] >= (state["round"]) * pcfg.steps_per_world:
            pool.append(build_source(cfg, tok, worlds, pcfg.world_seed + state["round"], pcfg))
            pool = pool[-pcfg.pool_worlds :]
            state["round"] += 1
            save()
        if due():
            evaluate()
        for g in opt.param_groups:
            g["lr"] = lr_at(state["step"] / pcfg.steps, pcfg.warmup_fraction, pcfg.lr)
        src = [s for s in pool for _ in range(1)]
        picks = [(s, rng.randrange(len(s.trees))) for s in rng.choices(src, k=pcfg.batch_size)]
        loss, n = sft_loss(
            model,
            [s.trees[i] for s, i in picks],
            tok.pad_token_id,
            cfg.model.attn,
            context_weight=pcfg.context_weight,
            context_rows=[s.ctx_rows[i] for s, i in picks],
        )
        tloss = torch.zeros(())
        if pcfg.text_weight > 0:
            rows = [rng.choice(s.texts) for s in rng.choices(src, k=pcfg.text_batch_size)]
            tloss = text_loss(model, rows, tok.pad_token_id)
            loss = loss + pcfg.text_weight * tloss
            n += sum(len(r) for r in rows)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), pcfg.grad_clip)
        opt.step()
        state["step"] += 1
        state["tokens"] += n
        bar.update(1)
        if state["step"] % 25 == 0:
            row = {
                "step": state["step"],
                "minutes": round(elapsed() / 60, 2),
                "loss": round(float(loss.detach()), 4),
                "text_loss": round(float(tloss.detach()), 4),
                "lr": opt.param_groups[0]["lr"],
                "world": pcfg.world_seed + state["round"] - 1,
            }
            state["curve"].append(row)
            log_lines.append(json.dumps(row))
            bar.set_postfix(loss=row["loss"], text=row["text_loss"])
        watch.done = state["step"]
        watch.t0 = t_start
        watch.update(state["step"], loss=round(float(loss.detach()), 3), world=state["round"])
    bar.close()
    watch.close()
    if not state["evals"] or state["evals"][-1]["step"] != state["step"]:
        evaluate()
    save()
    last = {"step": state["step"], "minutes": round(elapsed() / 60, 2), "stopped_by": stopped_by}
    atomic.write_text("\n".join([*log_lines, json.dumps(last)]) + "\n", out / "metrics.jsonl")
    base = out / "base"
    save_model(model, tok, base)
    plot(base / CURVE_PNG)
    manifest = {
        "command": " ".join(["mem1", *sys.argv[1:]]) if sys.argv else "mem1 pretrain",
        "code_commit": _git_commit(),
        "config": {
            "model": cfg.model.to_dict(),
            "pretrain": pcfg.to_dict(),
            "world": cfg.world.to_dict(),
            "rollout": cfg.rollout.to_dict(),
        },
        "tokenizer_sha": tokenizer_hash(tok),
        "format": format_fingerprint(),
        "parameters": count_parameters(model),
        "world_seeds": [pcfg.world_seed, pcfg.world_seed + state["round"] - 1],
        "eval_world_seeds": list(pcfg.eval_world_seeds),
        "steps": state["step"],
        "minutes": round(elapsed() / 60, 1),
        "stopped_by": stopped_by,
        "tokens_per_second": round(state["tokens"] / max(elapsed(), 1e-9)),
        "curve": state["curve"][:: max(1, len(state["curve"]) // 200)],
        "held_out": state["evals"],
    }
    if init is not None:
        before = json.loads((init / MANIFEST).read_text())
        manifest["init"] = {k: before.get(k) for k in ("code_commit", "format", "steps", "minutes")}
        manifest["init"]["path"] = str(init)
        manifest["history"] = [
            *before.get("history", []),
            {
                "minutes": f"+{manifest['minutes']}",
                "steps": f"+{state['step']}",
                "code": manifest["code_commit"][:7],
                "what": f"continued from {init} (format {before.get('format', {}).get('format_version')}) "
                f"in format {manifest['format']['format_version']}",
            },
        ]
    atomic.write_json(manifest, base / MANIFEST)
    return manifest
