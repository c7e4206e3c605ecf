"""Typed, frozen configuration and the named profiles that select its defaults.

A profile (`tiny`: the embedded CPU default; `smoke`: the same code in seconds, for tests;
`paper`: the GPU setup of the paper) picks defaults for every section; a YAML file and
`section.field=value` overrides are applied on top (`load_config`). Flows take those
JSON-able pieces and build the dataclass on their first line.
"""

from __future__ import annotations

import dataclasses
import json
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml


class _Section:
    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)  # type: ignore[arg-type]


@dataclass(frozen=True)
class WorldConfig(_Section):
    """The procedurally generated encyclopedia (mem1_core.data.world)."""

    seed: int = 0
    """Seed for names, relations, phrasing and the split."""
    n_countries: int = 24
    n_cities: int = 160
    n_people: int = 1600
    n_orgs: int = 320
    n_works: int = 640
    near_duplicate_fraction: float = 0.15
    """Chance that an entity gets a sibling whose name differs in one syllable (a distractor)."""
    test_fraction: float = 0.25
    """Fraction of entities (and so of questions) held out for the test split."""

    def __post_init__(self) -> None:
        if min(self.n_countries, self.n_cities, self.n_people, self.n_orgs, self.n_works) < 1:
            raise ValueError("world sizes must all be >= 1")
        if self.n_cities < self.n_countries:
            raise ValueError("n_cities must be >= n_countries: every country needs a capital")
        if not 0.0 < self.test_fraction < 1.0:
            raise ValueError("test_fraction must be in (0, 1)")
        if not 0.0 <= self.near_duplicate_fraction < 1.0:
            raise ValueError("near_duplicate_fraction must be in [0, 1)")


@dataclass(frozen=True)
class DataConfig(_Section):
    """Where questions come from and how they are composed into N-objective tasks."""

    source: str = "world"
    """`world` (embedded), `hotpotqa`, `nq`, or `hotpotqa+nq` (the paper's mix)."""
    hotpotqa: str = "hotpotqa/hotpot_qa"
    """Hub dataset name or a local .json/.jsonl/.parquet file in HotpotQA's row format."""
    hotpotqa_config: str = "distractor"
    nq: str = "nq_open"
    """Hub dataset name (`nq_open`) or a local file in FlashRAG's row format."""
    train_objectives: int = 2
    """N of the training tasks (the paper trains on 2-objective tasks)."""
    eval_objectives: tuple[int, ...] = (1, 2, 4, 8, 16)
    mode: str = "per_source"
    """`per_source` (consecutive questions of one source, as the paper) or `mixed`."""
    seed: int = 0
    max_train_tasks: int | None = None
    max_eval_tasks: int | None = 16

    def __post_init__(self) -> None:
        if self.source not in ("world", "hotpotqa", "nq", "hotpotqa+nq"):
            raise ValueError(f"data.source={self.source!r}: use world, hotpotqa, nq or hotpotqa+nq")
        if self.mode not in ("per_source", "mixed"):
            raise ValueError(f"data.mode={self.mode!r}: use per_source or mixed")
        if self.train_objectives < 1 or any(n < 1 for n in self.eval_objectives):
            raise ValueError("objective counts must be >= 1")


@dataclass(frozen=True)
class RetrievalConfig(_Section):
    """The retriever that answers `<query>`."""

    kind: str = "bm25"
    """`bm25` (embedded default) or `dense` (e5 + FAISS, the paper)."""
    topk: int = 3
    """Passages returned per query as one `<info>` block."""
    encoder: str = "intfloat/e5-base-v2"
    corpus: str | None = None
    """Corpus path for non-world sources (Search-R1 JSONL or corpus Parquet)."""
    url: str | None = None
    """If set, talk to a retrieval server at this URL instead of an in-process index."""

    def __post_init__(self) -> None:
        if self.kind not in ("bm25", "dense"):
            raise ValueError(f"retrieval.kind={self.kind!r}: use bm25 or dense")
        if self.topk < 1:
            raise ValueError("retrieval.topk must be >= 1")


@dataclass(frozen=True)
class ModelConfig(_Section):
    """The policy model and its tokenizer."""

    name_or_path: str | None = None
    """A hub name or local path (the `paper` profile); None builds the tiny model from config."""
    tokenizer_vocab: int = 3000
    """Vocabulary of the locally trained tiny tokenizer."""
    hidden_size: int = 128
    num_layers: int = 3
    num_heads: int = 4
    num_kv_heads: int = 2
    intermediate_size: int = 384
    max_positions: int = 4096
    dtype: str = "float32"
    """`float32` on CPU; `bfloat16` on GPU."""
    attn: str = "sdpa"
    """Attention for the dense path: `sdpa` (boolean masks), `eager` (0/-inf float masks), or
    `flex_attention` (GPU training path, BlockMask)."""
    gradient_checkpointing: bool = False
    """Recompute each decoder layer's activations in the backward pass (Hugging Face
    activation checkpointing, non-reentrant) for the learner's policy and critic: less
    memory, about a third more compute. Gradient passes then run the tree in one pass with
    its full mask (the shared-prefix forward hands a KV cache between stages, which a
    checkpointed layer cannot keep)."""
    seq_bucket: int | None = None
    """The learner pads each flattened batch (and micro-batch) to a multiple of this many
    tokens, so FlexAttention compiles once per bucket, not once per length. None: 128 (the
    BlockMask block size) under `flex_attention`, 1 otherwise. Padding changes no result."""
    seed: int = 0

    def __post_init__(self) -> None:
        if self.hidden_size % self.num_heads or self.num_heads % self.num_kv_heads:
            raise ValueError("hidden_size must divide by num_heads, num_heads by num_kv_heads")
        if self.attn not in ("sdpa", "eager", "flex_attention"):
            raise ValueError(f"model.attn={self.attn!r}: use sdpa, eager or flex_attention")
        if self.dtype not in ("float32", "bfloat16", "float16"):
            raise ValueError(f"model.dtype={self.dtype!r}: use float32, bfloat16 or float16")
        if self.seq_bucket is None:
            object.__setattr__(self, "seq_bucket", 128 if self.attn == "flex_attention" else 1)
        if self.seq_bucket < 1:
            raise ValueError(f"model.seq_bucket={self.seq_bucket}: use an int >= 1 (1: none)")


@dataclass(frozen=True)
class RolloutConfig(_Section):
    """Multi-turn rollout: memory policy, turn and token budgets, sampling."""

    policy: str = "mem1"
    """Memory policy: `mem1`, `full` or `truncate`."""
    truncate_turns: int = 2
    """`truncate`: how many of the last turns stay in context."""
    turns_base: int = 2
    turns_per_objective: int = 2
    """The turn budget is turns_base + turns_per_objective * N (6 turns at N=2, as the paper)."""
    gen_tokens_base: int = 48
    gen_tokens_per_objective: int = 12
    """Tokens one turn may generate: base + per_objective * N (the <IS> grows with N)."""
    temperature: float = 1.0
    """Sampling temperature for training rollouts (evaluation is greedy)."""
    top_p: float = 1.0
    batch_size: int = 64
    """Trajectories generated together (the KV-cached batch; `hf` only, vLLM schedules its own)."""
    backend: str = "hf"
    """Generation engine of the RL rollout workers: `hf` (Hugging Face with a KV cache, runs
    anywhere), `vllm` (mem1_core.rollout.generation_vllm: needs the vLLM venv, docs/gpu.md), or
    `auto` (vllm where it can be imported, else hf: the `paper` default, so the same profile
    runs from .venv-vllm with vLLM and from the Prefect venv with Hugging Face)."""
    gpu_memory_utilization: float = 0.5
    """`vllm`: the fraction of its GPU's memory the engine takes (weights, activations, KV
    cache). 0.5 leaves the rest to a learner on the same GPU; raise it when a worker has a GPU
    of its own."""

    def __post_init__(self) -> None:
        if self.policy not in ("mem1", "full", "truncate"):
            raise ValueError(f"rollout.policy={self.policy!r}: use mem1, full or truncate")
        if self.backend not in ("hf", "vllm", "auto"):
            raise ValueError(
                f"rollout.backend={self.backend!r}: use hf (Hugging Face), vllm (needs the "
                "vLLM venv: ./dev setup-vllm, docs/gpu.md) or auto"
            )
        if not 0.0 < self.gpu_memory_utilization <= 1.0:
            raise ValueError(
                f"rollout.gpu_memory_utilization={self.gpu_memory_utilization}: use a "
                "fraction in (0, 1]"
            )
        if self.turns_base + self.turns_per_objective < 1:
            raise ValueError("the turn budget must be >= 1 at N=1")
        if not 0.0 < self.top_p <= 1.0 or self.temperature < 0.0:
            raise ValueError("need 0 < top_p <= 1 and temperature >= 0")

    def max_turns(self, n_objectives: int) -> int:
        return self.turns_base + self.turns_per_objective * n_objectives

    def max_new_tokens(self, n_objectives: int) -> int:
        return self.gen_tokens_base + self.gen_tokens_per_objective * n_objectives


@dataclass(frozen=True)
class TeacherConfig(_Section):
    """The scripted teacher that plays the paper's GPT-4o role on the task world."""

    error_rate: float = 0.0
    """Chance that the teacher answers an objective wrongly on purpose."""
    forget_rate: float = 0.0
    """Chance that the teacher, moving on from a finished objective, writes `?` for its answer
    in the `<IS>` (a memory-consolidation lapse; mem1_core.rollout.teacher). SFT copies the habit; RL
    on the task reward can unlearn it (MEM1 §5.4)."""
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("error_rate", "forget_rate"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"teacher.{name} must be in [0, 1]")


@dataclass(frozen=True)
class SFTConfig(_Section):
    """Supervised training on teacher trajectories (loss on generated tokens only)."""

    warm_start_objectives: tuple[int, ...] = (1, 2)
    """N of the teacher trajectories of the warm start (the tag format, and `;` between the
    answers of several questions: from N=1 alone the tiny model does not generalise to N=2,
    measured 1/32 tasks at N=2, so PPO would start with no reward at all)."""
    warm_start_minutes: float = 20.0
    """Wall-clock budget of the warm start; `warm_start_steps` caps it too."""
    warm_start_steps: int = 100000
    minutes: float = 8.0
    """Budget of the SFT arm of the ablation (on train_objectives-objective tasks)."""
    steps: int = 100000
    lr: float = 2e-3
    warmup_steps: int = 50
    batch_size: int = 16
    """Trajectories per step (each a flattened tree)."""
    n_teacher_tasks: int = 4000
    """Teacher trajectories generated for SFT (cycled if training runs longer), spread evenly
    over the run's world and the `teacher_worlds` extra ones."""
    teacher_worlds: int = 0
    """Extra generated worlds (fresh names, train split only) the teacher also plays, so the
    model cannot memorise entities and must learn to copy (see mem1_core.runs.assets.teacher_world).
    The world-based sources only; 0 for hub data."""
    warm_start_context_weight: float = 0.0
    """Warm start only: weight of a next-token loss on the prompt and <info> tokens of the
    extra worlds' trajectories (never the run's own world, whose <info> can show held-out
    entities): the pretraining a base model brings, which teaches copying."""
    weight_decay: float = 0.0
    grad_clip: float = 1.0


@dataclass(frozen=True)
class PPOConfig(_Section):
    """PPO / GRPO over masked trajectories (the paper's defaults where they apply)."""

    iterations: int = 1000
    minutes: float = 8.0
    """Wall-clock budget; whichever of iterations / minutes ends first."""
    tasks_per_iteration: int = 32
    samples_per_task: int = 1
    """GRPO needs several samples per task (a group); PPO uses 1."""
    actor_lr: float = 1e-4
    critic_lr: float = 1e-4
    kl_coef: float = 1e-3
    kl_kind: str = "k1"
    kl_in_loss: bool = False
    """GRPO style: the KL is a loss term instead of a reward penalty."""
    gamma: float = 1.0
    lam: float = 1.0
    clip_eps: float = 0.2
    value_clip_eps: float = 0.2
    entropy_coef: float = 0.0
    ppo_epochs: int = 2
    minibatch_size: int = 16
    micro_batch_size: int = 8
    grad_clip: float = 1.0
    max_nonfinite_in_row: int = 3
    """Stop with an error after this many skipped (non-finite) updates in a row."""
    checkpoint_every: int = 1
    eval_every: int = 0
    """Greedy evaluation on held-out tasks every K iterations (0: only at the end)."""
    num_rollout_workers: int = 1
    cpus_per_worker: float = 1.0
    gpus_per_worker: float = 0.0
    learner_cpus: float = 1.0
    """CPUs of each learner process (each FSDP rank asks for this many; also its torch threads)."""
    learner_gpus: float = 0.0
    """GPUs of the learner: of its one process (`single`), or in all (`fsdp`: one per rank)."""
    learner_ranks: int = 0
    """`fsdp` only: learner processes. 0 means one per learner GPU (`learner_gpus`); without
    GPUs (`learner_gpus=0`) set it to run that many CPU ranks over gloo (tests, debugging)."""
    ray_address: str | None = None
    """Connect to a running Ray cluster: `auto` when the run starts on one of its nodes
    (after `ray start --head` / `ray start --address=HEAD:6379` on each node), or the head's
    `HOST:6379`; None starts a private local one. Workers and the learner are then placed on
    any node with the GPUs they ask for, so `--out` must be on a filesystem every node sees."""
    learner_strategy: str = "single"
    """`single`: the learner is one process on one device, its weights in `model.dtype`.
    `fsdp`: `learner_world` learner ranks (Ray actors forming one torch.distributed group,
    one GPU each, or CPU ranks over gloo) shard policy, reference and critic with FSDP2
    (float32 master weights, compute in `model.dtype`) and split every minibatch between
    them (mem1_core.training.fsdp_learner). Checkpoints hold full weights in the single learner's
    format, so evaluation and `--init` read them alike; their optimiser state is keyed by
    parameter name, so a run resumes under the strategy it was saved with."""

    @property
    def learner_world(self) -> int:
        """Learner processes: 1 under `single`, the FSDP ranks under `fsdp`."""
        if self.learner_strategy != "fsdp":
            return 1
        return self.learner_ranks or int(self.learner_gpus)

    def __post_init__(self) -> None:
        if self.minibatch_size % self.micro_batch_size:
            raise ValueError("ppo.minibatch_size must be a multiple of ppo.micro_batch_size")
        if self.kl_kind not in ("k1", "k2", "k3"):
            raise ValueError("ppo.kl_kind: use k1, k2 or k3")
        if self.learner_strategy not in ("single", "fsdp"):
            raise ValueError(f"ppo.learner_strategy={self.learner_strategy!r}: use single or fsdp")
        if self.learner_strategy == "fsdp":
            self._check_fsdp_ranks()
        elif self.learner_ranks:
            raise ValueError(
                "ppo.learner_ranks is the number of FSDP ranks: set ppo.learner_strategy=fsdp, "
                "or leave learner_ranks at 0"
            )

    def _check_fsdp_ranks(self) -> None:
        gpus, ranks = self.learner_gpus, self.learner_ranks
        if gpus < 0 or not float(gpus).is_integer() or (gpus == 0 and ranks == 0):
            raise ValueError(
                "ppo.learner_strategy=fsdp runs one learner process per GPU: set ppo.learner_gpus "
                f"to a whole number >= 1 (got {gpus}), or, without GPUs, ppo.learner_ranks to "
                "the number of CPU ranks"
            )
        if gpus and ranks and ranks != gpus:
            raise ValueError(
                f"ppo.learner_ranks={ranks} with ppo.learner_gpus={gpus:g}: an FSDP rank has one "
                "GPU; set learner_ranks to 0 (one per GPU) or to learner_gpus"
            )
        if self.learner_world < 2:
            raise ValueError(
                "ppo.learner_strategy=fsdp with one rank shards nothing and only adds "
                "collectives: use ppo.learner_strategy=single, or give it >= 2 ranks"
            )


@dataclass(frozen=True)
class PretrainConfig(_Section):
    """`mem1 pretrain`: the embedded default's base model, trained once on fresh worlds
    (mem1_core.training.pretrain). Model sizes come from the `model` section."""

    minutes: float = 120.0
    """Wall-clock budget (the lr schedule is cosine over it)."""
    lr: float = 2e-3
    warmup_fraction: float = 0.03
    weight_decay: float = 0.0
    grad_clip: float = 1.0
    batch_size: int = 16
    """Teacher trajectories (flattened trees) per step."""
    text_batch_size: int = 4
    """Rows of packed documents and list drills per step."""
    text_len: int = 384
    """Tokens per text row: positions well past a 2-objective context."""
    text_weight: float = 0.5
    context_weight: float = 0.3
    """Weight of the next-token loss on the teacher trajectories' prompt and <info> tokens."""
    objectives: tuple[int, ...] = (1, 2)
    """N of the teacher's tasks. Never above 2, so N >= 4 measures generalisation."""
    memories: tuple[str, ...] = ("mem1", "full")
    tasks_per_world: int = 300
    """Tasks per N (and per memory) the teacher plays in each fresh world."""
    drills_per_world: int = 400
    drill_max_facts: int = 16
    steps_per_world: int = 150
    """A new world every this many steps."""
    pool_worlds: int = 3
    """Batches draw from the newest this many worlds."""
    world_seed: int = 100_000
    """Fresh worlds get seeds world_seed, world_seed + 1, ...: never a run's world."""
    eval_world_seeds: tuple[int, ...] = (0,)
    """Held-out worlds (the `tiny` evaluation world is seed 0; no round trains on it)."""
    eval_objectives: tuple[int, ...] = (1, 2, 4)
    eval_tasks: int = 32
    eval_every_minutes: float = 10.0

    def __post_init__(self) -> None:
        if any(n > 2 or n < 1 for n in self.objectives):
            raise ValueError(
                "pretrain.objectives must be 1 or 2: the base sees no multi-objective task "
                "above 2 objectives (N >= 4 measures generalisation, as in the paper)"
            )
        if set(self.eval_world_seeds) & set(range(self.world_seed, self.world_seed + 10**5)):
            raise ValueError("pretrain.eval_world_seeds overlap the training worlds' seeds")
        if not set(self.memories) <= {"mem1", "full", "truncate"}:
            raise ValueError("pretrain.memories: choose from mem1, full, truncate")


@dataclass(frozen=True)
class Config(_Section):
    """One run's whole configuration."""

    profile: str = "tiny"
    world: WorldConfig = field(default_factory=WorldConfig)
    data: DataConfig = field(default_factory=DataConfig)
    retrieval: RetrievalConfig = field(default_factory=RetrievalConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    teacher: TeacherConfig = field(default_factory=TeacherConfig)
    sft: SFTConfig = field(default_factory=SFTConfig)
    ppo: PPOConfig = field(default_factory=PPOConfig)
    pretrain: PretrainConfig = field(default_factory=PretrainConfig)


PROFILES: dict[str, dict[str, Any]] = {
    # The embedded CPU default. Two passages per <info> keep the turns short, so the tiny
    # model trains on more turns per minute; the paper's topk=3 is the `paper` profile's.
    "tiny": {
        "retrieval": {"topk": 2},
        # The default `train-eval` on a 2-core laptop in about 15 minutes: the warm start, then
        # the three arms of the ablation on equal budgets, then the evaluation of six agents
        # (8 test tasks per N). Learning needs longer budgets (README, "Training").
        "sft": {"warm_start_minutes": 7.0, "minutes": 1.5},
        "ppo": {"minutes": 1.5},
        "data": {"max_eval_tasks": 8},
        # The teacher plays the paper's prompted teacher: it drops a finished objective's
        # answer from its <IS> 60% of the time. SFT copies the habit; PPO on the task reward
        # unlearns it within minutes and answers more held-out questions (README, "Training").
        # The evaluation's teacher rows play without lapses.
        "teacher": {"forget_rate": 0.6},
    },
    "smoke": {
        "world": {"n_countries": 6, "n_cities": 24, "n_people": 160, "n_orgs": 32, "n_works": 64},
        "data": {"eval_objectives": (1, 2, 4), "max_eval_tasks": 4, "max_train_tasks": 64},
        "model": {
            "hidden_size": 64,
            "num_layers": 2,
            "intermediate_size": 128,
            "tokenizer_vocab": 2400,
        },
        "rollout": {
            "turns_base": 1,
            "turns_per_objective": 2,
            "gen_tokens_base": 32,
            "gen_tokens_per_objective": 8,
        },
        "sft": {
            "warm_start_minutes": 0.15,
            "warm_start_steps": 20,
            "minutes": 0.1,
            "steps": 10,
            "batch_size": 8,
            "n_teacher_tasks": 64,
        },
        "ppo": {
            "iterations": 2,
            "minutes": 1.0,
            "tasks_per_iteration": 8,
            "minibatch_size": 8,
            "micro_batch_size": 4,
            "ppo_epochs": 1,
        },
    },
    "paper": {
        "data": {"source": "hotpotqa+nq", "max_eval_tasks": 128},
        "retrieval": {"kind": "dense", "topk": 3},
        "model": {
            "name_or_path": "Qwen/Qwen2.5-7B",
            "dtype": "bfloat16",
            "attn": "flex_attention",
            "gradient_checkpointing": True,
            "seq_bucket": 128,
        },
        "rollout": {
            "gen_tokens_base": 512,
            "gen_tokens_per_objective": 64,
            "batch_size": 256,
            "backend": "auto",
            # the worker has a GPU of its own (ppo.gpus_per_worker=1 beside learner_gpus=1)
            "gpu_memory_utilization": 0.85,
        },
        "ppo": {
            "actor_lr": 1e-6,
            "critic_lr": 1e-5,
            "kl_coef": 1e-3,
            "iterations": 1000,
            "minutes": 100000.0,
            "tasks_per_iteration": 256,
            "minibatch_size": 64,
            "micro_batch_size": 4,
            "gpus_per_worker": 1.0,
            "learner_gpus": 1.0,
            "learner_strategy": "single",
        },
    },
}


def _coerce(tp: Any, value: Any, where: str) -> Any:
    """Convert a YAML/CLI value to the annotated field type, or raise a ValueError."""
    origin = typing.get_origin(tp)
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, dict):
            raise ValueError(f"{where}: expected a mapping, got {value!r}")
        return _build(tp, value, where)
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None or (isinstance(value, str) and value.lower() in ("none", "null")):
            if type(None) in args:
                return None
        for a in args:
            if a is type(None):
                continue
            try:
                return _coerce(a, value, where)
            except ValueError:
                pass
        raise ValueError(f"{where}: cannot read {value!r} as {tp}")
    if origin is tuple:
        (inner, *_rest) = typing.get_args(tp)
        if isinstance(value, str):
            value = [v for v in value.replace("[", "").replace("]", "").split(",") if v.strip()]
        return tuple(_coerce(inner, v, where) for v in value)
    if tp is bool:
        if isinstance(value, str):
            if value.lower() in ("true", "1", "yes"):
                return True
            if value.lower() in ("false", "0", "no"):
                return False
            raise ValueError(f"{where}: expected true/false, got {value!r}")
        return bool(value)
    if tp in (int, float, str):
        try:
            if tp is int and isinstance(value, float) and not value.is_integer():
                raise ValueError
            return tp(value)
        except (TypeError, ValueError):
            raise ValueError(f"{where}: expected {tp.__name__}, got {value!r}") from None
    return value


def _build(cls: type, values: dict[str, Any], where: str = "") -> Any:
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = set(values) - names
    if unknown:
        raise ValueError(
            f"unknown config field(s) {sorted(unknown)} in {where or 'config'}; "
            f"known: {sorted(names)}"
        )
    kwargs = {k: _coerce(hints[k], v, f"{where}.{k}".lstrip(".")) for k, v in values.items()}
    return cls(**kwargs)


def _merge(base: dict, extra: dict) -> dict:
    out = dict(base)
    for k, v in extra.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def parse_overrides(overrides: list[str] | tuple[str, ...]) -> dict[str, Any]:
    """`["train.lr=1e-3", "world.seed=3"]` -> nested dict (values parsed as YAML scalars)."""
    out: dict[str, Any] = {}
    for item in overrides:
        if "=" not in item:
            raise ValueError(f"override {item!r}: write section.field=value")
        key, raw = item.split("=", 1)
        node = out
        *parents, leaf = key.strip().split(".")
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = yaml.safe_load(raw) if raw.strip() else ""
    return out


def load_config(
    profile: str = "tiny",
    path: str | Path | None = None,
    overrides: list[str] | tuple[str, ...] | dict[str, Any] = (),
) -> Config:
    """Profile defaults, then the YAML file at `path`, then `overrides`."""
    if profile not in PROFILES:
        raise ValueError(f"unknown profile {profile!r}; choose one of {sorted(PROFILES)}")
    values: dict[str, Any] = _merge({"profile": profile}, PROFILES[profile])
    if path is not None:
        loaded = yaml.safe_load(Path(path).read_text()) or {}
        if not isinstance(loaded, dict):
            raise ValueError(f"{path}: the config file must be a mapping of sections")
        loaded.pop("profile", None)
        values = _merge(values, loaded)
    extra = overrides if isinstance(overrides, dict) else parse_overrides(overrides)
    return _build(Config, _merge(values, extra))


def config_json(cfg: Any) -> str:
    return json.dumps(dataclasses.asdict(cfg), sort_keys=True)
