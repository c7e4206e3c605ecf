"""Typed, frozen configuration and the named profiles that select its defaults.

A profile (`tiny`: the embedded CPU default; `smoke`: the same code in seconds, for tests;
`paper`: the GPU setup of the paper; YAML files in `data/profiles/`) picks defaults for
every section; a YAML file and `section.field=value` overrides are applied on top
(`load_config`). The parent flow builds the dataclass once from those JSON-able pieces and
hands its resolved values to every stage (`config_from_dict`); a stage flow run on its own
builds it from the same pieces.

- env.py: env (the domain; the registry of domains is domains.py);
- sections.py: world, data, retrieval, model, rollout, teacher;
- training.py: sft, ppo (the algorithm), trajectory (how the learner scores a pruned
  trajectory); pretrain.py: pretrain (the shipped base);
- resources.py: resources (where RL training runs: Ray placement, learner strategy);
- evaluation.py: eval (the evaluation's scorer);
- run.py: `Config`, all of them;
- loader.py: profiles, YAML/CLI coercion, errors that name the field.
"""

from mem1_core.config.env import EnvConfig
from mem1_core.config.evaluation import SCORER_NAMES, EvalConfig
from mem1_core.config.loader import (
    config_from_dict,
    config_json,
    load_config,
    parse_overrides,
    profile_names,
)
from mem1_core.config.pretrain import PretrainConfig
from mem1_core.config.resources import ResourcesConfig
from mem1_core.config.run import Config
from mem1_core.config.sections import (
    MEMORIES,
    DataConfig,
    ModelConfig,
    RetrievalConfig,
    RolloutConfig,
    TeacherConfig,
    WorldConfig,
)
from mem1_core.config.training import PPOConfig, SFTConfig, TrajectoryConfig

__all__ = [
    "MEMORIES",
    "EnvConfig",
    "SCORER_NAMES",
    "Config",
    "DataConfig",
    "EvalConfig",
    "ModelConfig",
    "PPOConfig",
    "PretrainConfig",
    "ResourcesConfig",
    "RetrievalConfig",
    "RolloutConfig",
    "SFTConfig",
    "TeacherConfig",
    "TrajectoryConfig",
    "WorldConfig",
    "config_from_dict",
    "config_json",
    "load_config",
    "parse_overrides",
    "profile_names",
]
