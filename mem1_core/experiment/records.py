"""An experiment's records: everything its headline is computed from, small and portable.

A run directory is scratch (weights, optimiser state, GB); what a claim needs is small. `export`
reads a run directory once and keeps:
- per world × agent × seed × N × task: the EM fraction, the peak tokens and the behaviour
  figures (mem1_core.evaluation.behaviour; reward and success where a domain's scorer gives
  them are the EM column in its units);
- per cell: the hash of its tasks (ids and gold answers, in order), the hash of the weights
  it played, its memory policy, scorer and wall seconds;
- per arm × seed: its trainer, memory, warm start, the hash of the weights it started from and
  of those it ended with, its training settings (the resolved config's fields that decide what
  it trains, the seed aside) and its held-out curve;
- per warm start: the hash of its weights and its settings;
- per part: which part of the experiment it is, the commit, each stage's wall time and CPU.

No weights, no optimiser state; trajectories only as an optional sample for the UI.

On disk (`write_records`, to a local path or any fsspec URL: s3://, gs://, where the
filesystem's package is installed): `records.json`, `tasks.jsonl`, optionally `samples.jsonl`,
and `manifest.json` last, naming every file with its size and sha256. A reader takes a
directory only with its manifest and every file matching it: an export stopped halfway is
never read as a finished one. `merge_records` joins parts (refusing, in one line naming the
source and the field, what does not pair) and the headline is a pure function of the merged
records (mem1_core.experiment.report.write_report).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

RECORDS_SCHEMA = 1
MANIFEST, RECORD, TASKS, SAMPLES = "manifest.json", "records.json", "tasks.jsonl", "samples.jsonl"


class RecordsError(ValueError):
    """Records that cannot be read or merged; the message is one line naming the source and
    the field."""


@dataclass
class Records:
    """One part's records (a run directory's export), or several parts' merged."""

    experiment: dict[str, Any]
    """The whole experiment's spec (ExperimentSpec.to_dict): the claims are judged by it."""
    config: dict[str, Any]
    """The experiment's resolved base config (config_json)."""
    own_world: int
    train_n: int
    worlds: list[int]
    """The evaluated worlds, the run's own first."""
    tasks: list[dict[str, Any]] = field(default_factory=list)
    """One row per world × agent × seed × N × task: world, agent, seed, N, task, em, peak,
    behaviour (a dict, or None where the trajectories have no turns)."""
    cells: list[dict[str, Any]] = field(default_factory=list)
    arms: list[dict[str, Any]] = field(default_factory=list)
    starts: dict[str, dict[str, Any]] = field(default_factory=dict)
    parts: list[dict[str, Any]] = field(default_factory=list)
    """Per part: its label, selection, run name, commit, stages ({stage: {seconds, cpus,
    reused_from}}), pending stages, and where it came from (`source`)."""
    samples: list[dict[str, Any]] = field(default_factory=list)

    def record(self) -> dict[str, Any]:
        """records.json: everything but the task rows and samples."""
        return {"schema": RECORDS_SCHEMA, "experiment": self.experiment, "config": self.config,
                "own_world": self.own_world, "train_n": self.train_n, "worlds": self.worlds,
                "cells": self.cells, "arms": self.arms, "starts": self.starts,
                "parts": self.parts}  # fmt: skip

    @property
    def pending(self) -> list[str]:
        return [f"{p['label']}: {s}" if len(self.parts) > 1 else s
                for p in self.parts for s in p.get("pending", [])]  # fmt: skip


# ---- export: a run directory, read once ---------------------------------------------------


def cell_files(
    eval_dir: str | Path, agents: set[str] | None, objectives: set[int] | None
) -> Iterator[tuple[str, int, Path]]:
    """(agent, N, trajectories file) of each evaluated cell, only `agents`' at `objectives`
    where given."""
    for path in sorted((Path(eval_dir) / "trajectories").glob("*_n*.parquet")):
        agent, _, n = path.stem.rpartition("_n")
        if not n.isdigit():
            continue
        if (agents is None or agent in agents) and (objectives is None or int(n) in objectives):
            yield agent, int(n), path


def weights_hash(policy_dir: str | Path) -> str | None:
    """sha256 over a saved policy's weight files (`*.safetensors`, `*.bin`) in name order;
    None where the directory holds none (a hub name, a policy not saved yet)."""
    p = Path(policy_dir)
    files = sorted(f for f in p.rglob("*") if f.suffix in (".safetensors", ".bin") and f.is_file())
    if not files:
        return None
    h = hashlib.sha256()
    for f in files:
        h.update(f.relative_to(p).as_posix().encode())
        with f.open("rb") as fh:
            while chunk := fh.read(1 << 22):
                h.update(chunk)
    return h.hexdigest()


def policy_hash(run_or_policy: str | Path, seen: dict[str, str | None] | None = None) -> str | None:
    """weights_hash of the policy a stage's directory holds (its `policy/`, its newest
    checkpoint's, or itself); None where it holds none yet. `seen`: hashes already taken in
    this export, by directory."""
    from mem1_core.runs.layout import resolve_init

    key = str(Path(run_or_policy).resolve())
    if seen is not None and key in seen:
        return seen[key]
    try:
        policy = resolve_init(run_or_policy) if Path(run_or_policy).exists() else None
    except FileNotFoundError:
        policy = None
    got = weights_hash(policy) if policy else None
    if seen is not None:
        seen[key] = got
    return got


def training_settings(cfg) -> dict[str, Any]:
    """The flattened config fields that decide what an arm trains: not the seed (parts differ
    there by design), nor the evaluation-only sections and NEUTRAL fields of a run record."""
    from mem1_core.config import config_json
    from mem1_core.experiment.plan import EVAL_ONLY, NEUTRAL

    flat = {f"{s}.{k}": v for s, sec in json.loads(config_json(cfg)).items()
            if isinstance(sec, dict) for k, v in sec.items()}  # fmt: skip
    skip = (*EVAL_ONLY, *NEUTRAL, "model.seed")
    return {k: v for k, v in sorted(flat.items())
            if not any(k == x or k.startswith(x + ".") for x in skip)}  # fmt: skip


def settings_changes(a: dict[str, Any], b: dict[str, Any]) -> list[str]:
    """The training settings (training_settings's flattened fields) that differ between two
    records, by the rule a resumed run's config is held to (mem1_core.config.loader.
    config_changes): a field one record lacks was added to the code after it was written and
    ran as its default, so it differs only where the other record's value is not the default;
    a field the code no longer has, recorded by one of them only, differs nowhere. Parts run
    at different commits merge while they train the same."""
    from mem1_core.config import Config

    defaults = training_settings(Config())
    absent = object()
    out = []
    for k in sorted(set(a) | set(b)):
        va, vb = a.get(k, absent), b.get(k, absent)
        if (va is absent or vb is absent) and k not in defaults:
            continue
        if (defaults[k] if va is absent else va) != (defaults[k] if vb is absent else vb):
            out.append(k)
    return out


def settings_hash(settings: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:16]


def tasks_hash(rows: list[dict[str, Any]]) -> str:
    """A cell's tasks, in order: their ids and gold answers."""
    ids = [(r["task_id"], r.get("golden_answers")) for r in rows]
    return hashlib.sha256(json.dumps(ids, default=list).encode()).hexdigest()[:16]


def _cell_rows(path: Path) -> tuple[list[dict], dict[str, dict] | None]:
    """(trajectory rows, task id -> behaviour) of one cell's Parquet, read once."""
    import pyarrow.parquet as pq

    from mem1_core.evaluation.behaviour import COLUMNS, behaviour_of_rows

    names = set(pq.read_schema(path).names)
    cols = {"task_id", "reward", "peak_tokens"} | ({"golden_answers"} & names)
    with_turns = set(COLUMNS) <= names
    rows = pq.read_table(path, columns=sorted(cols | (set(COLUMNS) if with_turns else set()))
                         ).to_pylist()  # fmt: skip
    return rows, behaviour_of_rows(rows) if with_turns else None


def export_run(run_dir: str | Path, samples: int = 0) -> Records:
    """A run directory's records (see the module's docstring); `samples`: that many
    trajectories per cell of the run's own world, as text, for the UI."""
    from mem1_core.evaluation.cells import record_path
    from mem1_core.experiment.configs import arm_config, base_config, warm_start_config
    from mem1_core.experiment.parts import part_label
    from mem1_core.experiment.plan import (
        SPEC_FILE,
        agent_dir,
        agent_names,
        arm_runs,
        code_commit,
        eval_worlds,
        split_agent,
        stage_status,
        warm_start_dir,
        world_dirs,
    )
    from mem1_core.experiment.walls import StageWalls

    run_dir = Path(run_dir)
    hashes: dict[str, str | None] = {}
    if not (run_dir / SPEC_FILE).is_file():
        raise RecordsError(f"{run_dir}: no {SPEC_FILE}: not an experiment run")
    saved = json.loads((run_dir / SPEC_FILE).read_text())
    from mem1_core.experiment.spec import ExperimentSpec

    spec = ExperimentSpec.from_dict(saved["experiment"])
    cfg = base_config(spec)
    worlds = eval_worlds(spec, cfg)
    names = set(agent_names(spec))
    out = Records(experiment=spec.whole or spec.to_dict(), config=saved["config"],
                  own_world=worlds[0], train_n=cfg.data.train_objectives, worlds=worlds)  # fmt: skip
    starts = {x.warm_start for x in spec.arms.values()} | {
        spec.warm_start_agents()[a] for a in spec.agents if a in spec.warm_start_agents()
    }
    for ws in spec.used_warm_starts():
        if ws in starts:
            out.starts[ws] = {
                "weights_hash": policy_hash(warm_start_dir(run_dir, ws), hashes),
                "settings": (ws_settings := training_settings(warm_start_config(spec, ws))),
                "settings_hash": settings_hash(ws_settings),
            }
    for run in arm_runs(spec, run_dir):
        a = spec.arms[run.arm]
        settings = training_settings(arm_config(spec, run.arm, run.seed))
        out.arms.append({
            "arm": run.arm, "seed": run.seed, "trainer": a.trainer, "memory": a.memory,
            "warm_start": a.warm_start,
            "start_hash": out.starts.get(a.warm_start, {}).get("weights_hash"),
            "weights_hash": policy_hash(run.dir, hashes),
            "settings_hash": settings_hash(settings), "settings": settings,
            "curve": read_curve(run.dir) if run.rl else [],
        })  # fmt: skip
    for w in worlds:
        for name, n, path in cell_files(world_dirs(run_dir, w)[1], names, set(spec.objectives)):
            agent, seed = split_agent(name, spec.agents)
            rows, behaviour = _cell_rows(path)
            meta = record_path(path)
            cell = json.loads(meta.read_text()) if meta.is_file() else {}
            out.cells.append({
                "world": w, "agent": agent, "seed": seed, "N": n, "tasks": len(rows),
                "tasks_hash": tasks_hash(rows), "memory": cell.get("memory"),
                "scorer": cell.get("scorer"), "seconds": cell.get("seconds"),
                "weights_hash": policy_hash(agent_dir(spec, run_dir, agent, seed), hashes),
                "behaviour": behaviour is not None,
            })  # fmt: skip
            for r in rows:
                t = str(r["task_id"])
                out.tasks.append({"world": w, "agent": agent, "seed": seed, "N": n, "task": t,
                                  "em": float(r["reward"]), "peak": float(r["peak_tokens"]),
                                  "behaviour": behaviour[t] if behaviour else None})  # fmt: skip
            if samples and w == worlds[0]:
                out.samples += [_sample(w, agent, seed, n, r) for r in rows[:samples]]
    walls = StageWalls(run_dir)
    cpus, reused = walls.cpus(), walls.reused()
    out.parts.append({
        "label": part_label(spec), "selection": spec.selection, "run": run_dir.name,
        "code": saved.get("code") or {}, "exported_with": code_commit(),
        "stages": {k: {"seconds": v, "cpus": cpus.get(k, []), "reused_from": reused.get(k)}
                   for k, v in walls.read().items()},
        "pending": [str(s) for s in stage_status(spec, cfg, run_dir) if not s.finished],
        "source": str(run_dir),
    })  # fmt: skip
    return out


def read_curve(run_dir: Path) -> list[dict[str, Any]]:
    """One row per PPO iteration of an arm run: sampled reward, KL to the start, the held-out
    EM at the training N (`eval/reward`) and at longer N (`eval/n<N>/reward`)."""
    path = Path(run_dir) / "metrics.jsonl"
    if not path.is_file():
        return []
    keep = ("iteration", "reward", "kl", "eval/reward", "seconds")
    rows = [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
    return [
        {k: r[k] for k in r if k in keep or (k.startswith("eval/n") and k.endswith("/reward"))}
        for r in rows
        if "iteration" in r
    ]


def _sample(world: int, agent: str, seed, n: int, row: dict) -> dict[str, Any]:
    turns = [{"action": a, "text": g, "info": i} for a, g, i in
             zip(row.get("turn_action") or [], row.get("turn_gen_text") or [],
                 row.get("turn_info_text") or [], strict=False)]  # fmt: skip
    return {"world": world, "agent": agent, "seed": seed, "N": n, "task": str(row["task_id"]),
            "em": float(row["reward"]), "gold": row.get("golden_answers"), "turns": turns}  # fmt: skip


# ---- on disk: atomic, local or any fsspec URL ---------------------------------------------


def _jsonl(rows: list[dict]) -> bytes:
    return "".join(json.dumps(r, sort_keys=True) + "\n" for r in rows).encode()


def write_records(rec: Records, out: str, storage_options: dict | None = None) -> dict[str, Any]:
    """Write `rec` under `out` (a path or fsspec URL); the manifest goes last, after removing
    an older one, so that a reader never takes a half-written directory for a finished one.
    -> the manifest."""
    import fsspec

    fs, root = fsspec.core.url_to_fs(str(out), **(storage_options or {}))
    fs.makedirs(root, exist_ok=True)
    if fs.exists(f"{root}/{MANIFEST}"):
        fs.rm(f"{root}/{MANIFEST}")
    files = {RECORD: json.dumps(rec.record(), indent=1, sort_keys=True).encode(),
             TASKS: _jsonl(rec.tasks)}  # fmt: skip
    if rec.samples:
        files[SAMPLES] = _jsonl(rec.samples)
    for name, data in files.items():
        with fs.open(f"{root}/{name}", "wb") as f:
            f.write(data)
    manifest = {"schema": RECORDS_SCHEMA,
                "files": {k: {"bytes": len(v), "sha256": hashlib.sha256(v).hexdigest()}
                          for k, v in files.items()}}  # fmt: skip
    tmp = f"{root}/{MANIFEST}.tmp"
    with fs.open(tmp, "wb") as f:
        f.write(json.dumps(manifest, indent=1).encode())
    fs.mv(tmp, f"{root}/{MANIFEST}")
    return manifest


def is_records(source: str, storage_options: dict | None = None) -> bool:
    import fsspec

    fs, root = fsspec.core.url_to_fs(str(source), **(storage_options or {}))
    return fs.exists(f"{root}/{MANIFEST}")


def read_records(source: str, storage_options: dict | None = None) -> Records:
    """Records from an export (a directory or URL with a manifest) or from an experiment run
    directory (exported on the fly)."""
    import fsspec

    if "://" not in str(source) and (Path(source) / "experiment.json").is_file():
        return export_run(source)
    fs, root = fsspec.core.url_to_fs(str(source), **(storage_options or {}))
    if not fs.exists(f"{root}/{MANIFEST}"):
        raise RecordsError(
            f"{source}: no {MANIFEST}: neither finished records (an export stopped halfway has "
            "none) nor an experiment run directory"
        )
    manifest = json.loads(fs.cat_file(f"{root}/{MANIFEST}"))
    data = {}
    for name, want in manifest["files"].items():
        got = fs.cat_file(f"{root}/{name}") if fs.exists(f"{root}/{name}") else b""
        if hashlib.sha256(got).hexdigest() != want["sha256"]:
            raise RecordsError(f"{source}/{name}: does not match {MANIFEST} (files.{name}.sha256)")
        data[name] = got
    r = json.loads(data[RECORD])
    if r.get("schema") != RECORDS_SCHEMA:
        raise RecordsError(f"{source}/{RECORD}: schema {r.get('schema')}, this code reads "
                           f"{RECORDS_SCHEMA} (field schema)")  # fmt: skip
    rows = [json.loads(x) for x in data[TASKS].decode().splitlines() if x]
    samples = [json.loads(x) for x in data.get(SAMPLES, b"").decode().splitlines() if x]
    rec = Records(r["experiment"], r["config"], r["own_world"], r["train_n"], r["worlds"],
                  rows, r["cells"], r["arms"], r["starts"], r["parts"], samples)  # fmt: skip
    for p in rec.parts:
        p["source"] = str(source)
    return rec
