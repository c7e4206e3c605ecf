"""What a training run asks of Ray, checked against the cluster before any actor starts, and
where its actors go.

`run_demands` lists the run's actors with the resources each asks for (CPUs, GPUs, reserved
memory) and the settings that change them. `reserve` compares them with the nodes of the
cluster Ray is connected to: a run the cluster can never hold (in all, or because one actor
is larger than any node) fails at once with one line that names what is missing and the
setting that changes it; a run that fits but finds the cluster busy waits, saying so every
`PROGRESS_EVERY_S`, for at most `resources.wait_seconds`. Ray itself would queue an
unschedulable actor forever without a word.

The rollout workers and the learner (or its FSDP ranks) are one placement group, packed onto
few nodes or spread over many (`resources.placement`); the retriever, which every worker
calls, has a one-bundle group of its own. A node that dies takes its bundles with it, and
Ray places them again on nodes with room: a rollout worker restarts there (the driver redoes
its share, mem1_core.training.runtime). `Placement.nodes` says where each actor runs, for the
run's record.

Storage: on more than one node the run directory must be shared (NFS, a mounted bucket).
The learner writes checkpoints and every actor reads the tokenizer, the index and the warm
start from it, wherever Ray placed them, so `check_shared_storage` writes a file from each
node and reads it back before the first actor starts.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mem1_core.config import ResourcesConfig
from mem1_core.runs.faults import RunStopped

log = logging.getLogger(__name__)

RETRIEVER_CPUS = 1.0
"""Logical CPUs the retriever actor asks for (BM25 is light; a dense encoder is not)."""
PROGRESS_EVERY_S = 10.0
"""How often a run waiting for a busy cluster says what it waits for."""
GIB = 1024**3
KINDS = {"CPU": "CPU", "GPU": "GPU", "memory": "GiB memory"}
"""Ray resources a run asks for -> how a message names them."""
PACKING_STEPS = 100_000
"""Most steps of the exact packing search; past it the run is assumed to fit (and waits)."""


class ClusterTooSmall(ValueError):
    """The Ray cluster can never hold the run as configured (the message says what to change)."""


@dataclass(frozen=True)
class Demand:
    """One actor of the run and the Ray resources it asks for."""

    name: str
    """`rollout_worker_0`, `learner`, `learner_rank_1`, `retriever`: the key in the run's record."""
    resources: dict[str, float]
    """Ray resource -> amount (CPU, GPU, memory in bytes); zero amounts left out."""
    settings: dict[str, str]
    """Ray resource -> the settings that change how much of it the run asks for (the
    message when it does not fit)."""
    group: str = "train"
    """Its placement group: `train` (workers and learner ranks) or `retriever`."""


def _nonzero(**amounts: float) -> dict[str, float]:
    return {k: float(v) for k, v in amounts.items() if v}


def run_demands(resources: ResourcesConfig, *, retriever: bool) -> list[Demand]:
    """The actors a run starts with their Ray resources: rollout workers, learner process(es),
    and the retriever actor when the run serves its own index (`retriever`)."""
    worker = _nonzero(
        CPU=resources.cpus_per_worker,
        GPU=resources.gpus_per_worker,
        memory=resources.worker_memory_gb * GIB,
    )
    settings = _settings_of(
        "resources.num_rollout_workers",
        CPU="resources.cpus_per_worker",
        GPU="resources.gpus_per_worker",
        memory="resources.worker_memory_gb",
    )
    out = [
        Demand(f"rollout_worker_{i}", worker, settings)
        for i in range(resources.num_rollout_workers)
    ]
    world = resources.learner_world
    rank = _nonzero(
        CPU=resources.learner_cpus,
        GPU=resources.learner_gpus / world,
        memory=resources.learner_memory_gb * GIB,
    )
    fsdp = resources.learner_strategy == "fsdp"
    settings = _settings_of(
        "resources.learner_ranks" if fsdp else None,
        CPU="resources.learner_cpus",
        GPU="resources.learner_gpus",
        memory="resources.learner_memory_gb",
    )
    if fsdp:
        out += [Demand(f"learner_rank_{r}", rank, settings) for r in range(world)]
    else:
        out.append(Demand("learner", rank, settings))
    if retriever:
        out.append(
            Demand(
                "retriever",
                {"CPU": RETRIEVER_CPUS},
                {"CPU": "retrieval.url (serve the index elsewhere)"},
                "retriever",
            )
        )
    return out


def _settings_of(count: str | None, **per_kind: str) -> dict[str, str]:
    """Resource kind -> `count, per_kind[kind]`: the settings that change it."""
    return {k: ", ".join(s for s in (count, v) if s) for k, v in per_kind.items()}


def memory_option(gb: float) -> dict[str, int]:
    """Ray actor options that reserve `gb` GiB of Ray's `memory` resource (none for 0)."""
    return {"memory": int(gb * GIB)} if gb else {}


def alive_nodes() -> list[dict[str, Any]]:
    """The cluster's live nodes: NodeID, NodeManagerAddress, Resources (totals)."""
    import ray

    return [n for n in ray.nodes() if n.get("Alive")]


def _fits(demands: list[dict[str, float]], capacity: list[dict[str, float]]) -> bool | None:
    """Whether every demand can be put on some node without overfilling it: an exact search
    over the few actors of a run, largest first. None when it ran past `PACKING_STEPS`."""
    order = sorted(demands, key=lambda d: tuple(-d.get(k, 0.0) for k in KINDS))
    left = [dict(c) for c in capacity]
    steps = 0

    def place(i: int) -> bool | None:
        nonlocal steps
        if i == len(order):
            return True
        tried: set[tuple] = set()
        for node in left:
            state = tuple(round(node.get(k, 0.0), 6) for k in KINDS)
            if state in tried:  # an identical node: the same subtree
                continue
            tried.add(state)
            if any(node.get(k, 0.0) + 1e-9 < v for k, v in order[i].items()):
                continue
            steps += 1
            if steps > PACKING_STEPS:
                return None
            for k, v in order[i].items():
                node[k] -= v
            found = place(i + 1)
            for k, v in order[i].items():
                node[k] += v
            if found is not False:
                return found
        return False

    return place(0)


def _amount(kind: str, value: float) -> str:
    return f"{value / GIB:.3g}" if kind == "memory" else f"{value:g}"


def fit_error(demands: list[Demand], nodes: list[dict[str, Any]]) -> str | None:
    """None if the demands can be placed on the nodes' total resources, else one line: what
    is missing and the settings that change it."""
    capacity = [{k: float(n["Resources"].get(k, 0.0)) for k in KINDS} for n in nodes]
    where = f"{len(nodes)} node{'s' if len(nodes) != 1 else ''}"
    for kind, unit in KINDS.items():
        asked = sum(d.resources.get(kind, 0.0) for d in demands)
        has = sum(c[kind] for c in capacity)
        if asked > has + 1e-9:
            users = [d for d in demands if d.resources.get(kind)]
            parts = _by_setting(users, kind)
            return (
                f"the Ray cluster cannot fit this run: it asks for {_amount(kind, asked)} {unit} "
                f"({parts}) and the cluster has {_amount(kind, has)} over {where}; lower "
                f"{_settings(users, [kind])}, or add nodes"
            )
    for d in demands:
        if not any(all(c[k] + 1e-9 >= v for k, v in d.resources.items()) for c in capacity):
            need = ", ".join(f"{_amount(k, v)} {KINDS[k]}" for k, v in d.resources.items())
            largest = ", ".join(
                f"{_amount(k, max(c[k] for c in capacity))} {u}" for k, u in KINDS.items()
            )
            short = [k for k, v in d.resources.items() if max(c[k] for c in capacity) < v]
            return (
                f"the Ray cluster cannot fit this run: {d.name} asks for {need} in one process "
                f"and no node has that much (the largest have {largest}); lower "
                f"{_settings([d], short or list(d.resources))}"
            )
    if _fits([d.resources for d in demands], capacity) is False:
        return (
            f"the Ray cluster cannot fit this run: its actors ({_by_setting(demands, 'CPU')} CPU) "
            f"fit the cluster's {where} in all but cannot be packed onto them, node by node; "
            f"lower {_settings(demands, list(KINDS))}, or add a larger node"
        )
    return None


def _by_setting(demands: list[Demand], kind: str) -> str:
    """`2 rollout workers x 1, learner 1, retriever 1`: who asks for `kind`."""
    groups: dict[str, list[float]] = {}
    for d in demands:
        groups.setdefault(d.name.rstrip("0123456789").rstrip("_"), []).append(
            d.resources.get(kind, 0.0)
        )
    parts = []
    for name, amounts in groups.items():
        each = _amount(kind, amounts[0])
        label = name.replace("_", " ")
        parts.append(f"{len(amounts)} {label}s x {each}" if len(amounts) > 1 else f"{label} {each}")
    return ", ".join(parts)


def _settings(demands: Iterable[Demand], kinds: list[str]) -> str:
    """The settings that change `kinds` of `demands`, each once: `a / b / c`."""
    names: list[str] = []
    for d in demands:
        for kind in kinds:
            for s in d.settings.get(kind, "").split(", "):
                if s and s not in names:
                    names.append(s)
    return " / ".join(names)


def node_label(node: dict[str, Any]) -> str:
    """`127.0.0.1/3f2a9c1e`: a node's address and the start of its id (nodes on one host
    share the address)."""
    return f"{node['NodeManagerAddress']}/{node['NodeID'][:8]}"


@dataclass
class Placement:
    """The run's placement groups and which demand holds which bundle."""

    groups: dict[str, Any]
    """`train` / `retriever` -> its PlacementGroup."""
    bundles: dict[str, tuple[str, int]] = field(default_factory=dict)
    """Demand name -> (group, bundle index)."""

    def options(self, name: str) -> dict[str, Any]:
        """Ray actor options that put the actor named `name` into its bundle."""
        if name not in self.bundles:
            return {}
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        group, index = self.bundles[name]
        return {
            "scheduling_strategy": PlacementGroupSchedulingStrategy(
                placement_group=self.groups[group], placement_group_bundle_index=index
            )
        }

    def node_ids(self) -> dict[str, str | None]:
        """Actor name -> the NodeID of its bundle now (None while Ray places it again)."""
        from ray.util import placement_group_table

        tables = {g: placement_group_table(pg) for g, pg in self.groups.items()}
        return {
            name: tables[group].get("bundles_to_node_id", {}).get(index) or None
            for name, (group, index) in self.bundles.items()
        }

    def nodes(self) -> dict[str, str]:
        """Actor name -> its node (`node_label`), as Ray placed its bundle now."""
        labels = {n["NodeID"]: node_label(n) for n in alive_nodes()}
        return {
            name: labels.get(node, "(being placed)") if node else "(being placed)"
            for name, node in self.node_ids().items()
        }

    def remove(self) -> None:
        from ray.util import remove_placement_group

        for pg in self.groups.values():
            remove_placement_group(pg)
        self.groups = {}


def reserve(resources: ResourcesConfig, demands: list[Demand]) -> Placement:
    """Check that the cluster can hold `demands` (ClusterTooSmall at once if it never can),
    then reserve them as placement groups, waiting for a busy cluster for at most
    `resources.wait_seconds` (RunStopped past it). Ray must be running."""
    from ray.util import placement_group

    nodes = alive_nodes()
    if (error := fit_error(demands, nodes)) is not None:
        raise ClusterTooSmall(error)
    placement = Placement({})
    t0 = time.monotonic()
    try:
        # One group after the other: a group created while another waits could take the
        # room that one needs.
        for group in ("train", "retriever"):
            members = [d for d in demands if d.group == group and d.resources]
            if not members:
                continue
            strategy = resources.placement.upper() if group == "train" else "PACK"
            pg = placement_group([d.resources for d in members], strategy)
            placement.groups[group] = pg
            placement.bundles |= {d.name: (group, i) for i, d in enumerate(members)}
            while not pg.wait(
                timeout_seconds=max(
                    1.0, min(PROGRESS_EVERY_S, t0 + resources.wait_seconds - time.monotonic())
                )
            ):
                waited = time.monotonic() - t0
                message = _waiting(demands, group, waited, resources.wait_seconds)
                if waited >= resources.wait_seconds:
                    raise RunStopped(message)
                log.warning(message)
                if (error := fit_error(demands, alive_nodes())) is not None:  # a node left
                    raise ClusterTooSmall(error)
    except BaseException:
        placement.remove()
        raise
    log.info("actors placed (%s): %s", resources.placement, placement.nodes())
    return placement


def place_run(resources: ResourcesConfig, demands: list[Demand], paths: list[Path]) -> Placement:
    """`reserve` the run's actors, then `check_shared_storage` of `paths` (the run directory
    first) on the nodes that hold them. -> the placement; nothing is left reserved if either
    fails."""
    placement = reserve(resources, demands)
    try:
        check_shared_storage(paths, placement.node_ids().values())
    except BaseException:
        placement.remove()
        raise
    return placement


def _waiting(demands: list[Demand], group: str, waited: float, cap: float) -> str:
    """The line a run waiting for a busy cluster prints (and stops with at the cap)."""
    import ray

    members = [d for d in demands if d.group == group and d.resources]
    free = ray.available_resources()
    total = ray.cluster_resources()
    asked = {k: sum(d.resources.get(k, 0.0) for d in members) for k in KINDS}
    need = ", ".join(f"{_amount(k, v)} {KINDS[k]}" for k, v in asked.items() if v)
    now = ", ".join(
        f"{_amount(k, free.get(k, 0.0))} of {_amount(k, total.get(k, 0.0))} {KINDS[k]}"
        for k, v in asked.items()
        if v
    )
    what = "the retriever" if group == "retriever" else "the rollout workers and the learner"
    head = (
        f"the Ray cluster is busy: stopped after {waited:.0f} s"
        if waited >= cap
        else f"waiting {waited:.0f} s of {cap:g}"
    )
    return (
        f"{head} for {what} ({need}); free now: {now}. Other jobs hold the rest; "
        "raise resources.wait_seconds to wait longer, or lower what the run asks for"
    )


def check_shared_storage(paths: list[Path], nodes: Iterable[str | None]) -> None:
    """On a cluster, check that every node in `nodes` (NodeIDs; the driver's own is skipped)
    reads a file the driver wrote in `paths[0]` (the run directory, which the actors write)
    and writes one the driver reads back, and sees `paths[1:]` (read-only inputs such as the
    warm start). Raise ClusterTooSmall with one line if not."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    here = ray.get_runtime_context().get_node_id()
    others = sorted(set(nodes) - {here, None})
    if not others:
        return
    root = paths[0]
    probe_dir = root / ".shared-check"
    probe_dir.mkdir(parents=True, exist_ok=True)
    token = uuid.uuid4().hex
    (probe_dir / token).write_text(token)
    probe = ray.remote(num_cpus=0, max_retries=0)(_probe_storage)
    labels = {n["NodeID"]: node_label(n) for n in alive_nodes()}
    calls = {
        node: probe.options(
            scheduling_strategy=NodeAffinitySchedulingStrategy(node_id=node, soft=False)
        ).remote(str(probe_dir), token, node, [str(p) for p in paths[1:]])
        for node in others
    }
    try:
        for node, call in calls.items():
            problem = ray.get(call, timeout=120)
            reply = probe_dir / f"{token}.{node}"
            if problem is None and not reply.is_file():
                problem = f"it wrote {reply} and the driver cannot read it"
            if problem is not None:
                raise ClusterTooSmall(
                    f"the run directory {root} is not shared with node {labels.get(node, node)}: "
                    f"{problem}. Every node reads and writes the run directory (checkpoints, the "
                    "tokenizer, the index): put --out on storage all nodes mount at the same "
                    "path (NFS, a mounted bucket)"
                )
    finally:
        for f in probe_dir.glob(f"{token}*"):
            f.unlink(missing_ok=True)


def _probe_storage(probe_dir: str, token: str, node: str, inputs: list[str]) -> str | None:
    """Runs on a node: None if it reads the driver's token file and can write its reply,
    else what went wrong."""
    import os

    path = Path(probe_dir) / token
    try:
        if path.read_text() != token:
            return f"it reads another {path} than the driver wrote"
    except OSError:
        return f"it cannot read {path}, which the driver wrote"
    try:
        (Path(probe_dir) / f"{token}.{node}").write_text(token)
    except OSError as e:
        return f"it cannot write there ({e.strerror})"
    missing = [p for p in inputs if not os.path.exists(p)]
    if missing:
        return f"it does not see {', '.join(missing)}"
    return None
