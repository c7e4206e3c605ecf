"""The embedded default's pretrained base: the analogue of the pretrained LLM that MEM1 starts
from (MEM1 §4: Qwen2.5-7B base), trained once, long, on freshly generated worlds.

A pretrained LLM brings to MEM1 the skills the tiny model otherwise spends its whole budget
on (docs/design.md §8): reading documents, copying names and years it has never seen, the tag
format, issuing a search and answering from `<info>`. `pretrain` teaches exactly those, and
nothing that would make N >= 4 a memorised setting:

- **Teacher turns on fresh worlds.** Every round generates a new world (new names and facts;
  seeds from `pretrain.world_seed` up, never a run's evaluation world) and plays the scripted
  teacher on its 1- and 2-objective tasks (never more: the paper trains on 2) under both
  memories (`mem1` and `full`, so both arms of the comparison start from a base that knows
  their format). Loss on the generated tokens, plus `context_weight` times the next-token
  loss on the prompt and `<info>` tokens (reading: a name in `<info>` repeats the query).
- **Documents.** Packed encyclopedia text of the fresh worlds, next-token loss, up to
  `text_len` tokens a row, so positions far beyond a 2-objective context are trained.
- **List drills** (generic, any length): numbered fact lists `Q1: a. Q2: b. … Qk: z.` carried
  from one `<IS>` to the next with one new entry taken from a passage, under the prompt's
  last line `Answer all m questions.`; when the list holds m entries it is copied into
  `<answer> a; b; …`, else the state names the next entry — the bookkeeping and counting a
  pretrained LLM can already do for any k. These hold no question, so they are not
  multi-objective QA tasks.
- **Question-list drills** (generic, any length): a task prompt listing k <= `drill_max_facts`
  numbered questions, then the first turn (`Start. Next: Q1.` and the search for question 1)
  — starting on a list of any length, as a pretrained LLM does. Only the first turn: no
  `<info>`, no answer, no later question. (Drills that began at question j > 1 with the
  earlier answers in the state taught the model to write answers it had never read: a state
  must come from the context, so those need the earlier turns, which would be the N-turn
  task itself. The N-turn task is never shown above 2 objectives.)

Names never repeat across rounds, so nothing can be memorised: the loss only falls by
copying. Checkpointed every round (model, optimiser, RNG, curve) and resumable; held-out
figures are measured on worlds no round trained on (`pretrain.eval_world_seeds`).
"""

from __future__ import annotations

import json
import logging
import math
import random
import subprocess
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path

import pyarrow.parquet as pq
import torch
from tqdm.auto import tqdm

from mem1_core.config import TeacherConfig
from mem1_core.data.prompts import (
    ANSWER_CLOSE,
    ANSWER_OPEN,
    INFO_CLOSE,
    INFO_OPEN,
    IS_CLOSE,
    IS_OPEN,
    join_answers,
)
from mem1_core.models.base import MANIFEST, format_fingerprint, tokenizer_hash
from mem1_core.runs import atomic
from mem1_core.runs.progress import Progress as StageProgress

log = logging.getLogger(__name__)

CURVE_PNG = "curve.png"  # held-out EM per N and the loss over steps (plot_base_curves)


@dataclass
class Source:
    """One fresh world's data: teacher trees, documents and drills."""

    seed: int
    trees: list
    ctx_rows: list[bool]
    texts: list[list[int]]


def _world_cfg(cfg, seed: int):
    return replace(cfg, world=replace(cfg.world, seed=seed))


def build_source(cfg, tok, root: Path, seed: int, pcfg) -> Source:
    """Generate world `seed`, play the teacher on its 1- and 2-objective tasks under every
    memory of `pcfg.memories`, and cut its documents and drills into token rows."""
    from mem1_core.data.compose import compose
    from mem1_core.data.qa_data import world_questions
    from mem1_core.data.run_tasks import ensure_world
    from mem1_core.rollout.env import make_env
    from mem1_core.rollout.loop import tasks_from_table
    from mem1_core.runs.layout import RunPaths
    from mem1_core.training.sft import teacher_trajectories
    from mem1_core.trajectory.record import turn_paths
    from mem1_core.trajectory.tree import flatten

    wcfg = _world_cfg(cfg, seed)
    paths = RunPaths(root / f"seed{seed}")
    world = ensure_world(wcfg, paths)
    questions = world_questions(pq.read_table(world / "questions.parquet")).table
    env = make_env(wcfg, paths, tok)
    trees, ctx = [], []
    for n in pcfg.objectives:
        table, _ = compose(questions, n, "per_source", seed, None, shuffle=True)
        tasks = tasks_from_table(table)[: pcfg.tasks_per_world]
        for memory in pcfg.memories:
            trajs = teacher_trajectories(
                tasks, tok, env, cfg.rollout, memory=memory, teacher=TeacherConfig(seed=seed)
            )
            for t in trajs:
                if t.turns:
                    trees.append(flatten(turn_paths(t)))
                    ctx.append(True)
    corpus = pq.read_table(world / "corpus.parquet")
    rng = random.Random(seed)
    texts = _doc_rows(corpus["contents"].to_pylist(), tok, pcfg.text_len, rng)
    texts += _drill_rows(corpus, tok, pcfg, rng)
    texts += _question_drill_rows(questions, tok, pcfg, rng)
    rng.shuffle(texts)
    # the world's files are regenerated from the seed on resume; keep the disk small
    import shutil

    shutil.rmtree(paths.root, ignore_errors=True)
    return Source(seed, trees, ctx, texts)


def _doc_rows(docs: list[str], tok, length: int, rng: random.Random) -> list[list[int]]:
    """Documents packed into rows of up to `length` tokens (eos between documents)."""
    rng.shuffle(docs)
    rows, cur = [], []
    for d in docs:
        cur += tok.encode(d, add_special_tokens=False) + [tok.eos_token_id]
        while len(cur) >= length:
            rows.append(cur[:length])
            cur = cur[length:]
    return rows


def drill_text(facts: list[str], new_fact: str, passage: str, wanted: int) -> str:
    """One list drill: the prompt's last line (`wanted` answers), a state of k numbered facts,
    a passage, then the state carried forward with the (k+1)-th fact read from the passage;
    then, if the list is complete (k + 1 == wanted), every fact copied into an answer, else
    the state names the next entry (the count decides whether to go on or to answer)."""
    from mem1_core.data.prompts import prompt_end

    k = len(facts)
    if not k + 1 <= wanted:
        raise ValueError(f"a drill of {k + 1} facts cannot want {wanted}")
    state = " ".join(f"Q{i}: {f}." for i, f in enumerate(facts, 1))
    state = state or "Start."
    nxt = " ".join(f"Q{i}: {f}." for i, f in enumerate([*facts, new_fact], 1))
    head = f"{prompt_end(wanted)}\n{IS_OPEN} {state} Next: Q{k + 1}. {IS_CLOSE}"
    head += f"{INFO_OPEN} {passage} {INFO_CLOSE}"
    if k + 1 < wanted:
        return f"{head}{IS_OPEN} {nxt} Next: Q{k + 2}. {IS_CLOSE}"
    return (
        f"{head}{IS_OPEN} {nxt} {IS_CLOSE}"
        f"{ANSWER_OPEN} {join_answers([*facts, new_fact])}{ANSWER_CLOSE}"
    )


def _drill_rows(corpus, tok, pcfg, rng: random.Random) -> list[list[int]]:
    titles = corpus["title"].to_pylist()
    contents = corpus["contents"].to_pylist()
    rows = []
    for _ in range(pcfg.drills_per_world):
        k = rng.randint(0, pcfg.drill_max_facts - 1)
        facts = [
            rng.choice(titles) if rng.random() < 0.7 else str(rng.randint(1000, 2099))
            for _ in range(k)
        ]
        # half the lists are complete after this entry, half want more (up to the longest)
        top = max(k + 1, pcfg.drill_max_facts)
        wanted = k + 1 if rng.random() < 0.5 or k + 1 == top else rng.randint(k + 2, top)
        j = rng.randrange(len(titles))
        # the new fact is the passage's own title: read from <info>, not remembered
        ids = tok.encode(
            drill_text(facts, titles[j], contents[j], wanted), add_special_tokens=False
        )
        rows.append(ids[: pcfg.text_len])
    return rows


def question_drill_text(questions: list[str], plans: list[str]) -> tuple[str, str]:
    """One question-list drill: (the task prompt of `questions`, the first turn, which searches
    for question 1), written as the scripted teacher writes that turn."""
    from mem1_core.data.prompts import QUERY_CLOSE, QUERY_OPEN, task_prompt
    from mem1_core.rollout.teacher import ScriptedTeacher

    first = json.loads(plans[0])[0]
    state = f"{ScriptedTeacher.state_text(None, [], [])} Next: Q1."
    turn = f"{IS_OPEN} {state} {IS_CLOSE}{QUERY_OPEN} {first['query']}{QUERY_CLOSE}"
    return task_prompt(questions), turn


def _question_drill_rows(questions, tok, pcfg, rng: random.Random) -> list[list[int]]:
    rows = [r for r in questions.to_pylist() if json.loads(r.get("plan") or "[]")]
    out = []
    for _ in range(pcfg.question_drills_per_world if rows else 0):
        k = rng.randint(1, min(pcfg.drill_max_facts, len(rows)))
        picked = rng.sample(rows, k)
        prompt, turn = question_drill_text(
            [r["question"] for r in picked], [r["plan"] for r in picked]
        )
        # prompt and turn encoded apart, as the rollout builds a context from id segments
        out.append(
            tok.encode(prompt, add_special_tokens=False)
            + tok.encode(turn, add_special_tokens=False)
        )
    return out


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
    from mem1_core.evaluation.evaluate import run_eval
    from mem1_core.rollout.env import make_env
    from mem1_core.rollout.inputs import load_tasks
    from mem1_core.runs.layout import RunPaths

    out = {}
    for n in ns:
        rewards = []
        for seed in seeds:
            wcfg = _world_cfg(cfg, seed)
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
    from mem1_core.models.model import build_tiny_model, count_parameters, load_model, save_model
    from mem1_core.models.policy import adopt_init_tokenizer, ensure_tokenizer
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
    tok = ensure_tokenizer(_world_cfg(cfg, pcfg.world_seed), RunPaths(out))
    torch.manual_seed(cfg.model.seed)
    if resume and state_file.exists():
        state = json.loads(state_file.read_text())
        model = load_model(ckpt / "policy", cfg.model, tok)
    else:
        state = {"step": 0, "seconds": 0.0, "round": 0, "curve": [], "evals": [], "tokens": 0}
        model = (
            build_tiny_model(cfg.model, tok) if init is None else load_model(init, cfg.model, tok)
        )
    opt = torch.optim.AdamW(model.parameters(), lr=pcfg.lr, weight_decay=pcfg.weight_decay)
    if resume and (ckpt / "optimizer.pt").exists():
        opt.load_state_dict(torch.load(ckpt / "optimizer.pt", weights_only=True))
    rng = random.Random(f"{cfg.model.seed}:{state['round']}")
    budget = pcfg.minutes * 60.0  # a cap: pcfg.steps decides (issue 28)
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
