"""The config of each stage of an experiment: the profile, the experiment's settings, a warm
start's, an arm's trainer defaults and its own, the held-out curve's cadence, the final
evaluation's settings (mem1_core.experiment.spec says in which order they apply)."""

from __future__ import annotations

from dataclasses import replace

from mem1_core.experiment.spec import PLAIN, ExperimentSpec


def _curve(spec: ExperimentSpec, overrides: list[str]) -> list[str]:
    """The held-out curve's cadence: `curve_points` over the iterations those overrides give,
    at the training N and `curve_objectives`."""
    from mem1_core.config import load_config

    first = load_config(spec.profile, None, list(overrides))
    every = max(1, first.ppo.iterations // max(spec.curve_points, 1))
    return [f"ppo.eval_every={every}", f"ppo.eval_objectives={list(spec.curve_objectives)}"]


def base_config(spec: ExperimentSpec):
    """The config every stage of the experiment starts from: the profile, the held-out curve's
    cadence (`curve_points` over the iterations, at the training N and `curve_objectives`),
    then the experiment's settings, which win."""
    from mem1_core.config import load_config

    return load_config(spec.profile, None, [*_curve(spec, spec.overrides), *spec.overrides])


def warm_start_config(spec: ExperimentSpec, name: str = PLAIN):
    """A warm start's config: the experiment's, then the named warm start's settings."""
    from mem1_core.config import load_config

    if name == PLAIN:
        return base_config(spec)
    if name not in spec.warm_starts:
        raise ValueError(
            f"experiment {spec.name}: no warm start {name!r} ({list(spec.warm_starts)})"
        )
    more = [*spec.overrides, *spec.warm_starts[name].overrides]
    return load_config(spec.profile, None, [*_curve(spec, more), *more])


def arm_overrides(spec: ExperimentSpec, arm: str) -> list[str]:
    """An arm's settings over the profile, in order: the experiment's, its warm start's, its
    trainer's defaults, its own."""
    from mem1_core.config.training import TRAINER_DEFAULTS

    if arm not in spec.arms:
        raise ValueError(f"experiment {spec.name}: no arm {arm!r}; its arms are {list(spec.arms)}")
    a = spec.arms[arm]
    ws = spec.warm_starts[a.warm_start].overrides if a.warm_start != PLAIN else ()
    return [*spec.overrides, *ws, *TRAINER_DEFAULTS.get(a.trainer, ()), *a.overrides]


def arm_config(spec: ExperimentSpec, arm: str, seed: int):
    """An arm run's config: its settings (arm_overrides), the curve's cadence over its own
    iterations, its memory policy, `model.seed` its seed."""
    from mem1_core.config import load_config

    more = arm_overrides(spec, arm)
    cfg = load_config(spec.profile, None, [*_curve(spec, more), *more])
    return replace(
        cfg,
        model=replace(cfg.model, seed=seed),
        rollout=replace(cfg.rollout, memory=spec.arms[arm].memory),
    )


def eval_config(spec: ExperimentSpec, world: int, agent: str | None = None):
    """The final evaluation's config on world `world` (its seed), at the experiment's N and
    objectives per N, with the evaluation's own settings (`eval.set:`) last. With `agent`,
    the settings of how it plays (the `rollout.` ones of its arm and warm start: a prompt it
    was trained with) come before the evaluation's own."""
    from mem1_core.config import load_config

    cfg = base_config(spec)
    return load_config(
        spec.profile,
        None,
        [
            *spec.overrides,
            *(agent_play_overrides(spec, agent) if agent else ()),
            f"ppo.eval_every={cfg.ppo.eval_every}",
            f"ppo.eval_objectives={list(cfg.ppo.eval_objectives)}",
            f"world.seed={world}",
            f"data.eval_objectives={list(spec.objectives)}",
            f"data.eval_objectives_per_n={spec.objectives_per_n}",
            *spec.eval_overrides,
        ],
    )


PLAY_SECTIONS = ("rollout.",)
"""The settings of an arm that say how its agent plays (not only how it trains): its
evaluation plays under them too."""


def agent_play_overrides(spec: ExperimentSpec, agent: str) -> list[str]:
    """The `rollout.` settings an agent plays under beyond the experiment's: its warm start's
    and its arm's (empty for the paper's arms)."""
    arm = spec.agent_arm(agent)
    if arm is not None:
        a = spec.arms[arm]
        items = [*(spec.warm_starts[a.warm_start].overrides if a.warm_start != PLAIN else ()),
                 *a.overrides]  # fmt: skip
    else:
        ws = spec.warm_start_agents().get(agent, PLAIN)
        items = list(spec.warm_starts[ws].overrides) if ws != PLAIN else []
    # the memory a warm start trained under is the agent's memory (agent_memory), which every
    # cell plays under already: no config of its own (which would take it off the vLLM player)
    return [o for o in items if o.startswith(PLAY_SECTIONS) and not o.startswith("rollout.memory=")]
