"""Where RL training runs: rollout workers, a learner and the retriever as Ray actors
(docs/design.md §4.6), or the same classes as plain objects in this process (`use_ray=False`).
`Runtime` is the driver's view of them, calling remote and local actors alike:

- the rollout workers (mem1_core.training.workers.RolloutWorker), each rolling out a share
  of an iteration's tasks;
- the learner (mem1_core.training.learner.Learner), or under
  `resources.learner_strategy=fsdp` a group of ranks (mem1_core.training.fsdp_learner):
  every learner call goes to all of them (each call is a collective) and returns rank 0's
  answer;
- the retriever: mem1_core.retrieval.ray_actor.RetrieverActor, one per run.

mem1_core.training.actor_start starts them (`start_runtime`: placement, parked actors of an
earlier run). Weights go learner -> workers through the Ray object store: the driver passes
the ObjectRef that `get_weights` returned (Ray already stored the result there) to every
worker, so the weights never pass through the driver.

Faults. A rollout worker is a Ray actor with `WORKER_RESTARTS` restarts: when its process
dies mid-rollout, the driver waits for Ray to restart it, sends it the learner's current
weights and asks again for the same share (same tasks, same seed), so the iteration goes on
as if nothing happened. Each weight sync carries a version that a worker must hold to roll
out (`WeightsOutOfDate`), so a worker that restarted unseen, between two calls, is found and
brought up to date too. The learner is not restarted: its state since the last checkpoint
(weights, optimiser moments) is gone with it, so its death stops the run (`ActorLost`) and
`--resume` continues from the checkpoint. A node lost mid-run takes its placement bundles
with it and Ray places them again where there is room: a rollout worker restarts there as
above. When the remaining nodes cannot hold the run, waiting for the restart ends with
`ActorLost`.

Overlapped rollouts (`ppo.overlap_rollouts`). `start_rollout` sends the workers their shares
and returns at once (`PendingRollout`); `collect` waits for the answers. A Ray actor runs its
calls in the order they were sent, so a rollout started before the learner's update samples
with the weights of the sync before it, and the weights that `sync_weights(wait=False)`
sends after the update load once that rollout is done: the driver need not wait for them
(they are waited for when the next rollout starts). In this process (`use_ray=False`) a
rollout runs when it is started, so the same schedule runs one step after the other.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mem1_core.config import Config
from mem1_core.rollout.loop import Task
from mem1_core.runs.faults import ActorLost
from mem1_core.training import actor_pool
from mem1_core.training.checkpoint import TrainState
from mem1_core.training.placement import Placement, alive_nodes, fit_error
from mem1_core.training.workers import WeightsOutOfDate
from mem1_core.trajectory.record import Trajectory

log = logging.getLogger(__name__)
WORKER_RESTARTS = 3
"""Times Ray restarts a rollout worker whose process died (and the driver retries its share)."""
WORKER_RESTART_TIMEOUT_S = 600.0
"""Longest wait for a restarted worker to answer (it imports torch and loads its model)."""


def _handled_cause(error: Exception) -> Exception | None:
    """What an actor raised, for the faults the driver handles by type (a full disk, the
    retriever down, a worker out of date), else None. Ray hands them over wrapped in a
    RayTaskError, whose text is the remote traceback; it is re-raised as their cause."""
    cause = getattr(error, "cause", None)
    return cause if isinstance(cause, (OSError, WeightsOutOfDate)) else None


@dataclass
class PendingRollout:
    """A rollout sent to the workers (`Runtime.start_rollout`), answered by `Runtime.collect`."""

    shares: dict[int, dict[str, Any]]
    """Worker index -> the arguments of its call (its tasks, seed, weights version)."""
    calls: dict[int, Any]
    """Worker index -> its answer: an ObjectRef (Ray), or the trajectories (in process)."""
    weights_version: int
    """The weight sync the workers sample with. A share redone after its worker died is
    sampled with the learner's weights of then (`Runtime._rollout_share`), which can be newer."""
    busy_seconds: float = 0.0
    """Set by `collect`: the longest share's rollout time (generation and environment), as the
    trajectories record it; the driver may have waited less (the rollout ran beside an update)."""


def merge_rank_stats(per_rank: list[dict[str, Any]]) -> dict[str, Any]:
    """One update's statistics from every FSDP rank -> rank 0's, with each phase timer
    (`phase_*_seconds`) the slowest rank's (a collective waits for it) and
    `phase_*_seconds_spread`, slowest minus fastest: where a straggler rank shows."""
    out = dict(per_rank[0])
    for key in per_rank[0]:
        if key.startswith("phase_") and key.endswith("_seconds"):
            times = [float(r[key]) for r in per_rank]
            out[key] = max(times)
            out[f"{key}_spread"] = max(times) - min(times)
    return out


class Runtime:
    """Workers and learner, remote (Ray actors) or local (plain objects), called alike.
    `learners` is the one Learner, or the FSDP group's ranks (rank 0 first): every learner
    call goes to all of them and returns rank 0's answer."""

    def __init__(
        self,
        workers: list[Any],
        learners: list[Any],
        remote: bool,
        owns_ray: bool = False,
        retriever: Any = None,
        placement: Placement | None = None,
    ):
        self.workers, self.learners, self.remote = workers, learners, remote
        self.owns_ray, self.retriever = owns_ray, retriever
        self.placement = placement
        """The placement groups that hold the actors (Ray only)."""
        self.demands: list = []
        """What the actors ask of Ray (placement.run_demands): the fit check when a node is lost."""
        self.reuse_key: tuple | None = None
        """Set when these actors may serve a later run of the same shape (actor_pool)."""
        self.worker_args: tuple | None = None
        """What `RolloutWorker.reset` takes to make a worker serve this run. Set by `reset`
        only: a worker Ray restarts runs its constructor with the arguments it was created
        with, which are this run's unless the actors came from an earlier run."""
        self.weights_version = 0
        """Bumped at every weight sync; a worker must hold the current one to roll out."""
        self._loads: list[Any] = []
        """Weight loads `sync_weights(wait=False)` sent and nobody has waited for yet."""
        self._rollout_info: dict[str, str | None] | None = None

    def rollout_info(self) -> dict[str, Any]:
        """What the rollout workers generate with (RolloutWorker.describe of the first one:
        all run one backend): rollout_backend, vllm_version, rollout_python; and on Ray
        `actor_nodes`, each actor's node now (placement.node_label), a dict."""
        if self._rollout_info is None:
            self._rollout_info = self._get(self._call(self.workers[0], "describe"))
            if self.placement is not None:
                self._rollout_info["actor_nodes"] = self.placement.nodes()
                log.info("actor nodes: %s", self._rollout_info["actor_nodes"])
        return self._rollout_info

    def _call(self, target: Any, method: str, *args: Any, **kwargs: Any) -> Any:
        fn = getattr(target, method)
        return fn.remote(*args, **kwargs) if self.remote else fn(*args, **kwargs)

    def _get(self, value: Any, timeout: float | None = None) -> Any:
        if not self.remote:
            return value
        import ray

        try:
            return ray.get(value, timeout=timeout)
        except ray.exceptions.RayTaskError as e:
            if (cause := _handled_cause(e)) is None:
                raise
            raise cause from e

    def rollout(
        self, tasks: list[Task], seed: int, *, greedy: bool = False, samples_per_task: int = 1
    ) -> list[Trajectory]:
        """Split `tasks` into contiguous shares, one per worker; trajectories in task order."""
        return self.collect(
            self.start_rollout(tasks, seed, greedy=greedy, samples_per_task=samples_per_task)
        )

    def start_rollout(
        self, tasks: list[Task], seed: int, *, greedy: bool = False, samples_per_task: int = 1
    ) -> PendingRollout:
        """Send each worker its share of `rollout` and return without waiting (in this
        process: roll out now). The workers sample with the weights of the latest sync."""
        self._settle_loads()
        n = len(self.workers)
        bounds = [len(tasks) * i // n for i in range(n + 1)]
        shares = {
            i: dict(
                tasks=tasks[bounds[i] : bounds[i + 1]],
                seed=seed * 1009 + i,
                greedy=greedy,
                samples_per_task=samples_per_task,
                group_offset=bounds[i],
                weights_version=self.weights_version if self.remote else None,
            )
            for i in range(n)
            if bounds[i + 1] > bounds[i]
        }
        calls = {i: self._call(self.workers[i], "rollout", **kw) for i, kw in shares.items()}
        return PendingRollout(shares, calls, self.weights_version)

    def collect(self, pending: PendingRollout) -> list[Trajectory]:
        """The trajectories of a started rollout, in task order (each share retried on a
        restarted worker if its process died)."""
        answers = [self._rollout_share(i, call, pending) for i, call in pending.calls.items()]
        pending.busy_seconds = max((sum(t.wall_seconds for t in a) for a in answers), default=0.0)
        return [t for a in answers for t in a]

    def _rollout_share(self, i: int, call: Any, pending: PendingRollout) -> list[Trajectory]:
        """Worker `i`'s answer to `call`. If its process died (or restarted since the last
        weight sync), wait for Ray's restart, send it the learner's weights and ask again
        for the same share: the answer is the one the first call would have given, unless a
        sync came between the start of the rollout and the retry (an overlapped rollout):
        then the share is sampled with the newer weights, and `pending` says so."""
        if not self.remote:
            return call
        import ray

        share = pending.shares[i]

        for attempt in range(WORKER_RESTARTS + 1):
            try:
                return self._get(call)
            except (ray.exceptions.RayActorError, WeightsOutOfDate) as e:
                self._raise_if_learner(e, "a rollout")
                if attempt == WORKER_RESTARTS:
                    raise ActorLost(
                        f"rollout worker {i} died {attempt + 1} times in one rollout "
                        f"({type(e).__name__})"
                    ) from e
                log.warning(
                    "rollout worker %d lost its share (%s: %s); restarting it and retrying",
                    i,
                    type(e).__name__,
                    str(e).splitlines()[0][:200],
                )
                try:
                    self._revive_worker(i)
                except ray.exceptions.RayActorError as dead:
                    self._raise_if_learner(dead, "a worker's restart")
                    raise ActorLost(f"rollout worker {i} could not be restarted: {dead}") from dead
                share["weights_version"] = self.weights_version  # what _revive_worker loaded
                pending.weights_version = min(pending.weights_version, self.weights_version)
                call = self._call(self.workers[i], "rollout", **share)
        raise AssertionError("unreachable")

    def _revive_worker(self, i: int) -> None:
        """Bring worker `i` back to this run's state: wait until Ray has restarted its
        process, give it this run's arguments if the actor came from an earlier run, then
        the learner's current weights."""
        import ray

        worker, t0 = self.workers[i], time.perf_counter()
        while True:  # a call to a restarting actor fails at once (ActorUnavailableError)
            try:
                pid = self._get(worker.pid.remote(), timeout=5.0)
                break
            except (ray.exceptions.ActorUnavailableError, ray.exceptions.GetTimeoutError):
                if time.perf_counter() - t0 > WORKER_RESTART_TIMEOUT_S:
                    raise
                # A node lost: Ray places the worker again where there is room, if any.
                if (error := fit_error(self.demands, alive_nodes())) is not None:
                    raise ActorLost(f"a node left and {error}") from None
                time.sleep(0.5)
        self._rollout_info = None  # its node may have changed
        if self.worker_args is not None:
            self._get(worker.reset.remote(*self.worker_args))
        weights = [r.get_weights.remote() for r in self.learners]  # FSDP: a collective
        self._get_all([worker.load_weights.remote(weights[0], self.weights_version), *weights[1:]])
        log.warning(
            "rollout worker %d is back (pid %d) after %.1f s", i, pid, time.perf_counter() - t0
        )

    def _raise_if_learner(self, error: Exception, during: str) -> None:
        """Raise ActorLost if `error` says a learner process died (its own call failed, or
        a worker's call that waited on its weights)."""
        dead = getattr(error, "actor_id", None)
        if dead is not None and dead in {r._actor_id.hex() for r in self.learners}:
            raise ActorLost(
                f"the learner process died during {during} ({type(error).__name__}); its weights "
                "and optimiser state since the last checkpoint are lost"
            ) from error

    def _on_learners(self, method: str, *args: Any) -> Any:
        """Call `method` on every learner rank at once (a collective); -> rank 0's answer."""
        return self._on_every_learner(method, *args)[0]

    def _on_every_learner(self, method: str, *args: Any) -> list[Any]:
        """Call `method` on every learner rank at once (a collective); -> every rank's answer,
        rank 0 first (in this process: the one learner's). A learner process that died takes
        the run's training state with it: `ActorLost`."""
        calls = [self._call(r, method, *args) for r in self.learners]
        if not self.remote:
            return calls
        import ray

        try:
            return self._get_all(calls)
        except ray.exceptions.RayActorError as e:
            self._raise_if_learner(e, method)
            raise

    def _get_all(self, values: list[Any]) -> list[Any]:
        """`_get` of several calls that raises as soon as one of them fails: a failed rank
        leaves the others waiting in a collective, which would hold a plain ray.get of the
        list until the process group's timeout (shutdown then kills them)."""
        if not self.remote:
            return values
        import ray

        try:
            pending = list(values)
            while pending:
                done, pending = ray.wait(pending, num_returns=1)
                ray.get(done)
            return ray.get(values)
        except ray.exceptions.RayTaskError as e:
            if (cause := _handled_cause(e)) is None:
                raise
            raise cause from e

    def update(self, trajs: list[Trajectory], iteration: int) -> dict[str, Any]:
        if self.remote and len(self.learners) > 1:
            import ray

            trajs = ray.put(trajs)  # stored once, read by every rank
        per_rank = self._on_every_learner("update", trajs, iteration)
        return merge_rank_stats(per_rank) if len(per_rank) > 1 else per_rank[0]

    def sync_weights(self, *, wait: bool = True) -> None:
        """Learner -> object store -> every worker (an ObjectRef is resolved in the worker).
        FSDP ranks gather the full weights together; rank 0's copy is the one sent. A worker
        that dies meanwhile is left for the next rollout to revive (it is out of date).
        `wait=False`: return once the learner has been asked for its weights; a worker loads
        them after the calls sent to it before (an overlapped rollout), and the next
        `start_rollout` waits for the loads."""
        self.weights_version += 1
        weights = [self._call(r, "get_weights") for r in self.learners]
        loads = [
            self._call(w, "load_weights", weights[0], self.weights_version) for w in self.workers
        ]
        if not self.remote:
            return
        self._loads = [*self._loads, *loads, *weights[1:]]
        if wait:
            self._settle_loads()

    def _settle_loads(self) -> None:
        """Wait for the weight loads in flight; a worker that died during one is revived by
        the next rollout, a learner that died stops the run (`ActorLost`)."""
        loads, self._loads = self._loads, []
        if not loads:
            return
        import ray

        try:
            self._get_all(loads)
        except ray.exceptions.RayActorError as e:
            self._raise_if_learner(e, "a weight sync")
            # The loads still in flight land before any later call to their workers.
            log.warning("a rollout worker died during a weight sync; the next rollout revives it")

    def save(self, state: TrainState) -> Path:
        return Path(self._on_learners("save", state))

    def restore(self, path: Path) -> TrainState:
        return self._on_learners("restore", str(path))

    def reset(self, cfg: Config, root: str, init: str | None, backend: str = "hf") -> None:
        """Reuse these actors for another run: each runs its constructor again with the new
        run's config, directory and policy (the retriever serves the same corpus: the key)."""
        resources = cfg.resources
        threads = max(1, int(resources.cpus_per_worker))
        self.worker_args = (cfg, root, init, self.retriever, threads, backend)
        self.weights_version = 0
        self._loads = []
        self._rollout_info = None
        workers = [w.reset.remote(*self.worker_args) for w in self.workers]
        learners = [
            r.reset.remote(cfg, root, init, max(1, int(resources.learner_cpus)))
            for r in self.learners
        ]
        self._get_all([*workers, *learners])

    def shutdown(self, park: bool = True) -> None:
        """Stop the actors (and the Ray this runtime started); inside
        `actor_pool.reuse_actors()` they are parked for the next run instead."""
        if not self.remote:
            return
        if park and self.reuse_key is not None and actor_pool.park(self.reuse_key, self):
            return
        import ray

        for actor in [*self.workers, *self.learners, self.retriever]:
            if actor is not None:
                ray.kill(actor)
        if self.placement is not None:
            self.placement.remove()
        if self.owns_ray:
            ray.shutdown()
