"""FSDP2 sharding of the learner's models for the flattened-tree forward.

What is here: sharding the policy (as a `TreeLM`) and the critic over a device mesh with
FSDP2 (`torch.distributed.fsdp.fully_shard`) so that `forward_tree` and `Critic.forward`
run on the shards and their gradients, summed over ranks, are the unsharded model's
(tests/test_fsdp.py: 2 ranks on CPU/gloo); full state dicts out of the shards; and each
rank's share of a minibatch. The trainer's side (`resources.learner_strategy=fsdp`: Ray actors
forming the process group, the PPO update split over ranks, weight sync and checkpoints)
is mem1_core.training.fsdp_learner, wired as the notes at the end of this docstring say.

Layout of the FSDP groups:
- Each decoder layer is a group (all-gathered just before it runs, freed after).
- Embedding, final norm and LM head are one group: the LM head shares the embedding's
  weight (tied), and tied parameters must be in one group; `fully_shard([...])` lets the
  head run after the decoder, as forward_tree calls it.
- The root is a module whose forward runs first in every pass: FSDP2 needs one. A causal LM
  is not (forward_tree calls its decoder and head, never its own forward), so the policy
  is wrapped in `TreeLM`, whose forward is forward_tree. The critic's forward already runs
  its backbone, so it is its own root.

Precision: parameters stay float32 (sharded master weights, optimiser state), forward and
backward run in `param_dtype` (bf16 on GPU), gradients are reduced in float32. Plain bf16
weights would lose small updates: with the paper's actor lr 1e-6, an Adam step is far below
half a bf16 ulp of a typical weight, so it rounds to no change.

Gradients are summed over ranks (divide factor 1), not averaged: every rank divides its
loss by the generated-token count of the whole minibatch (mem1_core.rl.passes.s normalizer), so
the sum is the full minibatch's gradient, exactly as with micro-batches.

Wiring notes for the trainer (followed by mem1_core.training.fsdp_learner): ranks must run the same
sequence of sharded forwards and backwards (each is a collective), so under FSDP every
pass, scoring included, uses the one-pass tree mask (the shared-prefix forward makes a
data-dependent number of calls), every rank runs the same number of micro-batches (a rank
short of rows runs one with an empty loss mask), and a non-finite loss must not skip a
rank's backward (whether to step is decided from a flag summed over ranks). Clip with
`clip_grad_norm_` on the DTensor parameters (its norm is a DTensor: `.full_tensor()`);
hand weights out with `full_state_dict`.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from mem1_core.rl.critic import Critic
from mem1_core.trajectory.logprobs import TreeOutput, forward_tree
from mem1_core.trajectory.tree import FlatBatch


class TreeLM(nn.Module):
    """A causal LM whose forward is `forward_tree`: the FSDP root of a sharded policy."""

    def __init__(self, lm: nn.Module):
        super().__init__()
        self.lm = lm

    def forward(self, batch: FlatBatch, attn: str | None = None, **kwargs: Any) -> TreeOutput:
        return forward_tree(self.lm, batch, attn, **kwargs)


def _mixed_precision(param_dtype: torch.dtype | None):
    from torch.distributed.fsdp import MixedPrecisionPolicy

    return MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32)


def _shard_decoder_layers(decoder: nn.Module, mesh: Any, mp: Any) -> None:
    from torch.distributed.fsdp import fully_shard

    for layer in decoder.layers:
        fully_shard(layer, mesh=mesh, mp_policy=mp)


def _sum_gradients(root: nn.Module) -> None:
    from torch.distributed.fsdp import FSDPModule

    for module in root.modules():
        if isinstance(module, FSDPModule):
            module.set_gradient_divide_factor(1.0)
            # A plain SUM: factor 1 would otherwise be a PREMUL_SUM, which gloo lacks.
            module.set_force_sum_reduction_for_comms(True)


def shard_policy(lm: nn.Module, mesh: Any, param_dtype: torch.dtype | None = None) -> TreeLM:
    """Shard a Hugging Face causal LM (float32 parameters) over `mesh`; -> its TreeLM root.
    Call `TreeLM(batch, attn, ...)` where the trainer calls forward_tree."""
    from torch.distributed.fsdp import fully_shard

    mp = _mixed_precision(param_dtype)
    decoder = lm.get_decoder()
    _shard_decoder_layers(decoder, mesh, mp)
    fully_shard(
        [decoder.embed_tokens, decoder.norm, lm.get_output_embeddings()], mesh=mesh, mp_policy=mp
    )
    root = fully_shard(TreeLM(lm), mesh=mesh, mp_policy=mp)
    _sum_gradients(root)
    return root


def shard_critic(critic: Critic, mesh: Any, param_dtype: torch.dtype | None = None) -> Critic:
    """Shard a critic over `mesh`: its backbone computes in `param_dtype`, its value head
    stays float32 (values are regression targets; Critic's docstring)."""
    from torch.distributed.fsdp import fully_shard

    mp = _mixed_precision(param_dtype)
    _shard_decoder_layers(critic.backbone, mesh, mp)
    fully_shard(critic.backbone, mesh=mesh, mp_policy=mp)
    root = fully_shard(critic, mesh=mesh, mp_policy=_mixed_precision(None))
    _sum_gradients(root)
    return root


def full_state_dict(module: nn.Module) -> dict[str, torch.Tensor]:
    """The unsharded state dict on CPU, on rank 0; other ranks get {} (a collective: every
    rank calls it). A TreeLM's keys are its LM's (no `lm.` prefix), as workers load them."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    state = get_model_state_dict(
        module, options=StateDictOptions(full_state_dict=True, cpu_offload=True)
    )
    if state:
        _share_tied(module, state)
    if isinstance(module, TreeLM):
        state = {k.removeprefix("lm."): v for k, v in state.items()}
    return state


def _share_tied(module: nn.Module, state: dict[str, torch.Tensor]) -> None:
    """Point the entries of tied parameters (one parameter under several names: the LM head
    and the embedding) at one tensor, as the unsharded state dict has them; the gathered
    dict holds a copy per name. save_pretrained then writes a tied weight once, as it does
    for the unsharded model, and a weight sync ships it once."""
    first: dict[int, str] = {}
    for name, param in module.named_parameters(remove_duplicate=False):
        if name in state:
            state[name] = state[first.setdefault(id(param), name)]


def rank_rows(rows: torch.Tensor, rank: int, world: int) -> torch.Tensor:
    """This rank's contiguous share of a minibatch's rows (shares differ by at most one)."""
    return rows.tensor_split(world)[rank]
