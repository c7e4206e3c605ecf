"""The FSDP learner group: `resources.learner_strategy=fsdp`.

`resources.learner_world` ranks, each a Ray actor (`LearnerRank`) holding one shard of the policy,
the frozen reference and the critic (mem1_core.training.fsdp), form one torch.distributed group
(NCCL on CUDA, gloo on CPU). Rank 0 opens the group's TCP store on a free port of its node
and hands the address to the others (`start_learner_group`). The driver
(mem1_core.training.runtime.Runtime) calls every rank alike and keeps rank 0's answer.

`LearnerRank.update` is mem1_core.rl.ppo.update with its two passes, `sharded_score` and
`sharded_epochs`, splitting the rows over ranks. Every rank gets the same trajectories, so
it builds the same flattened batch, the same minibatch order (a generator seeded per
iteration) and, after scoring, the same advantages; it computes only its share (`rank_rows`)
of each pass:
- Scoring: each rank scores its share of the rows; the old / reference log-probs and
  values are summed over ranks (a row is filled on one rank and 0 on the others, so the
  sum is exact), and from there every rank holds the whole batch's targets.
- Gradients: each rank backpropagates its share of a minibatch, its loss divided by the
  generated-token count of the whole minibatch; FSDP sums the gradients over ranks, which
  gives the full minibatch's gradient (mem1_core.training.fsdp).

Every sharded forward and backward is a collective, so the ranks must run the same
sequence of them: every pass uses the one-pass tree mask (the shared-prefix forward's
number of decoder calls depends on the data); a rank whose share has fewer micro-batches
runs stand-ins (a row of the minibatch with an empty loss mask: it computes and contributes
nothing); a non-finite loss still runs its backward, and the decision to skip the step is
taken from a flag summed over ranks, so all ranks skip or step together.

Stats are global: the per-micro-batch metrics are additive (losses.py), so their sum over
ranks is the single learner's value; gradient norms are those of the sharded gradients
(`clip_grad_norm_` over DTensors); batch statistics are computed from the whole batch.
Only `update_seconds` is rank 0's own.

Checkpoints: rank 0 writes the full policy and critic weights gathered from the shards in
the single learner's files (so evaluation and `--init` read them alike) and the full
optimiser states keyed by parameter name (`get_optimizer_state_dict`), which load back
into any number of ranks; restoring broadcasts rank 0's copy into the shards. The
optimiser files differ from the single learner's (keyed by position), so a run resumes
under the strategy it was saved with (`state.json` records it).
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import logging
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn

from mem1_core.config import Config, PPOConfig
from mem1_core.models.model import DTYPES, enable_gradient_checkpointing, load_model
from mem1_core.rl.critic import VALUE_HEAD_FILE, Critic
from mem1_core.rl.estimators import get_estimator
from mem1_core.rl.ppo import (
    Models,
    NonFiniteGuard,
    RolloutBatch,
    Targets,
    ppo_loss,
    run_epochs,
    select_rows,
    trainable_parameters,
)
from mem1_core.runs.assets import ensure_tokenizer, initial_policy
from mem1_core.runs.checkpoint import (
    STATE_FILE,
    TrainState,
    read_state,
    save_checkpoint,
    set_rng_state,
)
from mem1_core.runs.layout import RunPaths
from mem1_core.training.fsdp import full_state_dict, rank_rows, shard_critic, shard_policy
from mem1_core.training.learner import KEEP_CHECKPOINTS, run_update
from mem1_core.trajectory.logprobs import tree_attention_mask
from mem1_core.trajectory.record import Trajectory
from mem1_core.trajectory.tree import FlatBatch

log = logging.getLogger(__name__)

STRATEGY = "fsdp"
"""The `learner_strategy` this learner writes into its checkpoints' state."""


@dataclass(frozen=True)
class Rank:
    """Where this process sits in the learner group, and what its passes compute in."""

    rank: int
    world: int
    compute_dtype: torch.dtype = torch.float32
    """The dtype of the forward passes (the eager attention mask is additive in it)."""


# ---- the update, split over ranks --------------------------------------------------------


def _cut_length(batch: FlatBatch, rows: Tensor, seq_bucket: int) -> int:
    """The length rows are cut to: the longest, rounded up to `seq_bucket`, at most L."""
    n = max(int(batch.seq_lens[rows].max()), 1)
    return min(-(-n // seq_bucket) * seq_bucket, batch.input_ids.shape[1])


def rank_micro_batches(
    rows: Tensor, size: int, batch: FlatBatch, seq_bucket: int, me: Rank
) -> list[tuple[Tensor, int, bool]]:
    """This rank's micro-batches of `rows`: its share in chunks of `size`, each with its cut
    length and True; then stand-ins (the first of `rows`, False: the caller empties its loss
    mask) until it has as many as the rank with the largest share, so that every rank runs
    the same number of passes. Needs no communication: every rank knows every share."""
    shares = [rank_rows(rows, r, me.world) for r in range(me.world)]
    count = max(1, *(math.ceil(len(s) / size) for s in shares))
    mine = [m for m in shares[me.rank].split(size) if len(m)]  # an empty share: no chunk
    out = [(m, _cut_length(batch, m, seq_bucket), True) for m in mine]
    stand_in = rows[:1]
    out += [(stand_in, _cut_length(batch, stand_in, seq_bucket), False)] * (count - len(out))
    return out


def _emptied(mb: FlatBatch, t: Targets | None = None) -> tuple[FlatBatch, Targets | None]:
    """A stand-in micro-batch: no generated token, so no log-prob is read and the loss is 0."""
    none = torch.zeros_like(mb.loss_mask)
    t = None if t is None else dataclasses.replace(t, loss_mask=none)
    return dataclasses.replace(mb, loss_mask=none), t


@torch.no_grad()
def sharded_score(
    models: Models,
    rb: RolloutBatch,
    attn: str,
    micro_batch_size: int,
    temperature: float = 1.0,
    *,
    me: Rank,
    seq_bucket: int = 1,
) -> Targets:
    """mem1_core.rl.ppo.score with every rank scoring its share of the rows; the results are
    summed over ranks, so every rank returns the whole batch's Targets."""
    b, length = rb.batch.input_ids.shape
    old = torch.zeros(b, length, device=rb.batch.input_ids.device)
    ref = torch.zeros_like(old) if models.reference is not None else None
    values = torch.zeros_like(old) if models.critic is not None else None
    plan = rank_micro_batches(torch.arange(b), micro_batch_size, rb.batch, seq_bucket, me)
    for rows, n, real in plan:
        mb = select_rows(rb.batch, rows, n)
        mb = mb if real else _emptied(mb)[0]
        mask = tree_attention_mask(mb, attn, me.compute_dtype)
        logp = models.policy(mb, attn, temperature=temperature, mask=mask).logprobs
        ref_logp = None
        if ref is not None:
            ref_logp = models.reference(mb, attn, temperature=temperature, mask=mask).logprobs
        v = models.critic(mb, attn, mask=mask) if values is not None else None
        if not real:
            continue
        old[rows, :n] = logp
        if ref is not None:
            ref[rows, :n] = ref_logp
        if values is not None:
            values[rows, :n] = v
    for x in (old, ref, values):
        if x is not None:
            dist.all_reduce(x)  # each row is non-zero on the one rank that scored it
    zeros = torch.zeros_like(old)
    return Targets(rb.batch.loss_mask, old, zeros, zeros, values, ref)


def sharded_accumulate(
    models: Models,
    batch: FlatBatch,
    t: Targets,
    rows: Tensor,
    cfg: PPOConfig,
    attn: str,
    me: Rank,
    temperature: float = 1.0,
    *,
    seq_bucket: int = 1,
) -> tuple[dict[str, Tensor], bool]:
    """Backward of this rank's share of one minibatch (`rows`) into the sharded `.grad`.
    -> this rank's summed metrics, and whether all its losses were finite. Unlike
    mem1_core.rl.ppo.accumulate_gradients it never stops early: a rank that skipped a backward
    would leave the others waiting in its reduce-scatter."""
    normalizer = t.loss_mask[rows].sum().clamp_min(1)  # the whole minibatch's count
    total: dict[str, Tensor] = {}
    finite = True
    for micro, n, real in rank_micro_batches(rows, cfg.micro_batch_size, batch, seq_bucket, me):
        mb, tm = select_rows(batch, micro, n), t.rows(micro, n)
        if not real:
            mb, tm = _emptied(mb, tm)
        mask = tree_attention_mask(mb, attn, me.compute_dtype)
        out = models.policy(
            mb, attn, with_entropy=cfg.entropy_coef > 0, temperature=temperature, mask=mask
        )
        values = models.critic(mb, attn, mask=mask) if models.critic is not None else None
        loss, metrics = ppo_loss(out.logprobs, out.entropy, values, tm, cfg, normalizer)
        finite = finite and bool(torch.isfinite(loss))
        loss.backward()
        for k, v in metrics.items():
            total[k] = total.get(k, 0.0) + v
    return total, finite


def _global_norm(norm: Tensor) -> float:
    """clip_grad_norm_ over DTensor parameters returns a DTensor: its full value."""
    return float(norm.full_tensor() if hasattr(norm, "full_tensor") else norm)


def sharded_step(
    models: Models,
    optimizers: dict[str, torch.optim.Optimizer],
    cfg: PPOConfig,
    guard: NonFiniteGuard,
    metrics: dict[str, Tensor],
    finite_loss: bool,
) -> dict[str, float] | None:
    """mem1_core.rl.ppo.optimizer_step over ranks: sums the metrics and the non-finite flags
    over ranks, then clips (the norm is global) and steps every optimiser, or none. -> the
    global metrics and gradient norms, or None when the step was skipped."""
    keys = sorted(metrics)
    device = next(models.policy.parameters()).device
    flag = torch.tensor(0.0 if finite_loss else 1.0, device=device)
    packed = torch.stack([flag, *(metrics[k].detach().float().to(device) for k in keys)])
    dist.all_reduce(packed)
    finite = bool(packed[0] == 0)
    norms: dict[str, float] = {}
    if finite:
        for name, params in trainable_parameters(models).items():
            norm = torch.nn.utils.clip_grad_norm_(params, cfg.grad_clip)
            norms[f"{name}_grad_norm"] = _global_norm(norm)
        finite = all(math.isfinite(v) for v in norms.values())
    guard.record(finite, "gradient norm" if packed[0] == 0 else "loss")
    if finite:
        for opt in optimizers.values():
            opt.step()
    for opt in optimizers.values():
        opt.zero_grad(set_to_none=True)
    if not finite:
        return None
    return {k: float(v) for k, v in zip(keys, packed[1:].tolist(), strict=True)} | norms


def sharded_epochs(
    models: Models,
    optimizers: dict[str, torch.optim.Optimizer],
    rb: RolloutBatch,
    t: Targets,
    cfg: PPOConfig,
    attn: str,
    guard: NonFiniteGuard,
    generator: torch.Generator | None = None,
    temperature: float = 1.0,
    *,
    me: Rank,
    seq_bucket: int = 1,
) -> dict[str, float]:
    """mem1_core.rl.ppo.ppo_epochs over ranks: the same shuffled minibatches on every rank (the
    same generator), each split between them. -> mean metrics (global)."""

    def step(rows: Tensor) -> dict[str, float] | None:
        metrics, finite = sharded_accumulate(
            models, rb.batch, t, rows, cfg, attn, me, temperature, seq_bucket=seq_bucket
        )
        return sharded_step(models, optimizers, cfg, guard, metrics, finite)

    return run_epochs(rb.batch.input_ids, cfg, generator, step)


# ---- one rank, a Ray actor ---------------------------------------------------------------


def _full_options(broadcast: bool = False) -> Any:
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    if broadcast:  # rank 0 holds the state; the others pass {}
        return StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)
    return StateDictOptions(full_state_dict=True, cpu_offload=True)


def _node_address() -> str:
    """This node's address as the other ranks reach it: Ray's view of it inside Ray."""
    try:
        import ray

        if ray.is_initialized():
            return ray.util.get_node_ip_address()
    except ImportError:
        pass
    return "127.0.0.1"


class LearnerRank:
    """One rank of the FSDP learner: its shards of policy, reference and critic, their
    optimisers, and the same methods as mem1_core.training.learner.Learner (`update`,
    `get_weights`, `save`, `restore`), each a collective: call every rank at once.

    Two steps before those (`start_learner_group`): `rendezvous` on rank 0, then `connect`
    on every rank with its address; the constructor only records the arguments, so that
    creating the actors does not wait for a group that is not complete yet."""

    def __init__(
        self,
        cfg: Config,
        run_root: str,
        init: str | None,
        estimator: str,
        rank: int,
        world: int,
        threads: int | None = None,
    ):
        if threads:
            torch.set_num_threads(threads)
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()  # one "Writing model shards" bar per checkpoint
        self.cfg, self.estimator = cfg, estimator
        self.paths = RunPaths(Path(run_root))
        self.init = None if init is None else Path(init)
        self.me = Rank(rank, world)
        self._store: Any = None

    def rendezvous(self) -> tuple[str, int]:
        """Rank 0: open the group's TCP store on a free port (the OS picks it: no race
        with another run) of this node. -> (address, port) for `connect`."""
        if self.me.rank != 0:
            raise RuntimeError("rendezvous runs on rank 0; the others connect to its address")
        host = _node_address()
        self._store = dist.TCPStore(host, 0, self.me.world, is_master=True, wait_for_workers=False)
        return host, self._store.port

    def connect(self, host: str, port: int) -> None:
        """Join the process group (it completes once every rank has called it), then load,
        shard and set up the optimisers."""
        if self._store is None:
            self._store = dist.TCPStore(host, port, self.me.world, is_master=False)
        cuda = self.cfg.resources.learner_gpus > 0 and torch.cuda.is_available()
        if cuda:
            torch.cuda.set_device(0)  # Ray shows an actor its own GPU only
        self.device = torch.device("cuda", 0) if cuda else torch.device("cpu")
        dist.init_process_group(
            "nccl" if cuda else "gloo",
            store=self._store,
            rank=self.me.rank,
            world_size=self.me.world,
        )
        from torch.distributed.device_mesh import init_device_mesh

        mesh = init_device_mesh(self.device.type, (self.me.world,))
        self._build(mesh)

    def _build(self, mesh: Any) -> None:
        """The single learner's models (mem1_core.training.learner.Learner), sharded: float32
        master weights computing in `model.dtype`; the reference stays as loaded. Every
        rank builds the same full models (the initial policy is seeded, a saved one is
        read) and keeps its shard."""
        cfg = self.cfg
        self.tokenizer = ensure_tokenizer(cfg, self.paths)
        policy = (
            initial_policy(cfg, self.tokenizer)
            if self.init is None
            else load_model(self.init, cfg.model, self.tokenizer)
        ).eval()
        reference = copy.deepcopy(policy).requires_grad_(False)
        critic = None
        if get_estimator(self.estimator).uses_critic:
            saved = self.init.parent / "critic" if self.init is not None else None
            if saved is not None and (saved / VALUE_HEAD_FILE).is_file():
                critic = Critic.load(saved, cfg.model.dtype, cfg.model.attn)
            else:
                critic = Critic.from_policy(policy)
            critic = critic.float().eval()
        policy.float()
        compute = DTYPES[cfg.model.dtype]
        self.me = dataclasses.replace(self.me, compute_dtype=compute)
        param_dtype = None if compute == torch.float32 else compute
        if cfg.model.gradient_checkpointing:  # after every .eval(): that would undo it
            enable_gradient_checkpointing(policy)
            if critic is not None:
                enable_gradient_checkpointing(critic.backbone)
        self.models = Models(
            shard_policy(policy, mesh, param_dtype),
            shard_policy(reference, mesh),
            None if critic is None else shard_critic(critic, mesh, param_dtype),
        )
        # weight_decay=0: PPO's small steps should not also shrink the warm start.
        self.optimizers = {
            "policy": torch.optim.AdamW(
                self.models.policy.parameters(), lr=cfg.ppo.actor_lr, weight_decay=0.0
            )
        }
        if self.models.critic is not None:
            self.optimizers["critic"] = torch.optim.AdamW(
                self.models.critic.parameters(), lr=cfg.ppo.critic_lr, weight_decay=0.0
            )
        self.guard = NonFiniteGuard(cfg.ppo.max_nonfinite_in_row)

    def _roots(self) -> dict[str, nn.Module]:
        """Each optimiser's FSDP root (the module its state is keyed under)."""
        roots: dict[str, nn.Module] = {"policy": self.models.policy}
        if self.models.critic is not None:
            roots["critic"] = self.models.critic
        return roots

    def update(self, trajs: list[Trajectory], iteration: int) -> dict[str, Any]:
        t0 = time.perf_counter()
        # mem1_core.rl.ppo.update with both passes split over the ranks
        stats = run_update(
            self,
            trajs,
            iteration,
            score_fn=functools.partial(sharded_score, me=self.me),
            epochs_fn=functools.partial(sharded_epochs, me=self.me),
        )
        return stats | {"update_seconds": time.perf_counter() - t0}

    def get_weights(self) -> dict[str, torch.Tensor]:
        """The policy's full weights on CPU on rank 0 ({} on the others), under the names a
        rollout worker loads."""
        return full_state_dict(self.models.policy)

    def save(self, state: TrainState) -> str:
        """Gather full weights and optimiser states on rank 0, which writes the checkpoint
        (atomically, mem1_core.runs.checkpoint). -> its path on rank 0, "" on the others."""
        from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

        policy_state = full_state_dict(self.models.policy)
        critic_state = None if self.models.critic is None else full_state_dict(self.models.critic)
        roots = self._roots()
        optim = {
            name: get_optimizer_state_dict(roots[name], opt, options=_full_options())
            for name, opt in self.optimizers.items()
        }
        if self.me.rank != 0:
            return ""
        extra = state.extra | {
            "nonfinite_total": self.guard.total,
            "nonfinite_in_row": self.guard.in_row,
            "estimator": self.estimator,
            "learner_strategy": STRATEGY,
        }
        out = save_checkpoint(
            self.paths.checkpoints,
            TrainState(state.iteration, state.elapsed_seconds, extra),
            policy=self.models.policy.lm,  # lends its config; the weights are policy_state
            optimizers=optim,
            config=self.cfg,
            critic=self.models.critic,
            tokenizer=self.tokenizer,
            keep=KEEP_CHECKPOINTS,
            policy_state=policy_state,
            critic_state=critic_state,
        )
        return str(out)

    def restore(self, path: str) -> TrainState:
        """Load a checkpoint this learner strategy wrote: rank 0 reads it, the shards are
        filled from rank 0's copy (weights, optimiser states); every rank restores the RNG
        and the non-finite counters."""
        from torch.distributed.checkpoint.state_dict import (
            set_model_state_dict,
            set_optimizer_state_dict,
        )

        ckpt = Path(path)
        if not (ckpt / STATE_FILE).is_file():
            raise FileNotFoundError(f"{ckpt} is not a checkpoint (no {STATE_FILE})")
        state = read_state(ckpt)
        _check_resumable(ckpt, state, self.estimator)
        # Rank 0 reads; if that fails, every rank must stop here, not wait in a broadcast.
        weights, optim, error = self._read_on_rank0(ckpt)
        status = [None if error is None else repr(error)]
        dist.broadcast_object_list(status, src=0)
        if error is not None:
            raise error
        if status[0] is not None:
            raise RuntimeError(f"rank 0 could not read {ckpt}: {status[0]}")
        for name, root in self._roots().items():
            set_model_state_dict(root, weights.get(name, {}), options=_full_options(True))
        for name, opt in self.optimizers.items():
            root = self._roots()[name]
            set_optimizer_state_dict(root, opt, optim.get(name, {}), options=_full_options(True))
        set_rng_state(torch.load(ckpt / "rng.pt", weights_only=True))
        self.guard.total = int(state.extra.get("nonfinite_total", 0))
        self.guard.in_row = int(state.extra.get("nonfinite_in_row", 0))
        return state

    def _read_on_rank0(
        self, ckpt: Path
    ) -> tuple[dict[str, dict[str, Tensor]], dict[str, dict[str, Any]], Exception | None]:
        """Rank 0: the checkpoint's full state dicts, keyed as the FSDP roots name their
        parameters, or the error that reading it raised; the other ranks: nothing (they
        receive rank 0's by broadcast)."""
        if self.me.rank != 0:
            return {}, {}, None
        try:
            return (*self._read_full(ckpt), None)
        except Exception as error:  # handed to every rank by `restore`
            return {}, {}, error

    def _read_full(
        self, ckpt: Path
    ) -> tuple[dict[str, dict[str, Tensor]], dict[str, dict[str, Any]]]:
        from transformers import AutoModelForCausalLM

        # float32: the checkpoint holds the master weights, whatever model.dtype computes in.
        lm = AutoModelForCausalLM.from_pretrained(
            str(ckpt / "policy"), dtype=torch.float32, use_safetensors=True
        )
        weights = {"policy": {f"lm.{k}": v for k, v in lm.state_dict().items()}}
        if self.models.critic is not None:
            if not (ckpt / "critic").is_dir():
                raise FileNotFoundError(f"{ckpt} has no critic/, but this run trains one")
            weights["critic"] = Critic.load(ckpt / "critic").state_dict()
        optim = torch.load(ckpt / "optimizer.pt", map_location="cpu", weights_only=True)
        missing = set(self.optimizers) - set(optim)
        if missing:
            raise ValueError(f"{ckpt}/optimizer.pt has no state for {sorted(missing)}")
        return weights, optim


def _check_resumable(ckpt: Path, state: TrainState, estimator: str) -> None:
    saved = state.extra.get("estimator", estimator)
    if saved != estimator:
        raise ValueError(f"{ckpt} was trained with estimator {saved!r}, not {estimator!r}")
    strategy = state.extra.get("learner_strategy", "single")
    if strategy != STRATEGY:
        raise ValueError(
            f"{ckpt} was saved by the {strategy!r} learner, whose optimiser state is not "
            f"laid out for resources.learner_strategy={STRATEGY}: resume it with "
            f"resources.learner_strategy={strategy}, or start a new run from its weights (--init)"
        )


def start_learner_group(cfg: Config, run_root: str, init: str | None, estimator: str) -> list[Any]:
    """Start `cfg.resources.learner_world` LearnerRank actors (each asking for `learner_cpus` CPUs
    and one GPU when the learner has GPUs), form their process group and load the models.
    -> the actors, rank 0 first. Ray must be running (mem1_core.training.ray_start.start_ray)."""
    import ray

    resources = cfg.resources
    world = resources.learner_world
    if resources.learner_strategy != STRATEGY or world < 2:
        raise ValueError(
            "start_learner_group needs resources.learner_strategy=fsdp with >= 2 ranks"
        )
    rank_cls = ray.remote(LearnerRank).options(
        num_cpus=resources.learner_cpus, num_gpus=resources.learner_gpus / world
    )
    threads = max(1, int(resources.learner_cpus))
    ranks = [
        rank_cls.remote(cfg, run_root, init, estimator, r, world, threads) for r in range(world)
    ]
    host, port = ray.get(ranks[0].rendezvous.remote())
    ray.get([r.connect.remote(host, port) for r in ranks])
    log.info("FSDP learner group: %d ranks, rendezvous at %s:%d", world, host, port)
    return ranks
