"""The registries of RL methods: one per kind, the only list of its names (verl's
`register_adv_est` / `register_policy_loss`, one registry per family).

A registry declares its names here, without importing torch, so that a config is checked
when it is loaded (`ppo.adv_estimator=foo` fails at `--set`, not at the first update). The
modules that implement the methods (mem1_core.rl.estimators, .losses, .kl_control,
.advantages, .rollout_correction) register each one under a declared name; registering an
undeclared name, or leaving a declared one unimplemented (`check_complete`, at the end of
each module), raises. A registry is a dict of the implementations registered so far
(`REG[name]`, `set(REG)`, `REG.items()`); `REG.names` are the declared names.

Imports nothing from mem1_core: the config layer, below every user of a method.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")


class Registry(dict[str, Any]):
    """One kind of method: its declared names and, once registered, their implementations."""

    def __init__(self, kind: str, field: str, names: tuple[str, ...]):
        super().__init__()
        self.kind = kind
        """What a method of this kind is, for messages (`advantage estimator`)."""
        self.field = field
        """The config field that names one (`ppo.adv_estimator`)."""
        self.names = names
        """Every method of this kind, in the order the docs list them."""

    def register(self, name: str) -> Callable[[T], T]:
        """Decorator: register the decorated object as `name`'s implementation."""

        def add(impl: T) -> T:
            self.add(name, impl)
            return impl

        return add

    def add(self, name: str, impl: Any) -> None:
        if name not in self.names:
            raise ValueError(
                f"{self.kind} {name!r} is not declared in mem1_core.config.methods: add it to "
                f"the names of {self.field}"
            )
        if name in self:
            raise ValueError(f"{self.kind} {name!r} is registered twice")
        self[name] = impl

    def check(self, value: str) -> None:
        """A config value names one of these methods, or a ValueError that says the choices."""
        if value not in self.names:
            raise ValueError(f"{self.field}={value!r}: use one of {', '.join(self.names)}")

    def check_complete(self) -> None:
        """Called by the implementing module once it has registered: every name has one."""
        missing = [n for n in self.names if n not in self]
        if missing:
            raise ValueError(f"{self.kind}s declared but not registered: {', '.join(missing)}")

    def __missing__(self, name: str) -> Any:
        if name in self.names:
            raise ValueError(f"{self.kind} {name!r} is declared but no module registered it")
        raise ValueError(f"unknown {self.kind} {name!r}; choose one of {list(self.names)}")


ADV_ESTIMATORS = Registry(
    "advantage estimator",
    "ppo.adv_estimator",
    (
        "gae",
        "grpo",
        "grpo_mean",
        "rloo",
        "reinforce_plus_plus",
        "reinforce_plus_plus_baseline",
    ),
)
"""mem1_core.rl.estimators: name -> Estimator."""

POLICY_LOSSES = Registry("policy loss", "ppo.policy_loss", ("vanilla", "gspo"))
"""mem1_core.rl.losses: name -> (logp, old_logp, adv, loss_mask, clip_eps, *, clip_eps_high,
dual_clip, is_weights, normalizer) -> (loss, metrics); each reads the keywords it uses."""

LOSS_AGG_MODES = Registry(
    "loss_agg_mode",
    "ppo.loss_agg_mode",
    ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"),
)
"""mem1_core.rl.losses.agg_loss: name -> the per-row aggregation."""

KL_CONTROLLERS = Registry("KL controller", "ppo.kl_ctrl", ("fixed", "adaptive"))
"""mem1_core.rl.kl_control: name -> (coef, measured KL, trajectories, target_kl, horizon)
-> the next coefficient."""

KL_ESTIMATORS = Registry("KL estimator", "ppo.kl_kind", ("k1", "k2", "k3"))
"""mem1_core.rl.advantages: name -> per-token KL(policy || ref) estimate."""

ROLLOUT_IS_LEVELS = Registry("rollout_is level", "ppo.rollout_is", ("token", "sequence"))
"""mem1_core.rl.rollout_correction: the levels of the truncated importance weights."""

TRAJECTORY_MODES = Registry("trajectory mode", "trajectory.mode", ("tree", "turns", "concat"))
"""mem1_core.trajectory.modes: name -> TrajectoryMode (how a trajectory becomes the learner's
rows: the exact tree, one row per turn, or the official code's concatenation)."""
