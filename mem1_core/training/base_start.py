"""The warm start of a run when the embedded default has a pretrained base (`model.base`):
the base itself, as the paper starts RL from a pretrained LLM (no SFT on the run's world).

It writes what the SFT warm start writes (`<out>/policy`, `result.json` with the same keys),
so every later stage (`--init`, the evaluation's warm-start row) reads it alike; `steps` is 0
and `base` names the base and its manifest's figures. `--set model.base=null` brings back the
SFT warm start from random weights.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path

from mem1_core.runs import atomic


def start_from_base(cfg, out_dir: str | Path, assets_dir: str | Path, *, memory: str) -> dict:
    """Copy the checked base to `<out>/policy` and score it on the run's held-out tasks."""
    from mem1_core.domains.inputs import ensure_tokenizer, load_tasks, make_env, prepare
    from mem1_core.evaluation.evaluate import evaluate_policy
    from mem1_core.models.base import check_base, resolve_base
    from mem1_core.models.model import load_model
    from mem1_core.runs.layout import RunPaths

    t0 = time.perf_counter()
    out = Path(out_dir).resolve()
    base = resolve_base(cfg.model.base)
    manifest = check_base(base)
    paths: RunPaths = prepare(cfg, Path(assets_dir).resolve())
    tok = ensure_tokenizer(cfg, paths)
    with atomic.atomic_dir(out / "policy") as tmp:
        for f in base.iterdir():
            if f.is_file():
                shutil.copy2(f, tmp / f.name)
    model = load_model(out / "policy", cfg.model, tok)
    n = cfg.data.train_objectives
    tasks = load_tasks(cfg, paths, "test", n)[:32]
    m = evaluate_policy(model, tok, make_env(cfg, paths, tok), tasks, cfg.rollout, memory=memory)
    final_loss = (manifest.get("curve") or [{}])[-1].get("loss")
    summary = {
        "objectives": [n],
        "eval_objectives": n,
        "memory": memory,
        "base": str(base),
        "base_commit": manifest.get("code_commit"),
        "base_minutes": manifest.get("minutes"),
        "steps": 0,
        "seconds": round(time.perf_counter() - t0, 1),
        "final_loss": final_loss,
        "eval_reward_before": m["em_frac"],
        "eval_reward_after": m["em_frac"],
        "eval_format_error_rate_after": m["format_error_rate"],
        "policy_dir": str(out / "policy"),
    }
    summary["metrics"] = {
        k: v for k, v in summary.items() if isinstance(v, (int, float)) and v is not None
    }
    atomic.write_json(summary, out / "result.json")
    return summary
