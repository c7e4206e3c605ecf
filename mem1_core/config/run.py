"""`Config`: one run's whole configuration, a frozen dataclass of sections."""

from __future__ import annotations

from dataclasses import dataclass, field

from mem1_core.config.env import EnvConfig
from mem1_core.config.evaluation import EvalConfig
from mem1_core.config.pretrain import PretrainConfig
from mem1_core.config.resources import ResourcesConfig
from mem1_core.config.sections import (
    DataConfig,
    ModelConfig,
    RetrievalConfig,
    RolloutConfig,
    Section,
    TeacherConfig,
    WorldConfig,
)
from mem1_core.config.training import PPOConfig, SFTConfig, TrajectoryConfig


@dataclass(frozen=True)
class Config(Section):
    """One run's whole configuration."""

    profile: str = "tiny"
    """The profile whose YAML file (`data/profiles/NAME.yaml`) set the sections' defaults."""
    env: EnvConfig = field(default_factory=EnvConfig)
    world: WorldConfig = field(default_factory=WorldConfig)
    data: DataConfig = field(default_factory=DataConfig)
    retrieval: RetrievalConfig = field(default_factory=RetrievalConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    teacher: TeacherConfig = field(default_factory=TeacherConfig)
    sft: SFTConfig = field(default_factory=SFTConfig)
    ppo: PPOConfig = field(default_factory=PPOConfig)
    trajectory: TrajectoryConfig = field(default_factory=TrajectoryConfig)
    resources: ResourcesConfig = field(default_factory=ResourcesConfig)
    pretrain: PretrainConfig = field(default_factory=PretrainConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)

    def __post_init__(self) -> None:
        if self.ppo.micro_batch_tokens is not None and self.resources.learner_strategy == "fsdp":
            raise ValueError(
                "ppo.micro_batch_tokens: the FSDP ranks split each minibatch by rows (every rank "
                "runs as many passes); use ppo.micro_batch_size with resources.learner_strategy=fsdp"
            )
        if self.ppo.old_logprobs == "rollout" and self.trajectory.mode == "concat":
            raise ValueError(
                "trajectory.mode=concat scores tokens in contexts they were not sampled in, so "
                "its ratio against the sampler's log-probs would not start at 1: use "
                "ppo.old_logprobs=recompute with it"
            )

    @property
    def loss_scale_factor(self) -> float:
        """seq-mean-token-sum-norm's fixed normaliser: ppo.loss_scale_factor, else the most
        tokens a training trajectory can generate (verl's max response length)."""
        if self.ppo.loss_scale_factor is not None:
            return self.ppo.loss_scale_factor
        return float(self.rollout.max_generated_tokens(self.data.train_objectives))
