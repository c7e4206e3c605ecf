"""Old names still read, until REMOVED_IN: what the `policy` -> `memory` rename left in files
and commands written before it (a memory policy builds contexts; "the policy" is the trained
model), and the Python names that moved or were renamed (`MOVED`: issue 29's names that
misled). Every reader of an old name goes through here, so removing them is deleting this
module's entries and the lines that import it.

Imports nothing from mem1_core: any layer may use it.
"""

from __future__ import annotations

import importlib
import warnings
from collections.abc import Callable, Mapping
from typing import Any

REMOVED_IN = "0.2.0"
"""The release in which the old names below stop being read."""

MEMORY_RENAMES: dict[str, str] = {
    "rollout.policy": "rollout.memory",
    "policy": "memory",
    "--policies": "--memories",
}
"""Old name -> new name. `rollout.policy`: a config field (YAML, --set, a checkpoint's
config.json). `policy`: the column of trajectory Parquet files and of the scaling table, the
key of SFT and base-start summaries, the `train-ppo-mem1` flow parameter. `--policies`: the
option of `mem1 bench trajectory`."""


def warn_renamed(old: str, where: str) -> None:
    """A DeprecationWarning that `where` used `old`, naming its replacement and REMOVED_IN."""
    warnings.warn(
        f"{where}: {old} is now {MEMORY_RENAMES[old]}; the old name is read until {REMOVED_IN}",
        DeprecationWarning,
        stacklevel=3,
    )


def read_renamed(values: Mapping[str, Any], old: str, where: str, default: Any = None) -> Any:
    """values[new name of `old`], else values[old] (written before the rename; with a
    warning), else `default`."""
    new = MEMORY_RENAMES[old].rpartition(".")[2]
    key = old.rpartition(".")[2]
    if values.get(new) is not None:
        return values[new]
    if values.get(key) is not None:
        warn_renamed(old, where)
        return values[key]
    return default


RETIRED_FIELDS: dict[str, str] = {
    "pretrain.eval_every_minutes": "pretrain.eval_every (steps): evaluations on a clock made "
    "a run's curve depend on the machine's load (issue 28)",
}
"""Config fields still honoured until REMOVED_IN, with what replaces each and why."""


def warn_retired(field: str) -> None:
    """A DeprecationWarning that the config sets `field` (a key of RETIRED_FIELDS)."""
    warnings.warn(
        f"{field} is deprecated: use {RETIRED_FIELDS[field]}; it is read until {REMOVED_IN}",
        DeprecationWarning,
        stacklevel=3,
    )


MOVED: dict[str, str] = {
    "mem1_core.training.train_rl.PPO_DEFAULTS": "mem1_core.config.training.PPO_DEFAULTS",
    "mem1_core.training.train_rl.GRPO_DEFAULTS": "mem1_core.config.training.GRPO_DEFAULTS",
    "mem1_core.training.train_rl.TRAINER_DEFAULTS": "mem1_core.config.training.TRAINER_DEFAULTS",
    # the metrics and W&B sink, not a stage's progress (mem1_core.runs.progress.Progress)
    "mem1_core.training.train_rl.Progress": "mem1_core.training.train_rl.MetricsSink",
    # it trains the full-context agent too; its Prefect flow name stays train-ppo-mem1
    "flows.stages.train_ppo_mem1": "flows.stages.train_ppo",
    # the index of a run's config, beside retrieval.ensure_index (of a corpus)
    "mem1_core.runs.assets.ensure_index": "mem1_core.retrieval.run_index.ensure_run_index",
    # runs/ keeps the layout, checkpoints and atomic writes; a run's inputs are made where
    # they are made (issue 29): mem1_core.runs.assets is only these names now
    # a run's summary is rendered beside the headline it renders
    "mem1_core.runs.summary.PLOTS": "mem1_core.evaluation.run_summary.PLOTS",
    "mem1_core.runs.summary.run_headline": "mem1_core.evaluation.run_summary.run_headline",
    "mem1_core.runs.summary.render_headline": "mem1_core.evaluation.run_summary.render_headline",
    "mem1_core.runs.summary.render_summary": "mem1_core.evaluation.run_summary.render_summary",
    "mem1_core.runs.assets.ensure_world": "mem1_core.data.run_tasks.ensure_world",
    "mem1_core.runs.assets.corpus_path": "mem1_core.data.run_tasks.corpus_path",
    "mem1_core.runs.assets.ensure_tasks": "mem1_core.data.run_tasks.ensure_tasks",
    "mem1_core.runs.assets.teacher_world": "mem1_core.data.run_tasks.teacher_world",
    "mem1_core.runs.assets.ensure_tokenizer": "mem1_core.models.policy.ensure_tokenizer",
    "mem1_core.runs.assets.ADOPTED": "mem1_core.models.policy.ADOPTED",
    "mem1_core.runs.assets.adopt_init_tokenizer": "mem1_core.models.policy.adopt_init_tokenizer",
    "mem1_core.runs.assets.initial_policy": "mem1_core.models.policy.initial_policy",
    "mem1_core.runs.assets.load_policy": "mem1_core.models.policy.load_policy",
    "mem1_core.runs.assets.index_options": "mem1_core.retrieval.run_index.index_options",
    "mem1_core.runs.assets.prebuilt_index": "mem1_core.retrieval.run_index.prebuilt_index",
    "mem1_core.runs.assets.ensure_run_index": "mem1_core.retrieval.run_index.ensure_run_index",
    "mem1_core.runs.assets.make_retriever": "mem1_core.retrieval.run_index.make_retriever",
    "mem1_core.runs.assets.make_env": "mem1_core.rollout.env.make_env",
    "mem1_core.runs.assets.TASK_COLUMNS": "mem1_core.rollout.inputs.TASK_COLUMNS",
    "mem1_core.runs.assets.read_task_file": "mem1_core.rollout.inputs.read_task_file",
    "mem1_core.runs.assets.load_tasks": "mem1_core.rollout.inputs.load_tasks",
    "mem1_core.runs.assets.prepare": "mem1_core.rollout.inputs.prepare",
    # a run's evaluation table (eval/metrics.csv), beside RunPaths.read_metrics (metrics.jsonl)
    "mem1_core.evaluation.compare.read_metrics": "mem1_core.evaluation.compare.read_eval_table",
}
"""Old module.name -> its new module.name: Python names that moved or were renamed. The old
module serves them through `moved_names` (its `__getattr__`), with a DeprecationWarning."""


def moved_names(module: str) -> Callable[[str], Any]:
    """The module `__getattr__` of `module` (`__getattr__ = moved_names(__name__)`): an old
    name of MOVED still imports, with a DeprecationWarning that names its replacement."""

    def __getattr__(name: str) -> Any:
        new = MOVED.get(f"{module}.{name}")
        if new is None:
            raise AttributeError(f"module {module!r} has no attribute {name!r}")
        warnings.warn(
            f"{module}.{name} is now {new}; the old name works until {REMOVED_IN}",
            DeprecationWarning,
            stacklevel=2,
        )
        where, _, attr = new.rpartition(".")
        return getattr(importlib.import_module(where), attr)

    return __getattr__
