"""The learner: policy, frozen reference (the initial policy), critic and their optimisers;
`update(trajectories)` is mem1_core.rl.ppo.update; `get_weights()` hands the policy's
weights out on CPU.

One learner for both strategies: under `resources.learner_strategy=fsdp` each rank of the
group is a `LearnerRank` (mem1_core.training.fsdp_learner), a subclass of `Learner` that
shares the model building, the update, the checkpoint's metadata and the resume checks, and
overrides only what sharding changes: where the models go (`_place`), how the passes are
split (`split`, the hook of mem1_core.rl.passes) and how full weights are gathered and
scattered (`get_weights`, `_checkpoint_parts`, `_load_checkpoint`)."""

from __future__ import annotations

import contextlib
import copy
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn

from mem1_core.config import Config
from mem1_core.domains.inputs import ensure_tokenizer
from mem1_core.models.model import enable_gradient_checkpointing, master_weights
from mem1_core.models.policy import load_policy
from mem1_core.rl.batch import Models
from mem1_core.rl.critic import VALUE_HEAD_FILE, Critic, check_critic_layers
from mem1_core.rl.estimators import get_estimator
from mem1_core.rl.kl_control import KL_CONTROLLERS
from mem1_core.rl.passes import LOCAL, NonFiniteGuard, Split, UpdateSettings
from mem1_core.rl.ppo import update
from mem1_core.runs.layout import RunPaths
from mem1_core.training.actor_pool import drop_state
from mem1_core.training.checkpoint import (
    STATE_FILE,
    TrainState,
    load_checkpoint,
    read_state,
    save_checkpoint,
)
from mem1_core.training.optim import adamw
from mem1_core.training.ray_start import actor_device, set_threads
from mem1_core.trajectory.record import Trajectory

KEEP_CHECKPOINTS = 3
"""Checkpoints kept on disk (the newest)."""


def check_resumable(ckpt: Path, state: TrainState, estimator: str, strategy: str) -> None:
    """A checkpoint resumes only under the estimator and learner strategy that wrote it: the
    single learner keys its optimiser state by position, the FSDP group by parameter name."""
    saved = state.extra.get("estimator", estimator)
    if saved != estimator:
        raise ValueError(
            f"{ckpt} was trained with estimator {saved!r}, not {estimator!r}: resume it with "
            f"ppo.adv_estimator={saved}, or start a new run from its weights (--init)"
        )
    written = state.extra.get("learner_strategy", "single")
    if written != strategy:
        raise ValueError(
            f"{ckpt} was saved by the {written!r} learner, whose optimiser state is not laid "
            f"out for resources.learner_strategy={strategy}: resume it with "
            f"resources.learner_strategy={written}, or start a new run from its weights (--init)"
        )


class Learner:
    """Policy, frozen reference (the initial policy), critic and their optimisers, in this
    process (`resources.learner_strategy=single`)."""

    strategy = "single"
    """Written into the checkpoints' state (`learner_strategy`) and checked on resume."""

    def __init__(
        self,
        cfg: Config,
        run_root: str,
        init: str | None = None,
        threads: int | None = None,
    ):
        self._setup(cfg, run_root, init, threads)
        self._build(actor_device(cfg.resources.learner_gpus))

    def _setup(self, cfg: Config, run_root: str, init: str | None, threads: int | None) -> None:
        set_threads(threads)
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()  # one "Writing model shards" bar per checkpoint
        self.cfg = cfg
        # The KL coefficient of the next update: the KL controller moves it after each one
        # (every rank measures the same KL), checkpoints carry it (mem1_core.rl.kl_control).
        self.kl_coef = cfg.ppo.kl_coef
        self.paths = RunPaths(Path(run_root))
        self.init = None if init is None else Path(init)
        self.split: Split = LOCAL
        self.autocast: Any = contextlib.nullcontext()

    def _build(self, device: torch.device) -> None:
        """Load the policy (`init`, else the initial one), copy it as the frozen reference,
        load or derive the critic, place them (`_place`), then the optimisers."""
        cfg = self.cfg
        self.tokenizer = ensure_tokenizer(cfg, self.paths)
        policy = load_policy(cfg, self.tokenizer, self.init, device)
        reference = copy.deepcopy(policy).requires_grad_(False)
        critic = None
        if get_estimator(cfg.ppo.adv_estimator).uses_critic:
            saved = self.init.parent / "critic" if self.init is not None else None
            if saved is not None and (saved / VALUE_HEAD_FILE).is_file():
                critic = Critic.load(saved, cfg.model.dtype, cfg.model.attn)
                check_critic_layers(critic, cfg.ppo.critic_layers, saved)
            else:
                critic = Critic.from_policy(policy, cfg.ppo.critic_layers)
            critic = critic.to(device).eval()
        self.models = self._place(policy, reference, critic)
        # weight_decay=0: PPO's small steps should not also shrink the warm start.
        self.optimizers = {
            "policy": adamw(self.models.policy.parameters(), cfg.ppo.actor_lr, weight_decay=0.0)
        }
        if self.models.critic is not None:
            self.optimizers["critic"] = adamw(
                self.models.critic.parameters(), cfg.ppo.critic_lr, weight_decay=0.0
            )
        self.guard = NonFiniteGuard(cfg.ppo.max_nonfinite_in_row)

    def _place(self, policy: nn.Module, reference: nn.Module, critic: Critic | None) -> Models:
        """float32 master weights under bf16/fp16 autocast (the reference stays as loaded)."""
        self.autocast = master_weights(policy, self.cfg.model.dtype)
        if critic is not None:
            master_weights(critic, self.cfg.model.dtype)
        checkpoint_activations(self.cfg, policy, critic)
        return Models(policy, reference, critic)

    def reset(self, *args: Any) -> None:
        """Become a fresh learner for another run, in this process (mem1_core.training.actor_pool)."""
        drop_state(self)
        self.__init__(*args)

    def update(self, trajs: list[Trajectory], iteration: int) -> dict[str, Any]:
        """mem1_core.rl.ppo.update with this learner's models, optimisers and run settings, at
        the current KL coefficient, which the KL controller then moves from the batch's KL.
        The minibatch order is seeded per iteration: the same after a resume and on every
        rank."""
        t0 = time.perf_counter()
        cfg = self.cfg
        ppo = cfg.ppo
        settings = UpdateSettings(
            ppo,
            attn=cfg.model.attn,
            kl_coef=self.kl_coef,
            loss_scale_factor=cfg.loss_scale_factor,
            pad_id=self.tokenizer.pad_token_id,
            temperature=cfg.rollout.temperature or 1.0,
            seq_bucket=cfg.model.seq_bucket_tokens,
            split=self.split,
            trajectory_mode=cfg.trajectory.mode,
        )
        generator = torch.Generator().manual_seed(cfg.model.seed * 1_000_003 + iteration)
        with self.autocast:
            stats = update(self.models, self.optimizers, trajs, settings, self.guard, generator)
        if "kl_ctrl_measured" in stats:  # a learner without a reference has no KL to control
            self.kl_coef = KL_CONTROLLERS[ppo.kl_ctrl](
                self.kl_coef, stats["kl_ctrl_measured"], len(trajs), ppo.target_kl, ppo.kl_horizon
            )
        return stats | {"update_seconds": time.perf_counter() - t0}

    def get_weights(self) -> dict[str, torch.Tensor]:
        return {k: v.detach().cpu() for k, v in self.models.policy.state_dict().items()}

    def save(self, state: TrainState) -> str:
        """Write a checkpoint (atomically, mem1_core.training.checkpoint). -> its path ("" on a
        process that does not write it)."""
        parts = self._checkpoint_parts()
        if parts is None:
            return ""
        extra = state.extra | {
            "nonfinite_total": self.guard.total,
            "nonfinite_in_row": self.guard.in_row,
            "estimator": self.cfg.ppo.adv_estimator,
            "kl_coef": self.kl_coef,
            "learner_strategy": self.strategy,
        }
        out = save_checkpoint(
            self.paths.checkpoints,
            TrainState(state.iteration, state.elapsed_seconds, extra),
            config=self.cfg,
            tokenizer=self.tokenizer,
            keep=KEEP_CHECKPOINTS,
            **parts,
        )
        return str(out)

    def _checkpoint_parts(self) -> dict[str, Any] | None:
        """What `save_checkpoint` writes besides the state: models and optimisers."""
        return {
            "policy": self.models.policy,
            "optimizers": self.optimizers,
            "critic": self.models.critic,
        }

    def restore(self, path: str) -> TrainState:
        """Load a checkpoint this estimator and learner strategy wrote: weights, optimiser
        states, RNG, the non-finite counters and the KL coefficient the controller reached."""
        ckpt = Path(path)
        if not (ckpt / STATE_FILE).is_file():
            raise FileNotFoundError(f"{ckpt} is not a checkpoint (no {STATE_FILE})")
        state = read_state(ckpt)
        check_resumable(ckpt, state, self.cfg.ppo.adv_estimator, self.strategy)
        self._load_checkpoint(ckpt)
        self.guard.total = int(state.extra.get("nonfinite_total", 0))
        self.guard.in_row = int(state.extra.get("nonfinite_in_row", 0))
        if self.cfg.ppo.kl_ctrl == "adaptive":  # a fixed coefficient is the config's
            self.kl_coef = float(state.extra.get("kl_coef", self.cfg.ppo.kl_coef))
        return state

    def _load_checkpoint(self, ckpt: Path) -> None:
        # verify=False: the driver has just checked its checksums (latest_intact_checkpoint)
        load_checkpoint(
            ckpt,
            policy=self.models.policy,
            optimizers=self.optimizers,
            critic=self.models.critic,
            verify=False,
        )


def checkpoint_activations(cfg: Config, policy: nn.Module, critic: Critic | None) -> None:
    """`model.gradient_checkpointing` on the policy and the critic's backbone; after every
    `.eval()`, which would undo it."""
    if cfg.model.gradient_checkpointing:
        enable_gradient_checkpointing(policy)
        if critic is not None:
            enable_gradient_checkpointing(critic.backbone)
