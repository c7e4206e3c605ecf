"""The configuration sections of the data and rollout side: the world, the QA data, the
retriever, the model, the rollout and the teacher. Each is a frozen dataclass with a
docstring per field; `__post_init__` checks a section and says how to fix it."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

MEMORIES = ("mem1", "full", "truncate", "mem1+recall")
"""The memory policies (mem1_core.rollout.memory)."""


class Section:
    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)  # type: ignore[arg-type]


@dataclass(frozen=True)
class WorldConfig(Section):
    """The generated world: a procedurally generated encyclopedia (mem1_core.data.world)."""

    seed: int = 0
    """Seed for names, relations, phrasing and the split."""
    n_countries: int = 24
    """Countries in the world (each has a capital among the cities)."""
    n_cities: int = 160
    """Cities (at least one per country)."""
    n_people: int = 1600
    """People: the subjects of most questions."""
    n_orgs: int = 320
    """Organisations."""
    n_works: int = 640
    """Works (each with a kind, a creator and a year)."""
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
class DataConfig(Section):
    """Where questions come from and how they are composed into N-objective tasks."""

    source: str = "world"
    """`world` (embedded), `hotpotqa`, `nq`, or `hotpotqa+nq` (the paper's mix)."""
    hotpotqa: str = "hotpotqa/hotpot_qa"
    """The training questions: a hub dataset name (its `train` split), a local snapshot
    directory of one (same), or a local .json/.jsonl/.parquet file in HotpotQA's row format
    (e.g. `hotpot_train_v1.1.json`)."""
    hotpotqa_test: str | None = None
    """The test questions, in the same forms (a hub name or directory: its `validation`
    split). None: the `validation` split of `hotpotqa`; required when `hotpotqa` is a file,
    which has no splits."""
    hotpotqa_config: str = "distractor"
    """The hub config of HotpotQA (`distractor` or `fullwiki`) for a hub name or snapshot."""
    nq: str = "nq_open"
    """The training questions: a hub dataset name (`nq_open`; its `train` split), a local
    snapshot directory of one, or a local file in FlashRAG's row format (`train.jsonl`)."""
    nq_test: str | None = None
    """The test questions (FlashRAG's `test.jsonl`, ...). None: the `validation` split of
    `nq`; required when `nq` is a file."""
    train_objectives: int = 2
    """N of the training tasks (the paper trains on 2-objective tasks)."""
    eval_objectives: tuple[int, ...] = (1, 2, 4, 8, 16)
    """N of the test tasks the evaluation scores (the paper: 1 to 16)."""
    mode: str = "per_source"
    """`per_source` (consecutive questions of one source, as the paper) or `mixed`."""
    seed: int = 0
    """Seed of the composition (`mixed` mode's shuffle) and of each PPO iteration's draw of
    training tasks."""
    max_train_tasks: int | None = None
    """Cap on the composed training tasks (None: every question is used)."""
    max_eval_tasks: int | None = 16
    """Test tasks per N (a cap), unless `eval_objectives_per_n` is set."""
    eval_objectives_per_n: int | None = None
    """Objectives to evaluate at each N: ceil(this / N) test tasks per N (128 gives a standard
    error of at most 0.044 on an EM fraction: 128 tasks at N=1, 8 at N=16). None: max_eval_tasks."""

    def eval_tasks(self, n: int) -> int | None:
        """How many test tasks to compose and evaluate at N=n (None: all)."""
        if self.eval_objectives_per_n is not None:
            return -(-self.eval_objectives_per_n // n)
        return self.max_eval_tasks

    def __post_init__(self) -> None:
        if self.source not in ("world", "hotpotqa", "nq", "hotpotqa+nq"):
            raise ValueError(f"data.source={self.source!r}: use world, hotpotqa, nq or hotpotqa+nq")
        if self.mode not in ("per_source", "mixed"):
            raise ValueError(f"data.mode={self.mode!r}: use per_source or mixed")
        if self.train_objectives < 1 or any(n < 1 for n in self.eval_objectives):
            raise ValueError("objective counts must be >= 1")
        for name in ("hotpotqa", "nq"):
            # a file has no splits: the test tasks would be composed from training questions
            if name in self.source and is_row_file(getattr(self, name)):
                if getattr(self, f"{name}_test") is None:
                    raise ValueError(
                        f"data.{name}={getattr(self, name)!r} is a file of training questions: "
                        f"set data.{name}_test to the held-out file (docs/paper-profile.md)"
                    )

    def question_source(self, dataset: str, split: str) -> tuple[str, str]:
        """Where the questions of `dataset` (`hotpotqa` or `nq`) for the run's `split`
        (`train` or `test`) come from: (source, the hub split to read there)."""
        if split == "train":
            return getattr(self, dataset), "train"
        return getattr(self, f"{dataset}_test") or getattr(self, dataset), "validation"


ROW_FILE_SUFFIXES = (".json", ".jsonl", ".parquet")


def is_row_file(source: str) -> bool:
    """Whether a question source names a file of rows (read whole, without splits: the
    loaders of mem1_core.data.qa_data), not a hub dataset or a snapshot directory of one
    (read by config and split)."""
    path = Path(source)
    return path.suffix in ROW_FILE_SUFFIXES or path.is_file()


@dataclass(frozen=True)
class RetrievalConfig(Section):
    """The retriever that answers `<query>`."""

    kind: str = "bm25"
    """`bm25` (embedded default) or `dense` (e5 + FAISS, the paper)."""
    topk: int = 3
    """Passages returned per query as one `<info>` block."""
    encoder: str = "intfloat/e5-base-v2"
    """The dense index's encoder when the run builds one (a hub name or a local directory);
    a prebuilt index uses the encoder its manifest names."""
    corpus: str | None = None
    """Corpus path for non-world sources (Search-R1 JSONL or corpus Parquet); the run builds
    an index of it once (under its `indexes/`, reused by fingerprint)."""
    index: str | None = None
    """A prebuilt index directory (`mem1 index --out DIR`, e.g. a dense one built on GPUs):
    used as it is, never rebuilt, and `corpus` is not read (the index holds its documents).
    Its manifest's kind must be `kind`."""
    url: str | None = None
    """If set, talk to a retrieval server at this URL instead of an in-process index (no
    index is built or loaded)."""
    outage_seconds: float = 60.0
    """With `url`: how long a server that stopped answering is retried (backoff up to 2 s)
    before the run stops with RetrieverUnavailable (`--resume` continues it). Long enough
    for a server to be restarted; a rollout waits meanwhile."""
    web_endpoint: str = "https://google.serper.dev/search"
    """With `env.kind: websearch` (the web-search QA domain, mem1_core.websearch; docs/data.md):
    the search API's URL, in Serper's JSON shape (POST `{"q", "num"}`, answers `organic`)."""
    web_api_key_env: str = "SERPER_API_KEY"
    """With `env.kind: websearch`: the environment variable holding the API key (read at the first
    request; a rerun served from the cache needs none)."""
    web_requests_per_second: float = 5.0
    """With `env.kind: websearch`: the most requests started per second (all threads together)."""
    web_timeout_seconds: float = 10.0
    """With `env.kind: websearch`: the timeout of each request (connect, and each read)."""
    web_retries: int = 4
    """With `env.kind: websearch`: retries of a request that timed out, could not connect, or got a
    429 or 5xx, with exponential backoff from 0.5 s (capped at 8 s); then the run stops."""
    web_concurrency: int = 4
    """With `env.kind: websearch`: requests in flight at once (within the rate limit)."""
    web_cache: str | None = None
    """With `env.kind: websearch`: the directory of the on-disk answer cache, keyed by (endpoint,
    query, k); None: `web_cache/` under the run directory. A rerun asks the API nothing."""
    web_offline: bool = False
    """With `env.kind: websearch`: answer only from `web_cache`; a query it lacks is an error."""

    def __post_init__(self) -> None:
        if self.kind not in ("bm25", "dense"):
            raise ValueError(f"retrieval.kind={self.kind!r}: use bm25 or dense")
        if self.topk < 1:
            raise ValueError("retrieval.topk must be >= 1")
        if self.outage_seconds < 0:
            raise ValueError("retrieval.outage_seconds must be >= 0 (0: only a few retries)")
        if self.web_requests_per_second <= 0 or self.web_timeout_seconds <= 0:
            raise ValueError(
                "retrieval.web_requests_per_second and web_timeout_seconds must be > 0"
            )
        if self.web_retries < 0 or self.web_concurrency < 1:
            raise ValueError("retrieval.web_retries must be >= 0 and web_concurrency >= 1")


@dataclass(frozen=True)
class ModelConfig(Section):
    """The policy model and its tokenizer."""

    name_or_path: str | None = None
    """A hub name or local path (the `paper` profile); None builds the tiny model from config."""
    base: str | None = None
    """The embedded default's pretrained base (`data/base`, built by `mem1 pretrain`): the
    starting point of every stage and the tokenizer of every run. None: start from random
    weights with a tokenizer trained on the run's world (the pre-base behaviour)."""
    tokenizer_vocab: int = 3000
    """Vocabulary of the locally trained tiny tokenizer."""
    hidden_size: int = 128
    """The tiny model built from config (no `name_or_path`, no `base`): hidden width."""
    num_layers: int = 3
    """The tiny model: decoder layers."""
    num_heads: int = 4
    """The tiny model: attention heads (a divisor of hidden_size)."""
    num_kv_heads: int = 2
    """The tiny model: key/value heads (grouped-query attention; a divisor of num_heads)."""
    intermediate_size: int = 384
    """The tiny model: width of the MLP."""
    max_positions: int = 4096
    """The tiny model: longest position it can encode."""
    dtype: str = "float32"
    """The weights' dtype: `float32` on CPU; `bfloat16` on GPU."""
    autocast: str | None = None
    """Compute in this dtype under torch.autocast over the weights in `dtype`: generation (the
    HF backend), SFT and the PPO learner. `auto` (the `smol` profile's): bfloat16 where this
    machine computes it natively (a CPU with AVX512-BF16 or AMX, where SmolLM2 generates 2.5x
    and trains 2.8x faster than in float32; a GPU with bf16), float32 elsewhere (on an
    AVX2-only CPU bf16 runs ~200x slower); decided once per process by a probe matmul and
    logged (mem1_core.models.compute; `mem1 config show` says what it resolves to here).
    `bfloat16` forces it (with a warning where it is emulated). None: compute in `dtype`."""
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
    """Seed of the model's initial weights, the rollouts' sampling and the minibatch shuffles."""

    @property
    def seq_bucket_tokens(self) -> int:
        """The bucket the learner pads to: `seq_bucket`, or its default under `attn` (derived
        here, not written back into the frozen field)."""
        if self.seq_bucket is not None:
            return self.seq_bucket
        return 128 if self.attn == "flex_attention" else 1

    def __post_init__(self) -> None:
        if self.hidden_size % self.num_heads or self.num_heads % self.num_kv_heads:
            raise ValueError("hidden_size must divide by num_heads, num_heads by num_kv_heads")
        if self.attn not in ("sdpa", "eager", "flex_attention"):
            raise ValueError(f"model.attn={self.attn!r}: use sdpa, eager or flex_attention")
        if self.dtype not in ("float32", "bfloat16", "float16"):
            raise ValueError(f"model.dtype={self.dtype!r}: use float32, bfloat16 or float16")
        if self.autocast not in (None, "auto", "bfloat16", "float16"):
            raise ValueError(
                f"model.autocast={self.autocast!r}: use auto, bfloat16, float16 or null"
            )
        if self.base is not None and self.name_or_path is not None:
            raise ValueError(
                "model.base (the embedded tiny base) and model.name_or_path (a hub model) "
                "both set: keep one (--set model.base=null for a hub model)"
            )
        if self.seq_bucket is not None and self.seq_bucket < 1:
            raise ValueError(f"model.seq_bucket={self.seq_bucket}: use an int >= 1 (1: none)")


@dataclass(frozen=True)
class RolloutConfig(Section):
    """Multi-turn rollout: memory policy, turn and token budgets, sampling."""

    memory: str = "mem1"
    """Memory policy: `mem1`, `full`, `truncate` or `mem1+recall` (MEM1 with recall of pruned
    `<info>` blocks, mem1_core.rollout.recall)."""
    chat_template: bool = False
    """Wrap the task prompt in the tokenizer's chat template (the prompt as the user's message,
    the assistant's turn opened; turns and `<info>` blocks continue that message). For an
    instruction-tuned model (the `smol` profile); a raw prompt is continued as plain text
    (SmolLM2 then writes more questions). Needs a tokenizer with a template."""
    truncate_turns: int = 2
    """`truncate`: how many of the last turns stay in context."""
    keep_answers_prompt: bool = False
    """Beyond the paper: the task instructions ask the `<IS>` to keep every answer found so far
    (data.prompts.KEEP_ANSWERS_INSTRUCTIONS), a lever against forgetting found answers on tasks
    longer than the training N. False: the paper's instructions."""
    progress_hint: bool = False
    """Beyond the paper: the hint in every `<info>` also says how many questions the task has
    and how many still have no answer in any `<info>` the trajectory has received (a gold
    answer, normalised, as a whole phrase of the results): an oracle count of what is left,
    a lever against answering before every question was searched. It uses the gold answers,
    so an agent under it is measured with help the paper's agents do not get. False: the
    paper's turns-left hint."""
    turns_base: int = 2
    """See turns_per_objective."""
    turns_per_objective: int = 2
    """The turn budget is turns_base + turns_per_objective * N (6 turns at N=2, as the paper)."""
    gen_tokens_base: int = 48
    """See gen_tokens_per_objective."""
    gen_tokens_per_objective: int = 12
    """Tokens one turn may generate: base + per_objective * N (the <IS> grows with N)."""
    temperature: float = 1.0
    """Sampling temperature for training rollouts (evaluation is greedy)."""
    top_p: float = 1.0
    """Nucleus sampling for training rollouts (1.0: off)."""
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
        if self.memory not in MEMORIES:
            raise ValueError(f"rollout.memory={self.memory!r}: use one of {', '.join(MEMORIES)}")
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

    def max_generated_tokens(self, n_objectives: int) -> int:
        """The most tokens one trajectory can generate: every turn at its token budget."""
        return self.max_turns(n_objectives) * self.max_new_tokens(n_objectives)


@dataclass(frozen=True)
class TeacherConfig(Section):
    """The scripted teacher that plays the paper's GPT-4o role on the task world."""

    error_rate: float = 0.0
    """Chance that the teacher answers an objective wrongly on purpose."""
    forget_rate: float = 0.0
    """Chance that the teacher, moving on from a finished objective, writes `?` for its answer
    in the `<IS>` (a memory-consolidation lapse; mem1_core.qa.teacher). SFT copies the habit; RL
    on the task reward can unlearn it (MEM1 §5.4)."""
    counting: bool = False
    """The state counts: `Next: Q3 of 8.` while questions remain and `Done: 8 of
    8.` before the answer, the N copied from the prompt's last line. Off: `Next: Q3.` and no
    count, the format every shipped model learned. What it is for: a model shown N <= 2 that
    learns "answer after two" stops early at N = 8; a count in the state makes the stopping
    rule an equality it reads ("2 of 2"), the same at every N."""
    slots: bool = False
    """The state lists every question from the first turn: `Q3: pending.` until
    its first lookup, then what was found, as before. Off: the state lists only what was
    found. What it is for: without it, "Q1: a. Q2: b." at N = 8 reads as a finished N = 2
    state, and a model shown N <= 2 answers there; with it the stopping rule is "no question
    pending", the same check at every N, with no count to keep. Measured with SmolLM2: no
    better than the plain state; the warm start writes as many slots as it was
    trained on, not as many as the prompt has questions."""
    seed: int = 0
    """Seed of the teacher's scripted lapses (`error_rate`, `forget_rate`)."""

    def __post_init__(self) -> None:
        for name in ("error_rate", "forget_rate"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"teacher.{name} must be in [0, 1]")
