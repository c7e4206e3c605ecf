"""The `resources` section: where RL training runs. How many rollout workers and what each
holds, the learner's processes and devices, the Ray cluster and how the actors spread over
it (mem1_core.training.placement), and the learner's strategy: one process, or FSDP ranks
(mem1_core.training.fsdp_learner)."""

from __future__ import annotations

from dataclasses import dataclass

from mem1_core.config.sections import Section


@dataclass(frozen=True)
class ResourcesConfig(Section):
    """Where RL training runs: Ray placement of the rollout workers and the learner, and the
    learner's strategy (one process, or FSDP ranks). Apart from the algorithm (`ppo`), so
    the same PPO runs on a laptop or a cluster."""

    num_rollout_workers: int = 1
    cpus_per_worker: float = 1.0
    gpus_per_worker: float = 0.0
    learner_cpus: float = 1.0
    """CPUs of each learner process (each FSDP rank asks for this many; also its torch threads)."""
    learner_gpus: float = 0.0
    """GPUs of the learner: of its one process (`single`), or in all (`fsdp`: one per rank)."""
    learner_ranks: int = 0
    """`fsdp` only: learner processes. 0 means one per learner GPU (`learner_gpus`); without
    GPUs (`learner_gpus=0`) set it to run that many CPU ranks over gloo (tests, debugging)."""
    worker_memory_gb: float = 0.0
    """Memory each rollout worker reserves in Ray (GiB; Ray's `memory` resource). 0 reserves
    none. Counted when the run checks that the cluster can hold it."""
    learner_memory_gb: float = 0.0
    """Memory each learner process reserves in Ray (GiB), as `worker_memory_gb`."""
    ray_address: str | None = None
    """Connect to a running Ray cluster: the head's `HOST:6379`, or `auto` for the cluster
    `ray start` recorded on this node (or `RAY_ADDRESS`). None starts a private local Ray for
    this run alone, whatever cluster the machine runs or recorded. On more than one node
    `--out` must be on storage every node mounts at the same path (checked at start;
    docs/cluster.md)."""
    placement: str = "pack"
    """How the rollout workers and the learner ranks spread over the cluster's nodes (one
    Ray placement group): `pack` onto as few nodes as hold them, or `spread` over as many."""
    wait_seconds: float = 600.0
    """Longest wait for a cluster that can hold the run but is busy (other jobs hold the
    resources); the run says what it waits for every few seconds and stops at this cap. A
    run the cluster can never hold fails at once."""
    learner_strategy: str = "single"
    """`single`: the learner is one process on one device, its weights in `model.dtype`.
    `fsdp`: `learner_world` learner ranks (Ray actors forming one torch.distributed group,
    one GPU each, or CPU ranks over gloo) shard policy, reference and critic with FSDP2
    (float32 master weights, compute in `model.dtype`) and split every minibatch between
    them (mem1_core.training.fsdp_learner). Checkpoints hold full weights in the single learner's
    format, so evaluation and `--init` read them alike; their optimiser state is keyed by
    parameter name, so a run resumes under the strategy it was saved with."""
    rollout_python: str | None = None
    """The Python of the rollout workers when they generate with vLLM (`rollout.backend`
    vllm, or auto) and the driver cannot import it, as from the Prefect venv: each worker is
    then a Ray actor under this interpreter (runtime_env py_executable), which must have vLLM
    and the driver's Ray and Python versions (checked before any actor starts;
    mem1_core.runs.rollout_python). None: $MEM1_VLLM_PYTHON, else the checkout's
    .venv-vllm/bin/python (`./dev setup-vllm`) if it exists. On a cluster, a path every node
    has."""

    @property
    def learner_world(self) -> int:
        """Learner processes: 1 under `single`, the FSDP ranks under `fsdp`."""
        if self.learner_strategy != "fsdp":
            return 1
        return self.learner_ranks or int(self.learner_gpus)

    def __post_init__(self) -> None:
        if self.learner_strategy not in ("single", "fsdp"):
            raise ValueError(
                f"resources.learner_strategy={self.learner_strategy!r}: use single or fsdp"
            )
        if self.placement not in ("pack", "spread"):
            raise ValueError(f"resources.placement={self.placement!r}: use pack or spread")
        if self.wait_seconds < 0 or min(self.worker_memory_gb, self.learner_memory_gb) < 0:
            raise ValueError(
                "resources.wait_seconds, resources.worker_memory_gb and "
                "resources.learner_memory_gb are amounts: set them >= 0"
            )
        if self.learner_strategy == "fsdp":
            self._check_fsdp_ranks()
        elif self.learner_ranks:
            raise ValueError(
                "resources.learner_ranks is the number of FSDP ranks: set resources.learner_strategy=fsdp, "
                "or leave learner_ranks at 0"
            )

    def _check_fsdp_ranks(self) -> None:
        gpus, ranks = self.learner_gpus, self.learner_ranks
        if gpus < 0 or not float(gpus).is_integer() or (gpus == 0 and ranks == 0):
            raise ValueError(
                "resources.learner_strategy=fsdp runs one learner process per GPU: set resources.learner_gpus "
                f"to a whole number >= 1 (got {gpus}), or, without GPUs, resources.learner_ranks to "
                "the number of CPU ranks"
            )
        if gpus and ranks and ranks != gpus:
            raise ValueError(
                f"resources.learner_ranks={ranks} with resources.learner_gpus={gpus:g}: an FSDP rank has one "
                "GPU; set learner_ranks to 0 (one per GPU) or to learner_gpus"
            )
        if self.learner_world < 2:
            raise ValueError(
                "resources.learner_strategy=fsdp with one rank shards nothing and only adds "
                "collectives: use resources.learner_strategy=single, or give it >= 2 ranks"
            )
