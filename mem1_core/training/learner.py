"""The learner: policy, frozen reference (the initial policy), critic and their optimisers;
`update(trajectories)` is mem1_core.rl.ppo.update; `get_weights()` hands the policy's
weights out on CPU. Under `resources.learner_strategy=fsdp` the learner is a group of ranks
instead (mem1_core.training.fsdp_learner.LearnerRank, same methods)."""

from __future__ import annotations

import copy
import time
from pathlib import Path
from typing import Any

import torch

from mem1_core.config import Config
from mem1_core.models.model import enable_gradient_checkpointing, master_weights
from mem1_core.rl.critic import VALUE_HEAD_FILE, Critic
from mem1_core.rl.estimators import get_estimator
from mem1_core.rl.ppo import Models, NonFiniteGuard, update
from mem1_core.runs.assets import ensure_tokenizer, load_policy
from mem1_core.runs.checkpoint import TrainState, load_checkpoint, save_checkpoint
from mem1_core.runs.layout import RunPaths
from mem1_core.training.actor_pool import drop_state
from mem1_core.training.ray_start import actor_device, set_threads
from mem1_core.trajectory.record import Trajectory

KEEP_CHECKPOINTS = 3
"""Checkpoints kept on disk (the newest)."""


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
        set_threads(threads)
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()  # one "Writing model shards" bar per checkpoint
        self.cfg, self.estimator = cfg, estimator
        self.paths = RunPaths(Path(run_root))
        self.device = actor_device(cfg.resources.learner_gpus)
        self.tokenizer = ensure_tokenizer(cfg, self.paths)
        init_dir = None if init is None else Path(init)
        policy = load_policy(cfg, self.tokenizer, init_dir, self.device)
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
        drop_state(self)
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
