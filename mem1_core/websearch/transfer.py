"""Zero-shot transfer to a web search API (MEM1 §5: the agent trained on a Wikipedia
retriever, evaluated through a search engine), run offline: the same agents play the same
test tasks twice, once on the run's local index and once through the web-search backend
(the web-search QA domain, `env.kind=websearch`) pointed at the local stand-in of a Serper-style API, which answers
from that index (mem1_core.websearch.standin). Each arm is an ordinary objective-scaling
evaluation (mem1_core.evaluation.stage); the record is their table side by side, with the
paired difference per N.

Where it departs from the paper: the stand-in serves the world's documents, not the web, so
this measures what the web path does to the agent (the request, the answer's shape, the
snippets, the cache), not how a live engine's results differ from Wikipedia's. With whole
documents as snippets the two arms must agree exactly; `snippet_chars` cuts them short as a
search engine does.
"""

from __future__ import annotations

import dataclasses
import os
import platform
import secrets
import subprocess
import time
from pathlib import Path
from typing import Any

from mem1_core.domains.registry import get_domain
from mem1_core.evaluation.headline import paired_se, read_headline
from mem1_core.evaluation.stage import run_objective_scaling
from mem1_core.retrieval.index import load_index
from mem1_core.runs import atomic
from mem1_core.runs.layout import RunPaths
from mem1_core.websearch.standin import standin_server

STANDIN_KEY_ENV = "MEM1_STANDIN_SEARCH_KEY"
"""The variable the web arm reads the stand-in's (random, per process) key from."""
STANDIN_PORT = 8765
"""The stand-in's default port: fixed, so that a rerun asks the same endpoint and is served
from the cache (the endpoint is part of the cache key) and resumes the evaluation's cells."""
ARMS = ("local", "web")


def web_config(cfg: Any, endpoint: str, key_env: str, cache: str | Path) -> Any:
    """`cfg` moved to the web-search QA domain, searching the API at `endpoint`."""
    retrieval = dataclasses.replace(
        cfg.retrieval,
        url=None,
        web_endpoint=endpoint,
        web_api_key_env=key_env,
        web_cache=str(cache),
    )
    env = dataclasses.replace(cfg.env, kind="websearch")
    return dataclasses.replace(cfg, env=env, retrieval=retrieval)


def run_web_transfer(
    cfg: Any,
    run_dir: str | Path,
    out_dir: str | Path,
    agents: list[tuple[str, str, str]],
    objectives: tuple[int, ...],
    *,
    port: int = STANDIN_PORT,
    snippet_chars: int | None = None,
    command: str = "",
    progress: bool = True,
) -> dict[str, Any]:
    """Evaluate `agents` (name, policy dir, memory) at each N of `objectives` on the local
    index and through the stand-in; the evaluations (trajectories, plots) go under
    `run_dir/web-transfer/`, the small record (`transfer.json`, `transfer.md`; with
    `snippet_chars`, `transfer-snippets<chars>.*`) to `out_dir`."""
    start, cpu_start = time.monotonic(), time.process_time()
    work = RunPaths(Path(run_dir).resolve()).root / "web-transfer"
    local = run_objective_scaling(
        cfg, run_dir, work / "local", agents, teacher=False, objectives=objectives,
        progress=progress,
    )  # fmt: skip
    paths = RunPaths(Path(run_dir).resolve())
    index = load_index(get_domain("qa").ensure_index(cfg, paths))
    # The snippet length is the stand-in's, in no config: it names the web arm's cache and
    # evaluation, so that answers and cells of another length are never read back for these.
    tag = "web" if snippet_chars is None else f"web-snippets{snippet_chars}"
    os.environ[STANDIN_KEY_ENV] = key = secrets.token_hex(16)
    with standin_server(index, api_key=key, port=port, snippet_chars=snippet_chars) as standin:
        wcfg = web_config(cfg, standin.url, STANDIN_KEY_ENV, paths.root / f"{tag}_cache")
        web = run_objective_scaling(
            wcfg, run_dir, work / tag, agents, teacher=False, objectives=objectives,
            progress=progress,
        )  # fmt: skip
        requests = standin.requests
    heads = {"local": read_headline(work / "local"), "web": read_headline(work / tag)}
    record = {
        "command": command,
        "what": "zero-shot: the same agents on the run's local BM25 index and through the "
        "web-search backend on the stand-in of a Serper-style API serving that index",
        "objectives": list(objectives),
        "agents": [{"name": n, "policy": p, "memory": m} for n, p, m in agents],
        "snippet_chars": snippet_chars,
        "standin_requests": requests,
        "rows": transfer_rows(heads),
        "scorer": cfg.eval.scorer,
        "config": {"local": cfg.retrieval.to_dict(), "web": wcfg.retrieval.to_dict()},
        "eval_dirs": {"local": str(work / "local"), "web": str(work / tag)},
        "wall_seconds": round(time.monotonic() - start, 1),
        "cpu_seconds": round(time.process_time() - cpu_start, 1),
        "machine": {"cpu": _cpu_name(), "cores": os.cpu_count()},
        "commit": _commit(),
    }
    out = Path(out_dir)
    name = "transfer" if snippet_chars is None else f"transfer-snippets{snippet_chars}"
    atomic.write_json(record, out / f"{name}.json")
    atomic.write_text(render_markdown(record), out / f"{name}.md")
    return record | {"headlines": {"local": local["headline"], "web": web["headline"]}}


def transfer_rows(heads: dict[str, dict]) -> list[dict[str, Any]]:
    """One row per agent and N: each arm's EM fraction and EM sum ± SE and peak tokens, and
    the web − local EM difference with its paired SE (the same tasks in both arms)."""
    cells = {arm: {(c["agent"], c["N"]): c for c in heads[arm]["cells"]} for arm in ARMS}
    rows = []
    for agent, n in sorted(cells["local"], key=lambda k: (k[0], k[1])):
        if (agent, n) not in cells["web"]:
            continue
        row: dict[str, Any] = {"agent": agent, "N": n}
        for arm in ARMS:
            c = cells[arm][(agent, n)]
            row[arm] = {k: c[k] for k in ("tasks", "em_frac", "em_frac_se", "em_sum", "em_sum_se",
                                          "peak_tokens", "peak_tokens_se")}  # fmt: skip
        tasks = [heads[arm].get("task_em", {}).get(agent, {}).get(str(n)) for arm in ARMS]
        row["web_minus_local_em"] = row["web"]["em_frac"] - row["local"]["em_frac"]
        row["web_minus_local_em_se_paired"] = paired_se(tasks[1], tasks[0])
        rows.append(row)
    return rows


def _pm(x: float | None, se: float | None, digits: int = 3) -> str:
    if x is None:
        return "—"
    return f"{x:.{digits}f}" if se is None else f"{x:.{digits}f} ± {se:.{digits}f}"


def _snippets(chars: int | None) -> str:
    return "whole documents" if chars is None else f"documents cut to {chars} characters"


def render_markdown(record: dict[str, Any]) -> str:
    lines = [
        "# Zero-shot transfer to the web-search backend (stand-in)",
        "",
        record["what"] + ".",
        "",
        f"Command: `{record['command']}`",
        "",
        f"Snippets: {_snippets(record['snippet_chars'])}; requests the stand-in answered: "
        f"{record['standin_requests']} (0 in a rerun: the cache and the evaluation's resume "
        f"answer it); wall {record['wall_seconds']} s, process CPU "
        f"{record['cpu_seconds']} s on {record['machine']['cpu']} ({record['machine']['cores']} "
        f"cores); commit {record['commit']}.",
        "",
        "| agent | N | tasks | EM sum, local | EM sum, web | web − local, EM fraction (paired SE) "
        "| peak tokens, local | peak tokens, web |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in record["rows"]:
        lo, we = r["local"], r["web"]
        lines.append(
            f"| {r['agent']} | {r['N']} | {lo['tasks']} | {_pm(lo['em_sum'], lo['em_sum_se'])} | "
            f"{_pm(we['em_sum'], we['em_sum_se'])} | "
            f"{_pm(r['web_minus_local_em'], r['web_minus_local_em_se_paired'])} | "
            f"{_pm(lo['peak_tokens'], lo['peak_tokens_se'], 1)} | "
            f"{_pm(we['peak_tokens'], we['peak_tokens_se'], 1)} |"
        )
    lines += ["", "EM sum: exact match summed over the N objectives (0..N), ± its standard error."]
    return "\n".join(lines) + "\n"


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _commit() -> str | None:
    root = Path(__file__).resolve().parents[2]
    try:
        return subprocess.run(
            ["git", "-C", str(root), "rev-parse", "--short", "HEAD"],
            capture_output=True, text=True, timeout=10, check=True,
        ).stdout.strip()  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return None
