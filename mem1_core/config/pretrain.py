"""The `pretrain` section: the shipped base's training from scratch (mem1_core.training.pretrain)."""

from __future__ import annotations

from dataclasses import dataclass

from mem1_core.config.sections import MEMORIES, Section


@dataclass(frozen=True)
class PretrainConfig(Section):
    """`mem1 pretrain`: the embedded default's base model, trained once on fresh worlds
    (mem1_core.training.pretrain). Model sizes come from the `model` section."""

    steps: int = 5300
    """Length of the pretraining in optimiser steps: it decides, and the lr schedule is cosine
    over it. The shipped base took 5,289 (data/base/manifest.json)."""
    minutes: float = 300.0
    """Cap on its minutes: it stops a run far slower than planned, with a warning and
    `stopped_by: minutes` in the manifest and the last metrics row."""
    lr: float = 2e-3
    """Peak learning rate of AdamW."""
    warmup_fraction: float = 0.03
    """Fraction of `steps` spent warming up before the cosine decay."""
    weight_decay: float = 0.0
    """AdamW's decoupled weight decay."""
    grad_clip: float = 1.0
    """Clip the gradient norm to this before a step."""
    batch_size: int = 16
    """Teacher trajectories (flattened trees) per step."""
    text_batch_size: int = 4
    """Rows of packed documents and list drills per step."""
    text_len: int = 384
    """Tokens per text row: positions well past a 2-objective context."""
    text_weight: float = 0.5
    """Weight of the next-token loss on the text rows (documents and drills)."""
    context_weight: float = 0.3
    """Weight of the next-token loss on the teacher trajectories' prompt and <info> tokens."""
    objectives: tuple[int, ...] = (1, 2)
    """N of the teacher's tasks. Never above 2, so N >= 4 measures generalisation."""
    memories: tuple[str, ...] = ("mem1", "full")
    """Memory policies of the teacher's trajectories."""
    tasks_per_world: int = 300
    """Tasks per N (and per memory) the teacher plays in each fresh world."""
    drills_per_world: int = 400
    """List drills per world (numbered fact lists carried from one `<IS>` to the next)."""
    drill_max_facts: int = 16
    """Longest list of the list drills and the question-list drills."""
    question_drills_per_world: int = 400
    """Question-list drills per world (a k-question prompt, then the search for question j;
    mem1_core.training.pretrain_data). 0: none (the base shipped before them)."""
    steps_per_world: int = 150
    """A new world every this many steps."""
    pool_worlds: int = 3
    """Batches draw from the newest this many worlds."""
    world_seed: int = 100_000
    """Fresh worlds get seeds world_seed, world_seed + 1, ...: never a run's world."""
    eval_world_seeds: tuple[int, ...] = (0,)
    """Held-out worlds (the `tiny` evaluation world is seed 0; no round trains on it)."""
    eval_objectives: tuple[int, ...] = (1, 2, 4)
    """N of the held-out evaluations."""
    eval_tasks: int = 32
    """Held-out tasks per N in each evaluation."""
    eval_every: int = 250
    """Held-out evaluation every this many steps (and at the end)."""
    init: str | None = None
    """Continue from this base (a directory with `manifest.json`: its weights and tokenizer,
    not its optimiser) instead of random weights: teaching an existing base a changed format
    without redoing hours. Its format may be an older one; its manifest's history is carried
    into the new one."""

    def __post_init__(self) -> None:
        if self.steps < 1 or self.eval_every < 1 or self.minutes <= 0:
            raise ValueError("pretrain.steps and pretrain.eval_every must be >= 1, minutes > 0")
        if any(n > 2 or n < 1 for n in self.objectives):
            raise ValueError(
                "pretrain.objectives must be 1 or 2: the base sees no multi-objective task "
                "above 2 objectives (N >= 4 measures generalisation, as in the paper)"
            )
        if set(self.eval_world_seeds) & set(range(self.world_seed, self.world_seed + 10**5)):
            raise ValueError("pretrain.eval_world_seeds overlap the training worlds' seeds")
        if not set(self.memories) <= set(MEMORIES):
            raise ValueError(f"pretrain.memories: choose from {', '.join(MEMORIES)}")
