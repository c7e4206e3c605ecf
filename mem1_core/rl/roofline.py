"""The work of one PPO iteration, phase by phase: the FLOPs the learner's passes and the
rollout's prefill must do, and the bytes decoding must read. These are a roofline's
numerators; `benchmarks/roofline.py` divides them by each phase's seconds and by this
machine's peaks (a matmul in the compute dtype, a copy's bandwidth).

Counted by the 6P rule (Kaplan et al. 2020; PaLM's model FLOPs utilisation): a forward costs
2 FLOPs per weight a token multiplies by, its backward 4 more. Every token multiplies by the
decoder's weights (the embedding is a lookup: not counted); the vocabulary projection runs
only where a log-prob is read, at the generated tokens (the learner) and once per turn at
the context's end (the prefill). Left out, as the rule leaves them out: attention's own
products (4 x context x hidden per token and layer; ~10-20 % more at these lengths), and
recomputation, which is not useful work (gradient checkpointing; the vocabulary chunks'
second projection in the backward, mem1_core.trajectory.logprobs.vocab_logprobs).

- score: the no-grad passes before the epochs: the old log-probs (only under
  `ppo.old_logprobs=recompute`), the reference's, the critic's values.
- update: per epoch, the policy's and the critic's forward and backward.
- prefill: each turn runs the context tokens past the prefix that the trajectory's previous
  sequence (its last context and generation) already holds as keys and values (the rule of
  mem1_core.rollout.kv_cache.TurnCache; a cache too small to hold them all runs more).
- decode: a decoding step reads every weight once (decoder and vocabulary projection, in
  the compute dtype) whatever the batch, so the bytes are the steps times the weights'
  bytes. Steps as one rollout worker runs them: each turn index is one generate call per
  token budget (a task length), as long as its longest generation after the prefill's first
  token; rollout workers that split the tasks each read the weights for their own steps.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from torch import nn

from mem1_core.config import PPOConfig
from mem1_core.rl.batch import Models, RolloutBatch
from mem1_core.trajectory.logprobs import mask_dtype
from mem1_core.trajectory.record import Trajectory


@dataclass(frozen=True)
class ModelSize:
    """The weights a model's passes multiply by, in counts of parameters."""

    body: int
    """What every token multiplies by: the decoder's layers and final norm (a critic's value
    head too), not the token embedding."""
    head: int = 0
    """The vocabulary projection's, applied only where a log-prob is read (0: none)."""

    @property
    def weights(self) -> int:
        """Every weight a decoding step reads."""
        return self.body + self.head


def _numel(params: Any) -> int:
    # `numel` of a sharded (DTensor) parameter is the whole tensor's.
    return sum(p.numel() for p in {id(p): p for p in params}.values())


def model_size(model: nn.Module) -> ModelSize:
    """A causal LM's body and head (an FSDP policy root's inner LM), or a critic's body (its
    transformer and value head; it has no vocabulary projection)."""
    model = getattr(model, "lm", model)  # mem1_core.training.fsdp.TreeLM
    backbone = getattr(model, "backbone", None)  # a Critic
    if backbone is not None:
        embed = {id(p) for p in backbone.get_input_embeddings().parameters()}
        body = [p for p in model.parameters() if id(p) not in embed]
        return ModelSize(_numel(body))
    decoder, head = model.get_decoder(), model.get_output_embeddings()
    embed = {id(p) for p in decoder.get_input_embeddings().parameters()}
    body = [p for p in decoder.parameters() if id(p) not in embed]
    return ModelSize(_numel(body), _numel(head.parameters()))


def forward_flops(size: ModelSize, tokens: int, read: int) -> int:
    """One forward over `tokens` tokens with log-probs (or values) read at `read` of them."""
    return 2 * (size.body * tokens + size.head * read)


def learner_work(
    policy: ModelSize,
    reference: ModelSize | None,
    critic: ModelSize | None,
    tree_tokens: int,
    gen_tokens: int,
    epochs: int,
    recompute: bool,
) -> dict[str, int]:
    """FLOPs of the learner's phases over `tree_tokens` tokens of its rows, `gen_tokens` of
    them generated. -> work_score_flops, work_update_flops."""
    policy_pass = forward_flops(policy, tree_tokens, gen_tokens)
    score = policy_pass if recompute else 0
    if reference is not None:
        score += forward_flops(reference, tree_tokens, gen_tokens)
    critic_pass = 0 if critic is None else forward_flops(critic, tree_tokens, tree_tokens)
    return {
        "work_score_flops": score + critic_pass,
        "work_update_flops": 3 * epochs * (policy_pass + critic_pass),
    }


def rollout_work(
    trajs: list[Trajectory], policy: ModelSize, bytes_per_weight: int
) -> dict[str, int]:
    """The prefill's tokens and FLOPs and decoding's steps and bytes for `trajs`, sampled by
    `policy` in a compute dtype of `bytes_per_weight`. -> work_prefill_tokens,
    work_prefill_flops, work_decode_steps, work_decode_bytes."""
    prefill = turns = 0
    longest: dict[tuple[int, int], int] = {}  # (turn index, task length): the longest decode
    for traj in trajs:
        held: list[int] = []  # the trajectory's last sequence: context and generation but its last
        for t, turn in enumerate(traj.turns):
            context = traj.context_ids(t)
            reused = 0
            for a, b in zip(held, context[:-1], strict=False):
                if a != b:
                    break
                reused += 1
            prefill += len(context) - reused
            turns += 1
            held = context + turn.gen_ids[:-1]
            key = (t, traj.n_objectives)
            longest[key] = max(longest.get(key, 0), len(turn.gen_ids) - 1)
    steps = sum(longest.values())
    return {
        "work_prefill_tokens": prefill,
        "work_prefill_flops": 2 * (policy.body * prefill + policy.head * turns),
        "work_decode_steps": steps,
        "work_decode_bytes": steps * policy.weights * bytes_per_weight,
    }


def iteration_work(
    models: Models, trajs: list[Trajectory], rb: RolloutBatch, cfg: PPOConfig
) -> dict[str, int]:
    """Every phase's work for one learner update of `trajs` (laid out as `rb`): the
    `work_*` columns of metrics.jsonl. Under autocast the compute dtype is autocast's."""
    policy = model_size(models.policy)
    reference = None if models.reference is None else model_size(models.reference)
    critic = None if models.critic is None else model_size(models.critic)
    tree_tokens, gen_tokens = int(rb.batch.seq_lens.sum()), int(rb.batch.loss_mask.sum())
    recompute = cfg.old_logprobs == "recompute"
    work = learner_work(
        policy, reference, critic, tree_tokens, gen_tokens, cfg.ppo_epochs, recompute
    )
    return work | rollout_work(trajs, policy, mask_dtype(models.policy).itemsize)
