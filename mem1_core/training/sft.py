"""Supervised fine-tuning on teacher trajectories, over the same rows and loss mask as PPO
(`trajectory.mode`: the flattened tree by default; loss on generated tokens only, each scored
with exactly the context it was generated from, except under the `concat` ablation). Two uses: the warm start (1-objective teacher trajectories teach the tiny model the tag
format, the starting point of both ablation arms) and the SFT arm of the RL-vs-SFT ablation
(MEM1 §5.4: SFT on the teacher's 2-objective trajectories).

A stage runs its step count: the lr schedule and the held-out evaluations are laid
out over the steps, so a busy machine trains the same model, only later. The minutes are a
cap for a stage that runs far slower than planned; when the cap ends it first, it says so
(a warning, and `stopped_by: minutes` in its last curve row and result.json).
"""

from __future__ import annotations

import json
import logging
import math
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from tqdm.auto import tqdm

from mem1_core.config import TeacherConfig
from mem1_core.models.model import compute_context, enable_gradient_checkpointing, save_model
from mem1_core.rollout.loop import Task, rollout
from mem1_core.runs import atomic
from mem1_core.runs.progress import Progress as StageProgress
from mem1_core.training.optim import adamw
from mem1_core.trajectory.logprobs import forward_tree
from mem1_core.trajectory.modes import mode_rows
from mem1_core.trajectory.record import Trajectory, write_trajectories
from mem1_core.trajectory.tree import FlatTree, collate

logger = logging.getLogger(__name__)

NO_TEACHER = (
    "the scripted teacher plays only the world's tasks (their plans), so real QA data has no "
    "teacher trajectories and no SFT; PPO starts from the pretrained model, as MEM1's RL does"
)


def has_teacher(cfg) -> bool:
    """Whether the run's tasks have teacher trajectories to learn from (SFT needs them): the
    world's tasks, and WebShop's goals."""
    from mem1_core.domains.registry import domain_of

    return domain_of(cfg).has_teacher(cfg)


def has_warm_start(cfg) -> bool:
    """Whether a pipeline run has a warm start before PPO: SFT on teacher trajectories, or
    the profile's pretrained base (`model.base`, no teacher needed)."""
    return cfg.model.base is not None or has_teacher(cfg)


def teacher_trajectories(
    tasks: list[Task],
    tokenizer,
    env,
    rollout_cfg,
    *,
    memory: str,
    teacher: TeacherConfig | None = None,
    seed_offset: int = 0,
) -> list[Trajectory]:
    """The domain's scripted teacher (`env.scripted_teacher`; in QA the one `teacher`
    describes, the default: faithful, the plain state) playing `tasks`, lapses included."""
    player = env.scripted_teacher(tasks, teacher or TeacherConfig(), seed_offset=seed_offset)
    if player is None:
        raise ValueError(NO_TEACHER)
    return rollout(tasks, player, env, rollout_cfg, memory=memory)


def sft_loss(
    model,
    trees: list[FlatTree],
    pad_id: int,
    attn: str,
    *,
    context_weight: float = 0.0,
    context_rows: list[bool] | None = None,
    seq_bucket: int = 1,
) -> tuple[torch.Tensor, int]:
    """Mean negative log-likelihood of the generated tokens of a batch of flattened trees.

    With `context_weight` > 0, plus that weight times the mean next-token loss on the other
    tokens (prompt and <info>) of the rows flagged in `context_rows`: language-model
    pretraining on the environment's text, which teaches copying (a name in <info> repeats
    the query, a title repeats in its passage) far more often per step than the generated
    tokens alone. seq_bucket: pad to a multiple of it (fewer flex recompiles on a GPU).
    -> (loss, generated tokens)."""
    batch = collate(trees, pad_id, pad_to_multiple=seq_bucket).to(next(model.parameters()).device)
    ctx = None
    if context_weight > 0 and context_rows is not None and any(context_rows):
        rows = torch.tensor(context_rows, dtype=torch.bool, device=batch.input_ids.device)
        ctx = (batch.prev_index >= 0) & ~batch.loss_mask & rows[:, None]
    positions = batch.loss_mask if ctx is None else batch.loss_mask | ctx
    logp = forward_tree(model, batch, attn, positions=positions).logprobs
    n = int(batch.loss_mask.sum())
    loss = -(logp * batch.loss_mask).sum() / max(n, 1)
    if ctx is not None:
        loss = loss + context_weight * -(logp * ctx).sum() / ctx.sum().clamp(min=1)
    return loss, n


def lr_at(progress: float, warmup: float, base: float, floor: float = 0.1) -> float:
    """Linear warm-up, then cosine to floor*base; `progress` and `warmup` in [0, 1]."""
    if progress < warmup:
        return base * progress / max(warmup, 1e-9)
    t = (progress - warmup) / max(1 - warmup, 1e-9)
    return base * (floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * min(t, 1.0))))


def eval_steps(max_steps: int, evals: int) -> frozenset[int]:
    """The steps after which a stage of `max_steps` runs its `evals` held-out evaluations:
    evenly spaced inside the stage (the evaluations before and after it are the caller's)."""
    return frozenset(
        s for k in range(1, evals + 1) if 0 < (s := round(k * max_steps / (evals + 1))) < max_steps
    )


@dataclass
class SFTResult:
    steps: int
    seconds: float
    final_loss: float
    tokens_per_second: float
    curve: list[dict]
    stopped_by: str = "count"
    """"count" (the stage ran its steps) or "minutes" (the cap ended it first)."""


def step_options(cfg) -> dict:
    """`train_on_trajectories`' optimiser and model options from the config (`sft`, `model`)."""
    return {
        "lr": cfg.sft.lr,
        "batch_size": cfg.sft.batch_size,
        "warmup_steps": cfg.sft.warmup_steps,
        "grad_clip": cfg.sft.grad_clip,
        "weight_decay": cfg.sft.weight_decay,
        "attn": cfg.model.attn,
        "seed": cfg.model.seed,
        "trajectory_mode": cfg.trajectory.mode,
    }


def train_on_trajectories(
    model,
    trajectories: list[Trajectory],
    pad_id: int,
    *,
    lr: float,
    batch_size: int,
    minutes: float,
    max_steps: int,
    warmup_steps: int = 50,
    grad_clip: float = 1.0,
    weight_decay: float = 0.0,
    attn: str = "sdpa",
    seed: int = 0,
    eval_fn: Callable[[], dict] | None = None,
    evals: int = 0,
    log: Callable[[dict], None] | None = None,
    progress: bool = True,
    context_weight: float = 0.0,
    context_loss: list[bool] | None = None,
    seq_bucket: int = 1,
    gradient_checkpointing: bool = False,
    stage: str = "sft",
    trajectory_mode: str = "tree",
) -> SFTResult:
    """Train `max_steps` steps; returns the loss/eval curve. `minutes` of training time cap
    it (a warning and `stopped_by="minutes"` when they end it first). `eval_fn` runs after
    `evals` evenly spaced steps (`eval_steps`). Nothing here reads the clock but the cap.
    `context_loss[i]`: trajectory i also gets the `context_weight` loss (see `sft_loss`).
    `trajectory_mode`: the rows a trajectory trains as (`trajectory.mode`,
    mem1_core.trajectory.modes); a step takes `batch_size` trajectories with all their rows."""
    if context_loss is not None and len(context_loss) != len(trajectories):
        raise ValueError("context_loss needs one flag per trajectory")
    keep = [i for i, t in enumerate(trajectories) if t.turns]
    rows, owner = mode_rows([trajectories[i] for i in keep], trajectory_mode)
    trees: list[list[FlatTree]] = [[] for _ in keep]  # each trajectory's rows
    for tree, k in zip(rows, owner, strict=True):
        trees[k].append(tree)
    ctx_flags = [bool(context_loss[i]) for i in keep] if context_loss else None
    if not trees:
        raise ValueError("no teacher trajectory to train on")
    rng = random.Random(seed)
    torch.manual_seed(seed)
    if gradient_checkpointing:
        enable_gradient_checkpointing(model)
    opt = adamw(model.parameters(), lr, weight_decay)
    model.train()
    budget = minutes * 60.0
    t0 = time.perf_counter()
    at_steps = eval_steps(max_steps, evals) if eval_fn is not None else frozenset()
    warm = min(warmup_steps / max(max_steps, 1), 0.2)
    curve: list[dict] = []
    tokens = 0
    loss_val = float("nan")
    bar = tqdm(total=max_steps, desc=stage, disable=not progress)
    watch = StageProgress(stage, total=max_steps, budget_seconds=budget)
    step = 0
    stopped_by = "count"
    order: list[int] = []
    # The cap counts training time only: held-out evaluations run on top. Counted in, on a
    # loaded machine they ate a 1.5-minute SFT stage (4 steps in 108 s).
    paused = 0.0

    def trained() -> float:
        return time.perf_counter() - t0 - paused

    while step < max_steps:
        if len(order) < batch_size:
            order += rng.sample(range(len(trees)), len(trees))
        idx, order = order[:batch_size], order[batch_size:]
        for g in opt.param_groups:
            g["lr"] = lr_at(step / max_steps, warm, lr) if step >= 1 else lr * 0.02
        with compute_context(model):
            loss, n = sft_loss(
                model,
                [tree for i in idx for tree in trees[i]],
                pad_id,
                attn,
                context_weight=context_weight,
                context_rows=[ctx_flags[i] for i in idx for _ in trees[i]] if ctx_flags else None,
                seq_bucket=seq_bucket,
            )
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
        opt.step()
        step += 1
        tokens += n
        loss_val = float(loss.detach())
        bar.update(1)
        bar.set_postfix(loss=f"{loss_val:.3f}")
        watch.update(step, loss=round(loss_val, 3))
        row = {"step": step, "seconds": round(trained(), 2), "loss": loss_val}
        if step in at_steps:
            model.eval()
            t_eval = time.perf_counter()
            row.update(eval_fn())
            paused += time.perf_counter() - t_eval
            model.train()
        if step < max_steps and trained() >= budget:
            stopped_by = "minutes"
            logger.warning(
                "%s: its %.4g-minute cap stopped it after %d of %d steps (a slow or busy "
                "machine; raise the stage's minutes to run all its steps)",
                stage,
                minutes,
                step,
                max_steps,
            )
        final = step == max_steps or stopped_by == "minutes"
        if final:
            row["stopped_by"] = stopped_by  # the last row says how the stage ended
        if step % 10 == 0 or step in at_steps or final:
            curve.append(row)
            if log:
                log(row)
        if final:
            break
    bar.close()
    watch.close()
    model.eval()
    seconds = trained()
    return SFTResult(step, seconds, loss_val, tokens / max(seconds, 1e-9), curve, stopped_by)


def train_sft(
    cfg,
    out_dir: str | Path,
    *,
    objectives: int | None = None,
    memory: str | None = None,
    minutes: float | None = None,
    steps: int | None = None,
    init: str | Path | None = None,
    resume: bool = False,
    warm_start: bool = False,
    assets_dir: str | Path | None = None,
    progress: bool = True,
) -> dict:
    """The `mem1 train sft` stage: teacher trajectories -> SFT -> `<out>/policy`.

    `warm_start=True` uses the warm-start budget and 1-objective tasks (the format lesson).
    With `resume`, a finished run (its `policy/` and `result.json`) is returned as it is.
    The run's shared assets (world, tasks, tokenizer, index) live in `assets_dir`
    (default: `out_dir`)."""
    from mem1_core.domains.inputs import ensure_tokenizer, load_tasks, make_env, prepare
    from mem1_core.domains.registry import domain_of
    from mem1_core.evaluation.evaluate import evaluate_policy
    from mem1_core.evaluation.summary import numeric_metrics
    from mem1_core.models.model import load_model
    from mem1_core.models.policy import adopt_init_tokenizer, initial_policy
    from mem1_core.runs.layout import RunPaths

    out = Path(out_dir).resolve()
    if resume and (out / "result.json").exists() and (out / "policy").exists():
        return json.loads((out / "result.json").read_text())
    from mem1_core.runs.layout import resolve_init

    init = resolve_init(init)  # a run or checkpoint directory -> its policy
    root = Path(assets_dir or out).resolve()
    if warm_start and init is None and cfg.model.base is not None:
        from mem1_core.training.base_start import start_from_base

        return start_from_base(cfg, out, root, memory=memory or cfg.rollout.memory)
    adopt_init_tokenizer(cfg, RunPaths(root), init)
    paths: RunPaths = prepare(cfg, root)
    tok = ensure_tokenizer(cfg, paths)
    env = make_env(cfg, paths, tok)
    ns = (
        (objectives,)
        if objectives
        else tuple(cfg.sft.warm_start_objectives)
        if warm_start
        else (cfg.data.train_objectives,)
    )
    memory = memory or cfg.rollout.memory
    sources = [(cfg, paths, env)]
    for sub_cfg, sub_paths in domain_of(cfg).teacher_sources(cfg, paths, tok):
        sources.append((sub_cfg, sub_paths, make_env(sub_cfg, sub_paths, tok)))
    per_source = max(1, cfg.sft.n_teacher_tasks // (len(ns) * len(sources)))
    trajs: list[Trajectory] = []
    fresh: list[bool] = []  # from an extra world: safe for the context loss
    for k, (src_cfg, src_paths, src_env) in enumerate(sources):
        tasks = [t for n in ns for t in load_tasks(src_cfg, src_paths, "train", n)[:per_source]]
        fresh += [k > 0] * len(tasks)
        trajs += teacher_trajectories(
            tasks,
            tok,
            src_env,
            cfg.rollout,
            memory=memory,
            teacher=cfg.teacher,
            seed_offset=k,
        )
    write_trajectories(trajs, out / "teacher_trajectories.parquet")
    model = load_model(init, cfg.model, tok) if init else initial_policy(cfg, tok)
    eval_tasks = load_tasks(cfg, paths, "test", ns[-1])[: cfg.sft.eval_tasks]

    def eval_fn() -> dict:
        if not eval_tasks:  # sft.eval_tasks=0: evaluations off
            return {"eval_reward": None, "eval_format_error_rate": None}
        m = evaluate_policy(model, tok, env, eval_tasks, cfg.rollout, memory=memory)
        return {"eval_reward": m["em_frac"], "eval_format_error_rate": m["format_error_rate"]}

    lines: list[str] = []

    def log(row: dict) -> None:
        lines.append(json.dumps(row))
        atomic.write_text("\n".join(lines) + "\n", out / "metrics.jsonl")

    if minutes is None:
        minutes = cfg.sft.warm_start_minutes if warm_start else cfg.sft.minutes
    before = eval_fn()
    result = train_on_trajectories(
        model,
        trajs,
        tok.pad_token_id,
        minutes=minutes,
        max_steps=steps
        if steps is not None
        else (cfg.sft.warm_start_steps if warm_start else cfg.sft.steps),
        **step_options(cfg),
        eval_fn=eval_fn if eval_tasks and cfg.sft.evals else None,
        evals=cfg.sft.evals,
        log=log,
        progress=progress,
        context_weight=cfg.sft.warm_start_context_weight if warm_start else 0.0,
        context_loss=fresh,
        seq_bucket=cfg.model.seq_bucket_tokens,
        gradient_checkpointing=cfg.model.gradient_checkpointing,
        stage="warm start" if warm_start else f"sft ({memory})",
    )
    after = eval_fn()
    save_model(model, tok, out / "policy")
    summary = {
        "objectives": list(ns),
        "eval_objectives": ns[-1],
        "memory": memory,
        "teacher_trajectories": len(trajs),
        "teacher_worlds": len(sources),
        "teacher_reward": sum(t.reward for t in trajs) / len(trajs),
        "steps": result.steps,
        "stopped_by": result.stopped_by,
        "seconds": round(result.seconds, 1),
        "final_loss": result.final_loss,
        "tokens_per_second": round(result.tokens_per_second),
        "eval_reward_before": before["eval_reward"],
        "eval_reward_after": after["eval_reward"],
        "eval_format_error_rate_after": after["eval_format_error_rate"],
        "policy_dir": str(out / "policy"),
    }
    summary["metrics"] = numeric_metrics(summary)
    atomic.write_json(summary, out / "result.json")
    return summary
