"""The FSDP learner group: `resources.learner_strategy=fsdp`.

`resources.learner_world` ranks, each a Ray actor (`LearnerRank`) holding one shard of the
policy, the frozen reference and the critic (mem1_core.training.fsdp), form one
torch.distributed group (NCCL on CUDA, gloo on CPU). Rank 0 opens the group's TCP store on a
free port of its node and hands the address to the others (`start_learner_group`). The
driver (mem1_core.training.runtime.Runtime) calls every rank alike and keeps rank 0's answer.

A rank is the single learner (mem1_core.training.learner.Learner, subclassed: the same model
building, update, checkpoint metadata and resume checks) with one hook of the PPO passes,
`RankSplit` (mem1_core.rl.passes.Split), and its own way of gathering and scattering full
weights. Every rank gets the same trajectories, so it builds the same flattened batch, the
same minibatch order (a generator seeded per iteration) and, after scoring, the same
advantages; it computes only its share (`rank_rows`) of each pass:
- Scoring: each rank scores its share of the rows; the old / reference log-probs and
  values are summed over ranks (a row is filled on one rank and 0 on the others, so the
  sum is exact), and from there every rank holds the whole batch's targets.
- Gradients: each rank backpropagates its share of a minibatch, its loss divided by the
  generated-token count of the whole minibatch; FSDP sums the gradients over ranks, which
  gives the full minibatch's gradient (mem1_core.training.fsdp).

The trajectory mode (`trajectory.mode`) changes only which rows the batch holds (one tree per
trajectory, one row per turn, or the concatenation): ranks split rows, whatever they are, with
the same hook, and a minibatch holds whole trajectories on every rank alike.

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

import dataclasses
import logging
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn

from mem1_core.config import Config
from mem1_core.models.model import DTYPES
from mem1_core.rl.batch import Models, cut_length
from mem1_core.rl.critic import Critic
from mem1_core.rl.passes import Split
from mem1_core.training.checkpoint import set_rng_state
from mem1_core.training.fsdp import full_state_dict, rank_rows, shard_critic, shard_policy
from mem1_core.training.learner import Learner, checkpoint_activations
from mem1_core.training.placement import memory_option
from mem1_core.trajectory.logprobs import tree_attention_mask
from mem1_core.trajectory.tree import FlatBatch

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Rank:
    """Where this process sits in the learner group, and what its passes compute in."""

    rank: int
    world: int
    compute_dtype: torch.dtype = torch.float32
    """The dtype of the forward passes (the eager attention mask is additive in it)."""


# ---- the passes, split over ranks -------------------------------------------------------


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
    out = [(m, cut_length(batch, m, seq_bucket), True) for m in mine]
    stand_in = rows[:1]
    out += [(stand_in, cut_length(batch, stand_in, seq_bucket), False)] * (count - len(out))
    return out


@dataclass(frozen=True)
class RankSplit(Split):
    """This rank's side of the learner's passes (mem1_core.rl.passes.Split): its share of
    every minibatch, the one-pass tree mask in the compute dtype, the sharded policy's own
    forward (a TreeLM), sums over ranks, and every backward run (no early stop)."""

    me: Rank = Rank(0, 1)
    stop_early: bool = False

    def micro_batches(
        self, rows: Tensor, size: int, batch: FlatBatch, seq_bucket: int, tokens: int | None = None
    ) -> list[tuple[Tensor, int, bool]]:
        if tokens is not None:  # the config refuses it; a direct caller gets the reason too
            raise ValueError("ppo.micro_batch_tokens: the FSDP ranks split minibatches by rows")
        return rank_micro_batches(rows, size, batch, seq_bucket, self.me)

    def mask(self, model: nn.Module, batch: FlatBatch, attn: str) -> object | None:
        return tree_attention_mask(batch, attn, self.me.compute_dtype)

    def forward(self, model: nn.Module, batch: FlatBatch, attn: str, **kwargs: Any) -> Any:
        return model(batch, attn, **kwargs)

    def reduce(self, x: Tensor) -> Tensor:
        dist.all_reduce(x)
        return x


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


class LearnerRank(Learner):
    """One rank of the FSDP learner: its shards of policy, reference and critic, their
    optimisers, and the methods of the single learner (`update`, `get_weights`, `save`,
    `restore`), each a collective: call every rank at once.

    Two steps before those (`start_learner_group`): `rendezvous` on rank 0, then `connect`
    on every rank with its address; the constructor only records the arguments, so that
    creating the actors does not wait for a group that is not complete yet."""

    strategy = "fsdp"

    def __init__(
        self,
        cfg: Config,
        run_root: str,
        init: str | None,
        rank: int,
        world: int,
        threads: int | None = None,
    ):
        self._setup(cfg, run_root, init, threads)
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
        self._mesh = mesh
        self._build(torch.device("cpu"))  # full models on the CPU, then each keeps its shard

    def _place(self, policy: nn.Module, reference: nn.Module, critic: Critic | None) -> Models:
        """The single learner's models, sharded: float32 master weights computing in
        `model.dtype`; the reference stays as loaded. Every rank builds the same full models
        (the initial policy is seeded, a saved one is read) and keeps its shard."""
        policy.float()
        if critic is not None:
            critic.float()
        compute = DTYPES[self.cfg.model.dtype]
        self.me = dataclasses.replace(self.me, compute_dtype=compute)
        self.split = RankSplit(me=self.me)
        param_dtype = None if compute == torch.float32 else compute
        checkpoint_activations(self.cfg, policy, critic)
        mesh = self._mesh
        return Models(
            shard_policy(policy, mesh, param_dtype),
            shard_policy(reference, mesh),
            None if critic is None else shard_critic(critic, mesh, param_dtype),
        )

    def _roots(self) -> dict[str, nn.Module]:
        """Each optimiser's FSDP root (the module its state is keyed under)."""
        roots: dict[str, nn.Module] = {"policy": self.models.policy}
        if self.models.critic is not None:
            roots["critic"] = self.models.critic
        return roots

    def get_weights(self) -> dict[str, torch.Tensor]:
        """The policy's full weights on CPU on rank 0 ({} on the others), under the names a
        rollout worker loads."""
        return full_state_dict(self.models.policy)

    def _checkpoint_parts(self) -> dict[str, Any] | None:
        """Gather full weights and optimiser states (a collective); rank 0 writes them."""
        from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

        policy_state = full_state_dict(self.models.policy)
        critic_state = None if self.models.critic is None else full_state_dict(self.models.critic)
        roots = self._roots()
        optim = {
            name: get_optimizer_state_dict(roots[name], opt, options=_full_options())
            for name, opt in self.optimizers.items()
        }
        if self.me.rank != 0:
            return None
        return {
            "policy": self.models.policy.lm,  # lends its config; the weights are policy_state
            "optimizers": optim,
            "critic": self.models.critic,
            "policy_state": policy_state,
            "critic_state": critic_state,
        }

    def _load_checkpoint(self, ckpt: Path) -> None:
        """Rank 0 reads the checkpoint, the shards are filled from rank 0's copy (weights,
        optimiser states); every rank restores the RNG."""
        from torch.distributed.checkpoint.state_dict import (
            set_model_state_dict,
            set_optimizer_state_dict,
        )

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


def start_learner_group(
    cfg: Config, run_root: str, init: str | None, placement: list[dict[str, Any]] | None = None
) -> list[Any]:
    """Start `cfg.resources.learner_world` LearnerRank actors (each asking for `learner_cpus` CPUs
    and one GPU when the learner has GPUs), form their process group and load the models.
    `placement`: each rank's extra Ray options (its placement-group bundle;
    mem1_core.training.placement). -> the actors, rank 0 first. Ray must be running
    (mem1_core.training.ray_start.start_ray)."""
    import ray

    resources = cfg.resources
    world = resources.learner_world
    if resources.learner_strategy != LearnerRank.strategy or world < 2:
        raise ValueError(
            "start_learner_group needs resources.learner_strategy=fsdp with >= 2 ranks"
        )
    options = dict(
        num_cpus=resources.learner_cpus,
        num_gpus=resources.learner_gpus / world,
        **memory_option(resources.learner_memory_gb),
    )
    threads = max(1, int(resources.learner_cpus))
    where = placement or [{} for _ in range(world)]
    ranks = [
        ray.remote(LearnerRank)
        .options(**options, **where[r])
        .remote(cfg, run_root, init, r, world, threads)
        for r in range(world)
    ]
    host, port = ray.get(ranks[0].rendezvous.remote())
    ray.get([r.connect.remote(host, port) for r in ranks])
    log.info("FSDP learner group: %d ranks, rendezvous at %s:%d", world, host, port)
    return ranks
