"""The rollout worker: a generation backend (`rollout.backend`: Hugging Face with a KV cache,
or a vLLM engine), the QA environment and a retriever client (a handle to the shared
retriever actor, an HTTP server, or its own in-process index); it rolls out a share of each
iteration's tasks with the latest weights the learner sent. An actor whose GPU request is
> 0 puts its model on CUDA (when CUDA is there) in `model.dtype`; rollout workers generate
with sdpa even when the learner trains with FlexAttention (`model.attn`).

Each weight sync carries a version (mem1_core.training.runtime), and a worker refuses to roll
out with weights other than the ones the driver expects (`WeightsOutOfDate`): a worker Ray
restarted between two calls holds its initial policy and would otherwise sample from it
silently.

A worker may run under another Python than the driver's (the vLLM venv's, when the driver
cannot import vLLM: mem1_core.runs.rollout_python); `describe` says which, and with what.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import torch

from mem1_core.config import Config
from mem1_core.domains.inputs import ensure_tokenizer, make_env
from mem1_core.models.policy import load_policy
from mem1_core.rollout.generation import HFBackend
from mem1_core.rollout.loop import Task, rollout
from mem1_core.runs.layout import RunPaths
from mem1_core.training.actor_pool import drop_state
from mem1_core.training.ray_start import actor_device, set_threads
from mem1_core.training.vllm_engine import choose_backend, require_vllm, vllm_backend
from mem1_core.trajectory.logprobs import Attn, use_attention
from mem1_core.trajectory.record import Trajectory


class WeightsOutOfDate(RuntimeError):
    """A rollout worker holds other weights than the driver last sent (it restarted)."""


class RolloutWorker:
    """Generates trajectories with the latest weights the learner sent."""

    def __init__(
        self,
        cfg: Config,
        run_root: str,
        init: str | None = None,
        retriever: Any = None,
        threads: int | None = None,
        backend: str | None = None,
    ):
        """`backend`: hf or vllm, as the driver chose it for every worker (default:
        vllm_engine.choose_backend for a worker in the driver's process)."""
        set_threads(threads)
        self.backend_name = backend or choose_backend(cfg, use_ray=False)
        require_vllm(self.backend_name)
        paths = RunPaths(Path(run_root))
        self.cfg = cfg
        self.device = actor_device(cfg.resources.gpus_per_worker)
        tok = ensure_tokenizer(cfg, paths)
        init_dir = None if init is None else Path(init)
        if self.backend_name == "vllm":
            cuda = self.device.type == "cuda"
            self.backend = vllm_backend(cfg, paths, tok, init_dir, cuda)
        else:
            model = load_policy(cfg, tok, init_dir, self.device)
            # FlexAttention is the learner's tree path; Hugging Face generation (a KV cache
            # and a growing length every step) runs sdpa, which computes the same function.
            use_attention(model, Attn.SDPA if cfg.model.attn == Attn.FLEX else None)
            self.backend = HFBackend(
                model, tok.pad_token_id, tok.eos_token_id, cfg.rollout.batch_size, tokenizer=tok
            )
        if retriever is not None:
            from mem1_core.retrieval.ray_actor import RayRetriever

            retriever = RayRetriever(retriever)
        self.env = make_env(cfg, paths, tok, retriever)  # None: the domain's own
        self.weights_version: int | None = None
        """The version of the last weights loaded; None: the initial policy."""

    def reset(self, *args: Any) -> None:
        """Become a fresh worker for another run, in this process (mem1_core.training.actor_pool)."""
        drop_state(self)
        self.__init__(*args)

    def describe(self) -> dict[str, str | None]:
        """What this worker generates with: `rollout_backend` (hf or vllm), `vllm_version`
        (None for hf) and `rollout_python`, the interpreter it runs under (metrics.jsonl
        records them every iteration)."""
        vllm = sys.modules.get("vllm") if self.backend_name == "vllm" else None
        return {
            "rollout_backend": self.backend_name,
            "vllm_version": getattr(vllm, "__version__", None),
            "rollout_python": sys.executable,
        }

    def pid(self) -> int:
        """This worker's process id: an answer means the (restarted) process is up."""
        return os.getpid()

    def load_weights(self, state: dict[str, torch.Tensor], version: int | None = None) -> None:
        self.backend.load_state_dict(state)
        self.weights_version = version

    def get_weights(self) -> dict[str, torch.Tensor]:
        if not isinstance(self.backend, HFBackend):
            raise NotImplementedError(
                "a vLLM worker holds the weights in vLLM's fused layout (qkv_proj, "
                "gate_up_proj), not as Hugging Face names; the learner's get_weights has them"
            )
        return {k: v.detach().cpu() for k, v in self.backend.model.state_dict().items()}

    def rollout(
        self,
        tasks: list[Task],
        seed: int,
        *,
        greedy: bool = False,
        samples_per_task: int = 1,
        group_offset: int = 0,
        weights_version: int | None = None,
    ) -> list[Trajectory]:
        """Roll `tasks` out; GRPO groups are numbered from `group_offset` (unique per run
        of tasks across workers). `weights_version`: the weights the driver expects this
        worker to hold (None: any)."""
        if weights_version is not None and weights_version != self.weights_version:
            raise WeightsOutOfDate(
                f"worker pid {os.getpid()} holds weights version {self.weights_version}, "
                f"the driver sent {weights_version}"
            )
        gen = torch.Generator(device=self.device).manual_seed(seed)
        trajs = rollout(
            tasks,
            self.backend,
            self.env,
            self.cfg.rollout,
            greedy=greedy,
            samples_per_task=samples_per_task,
            generator=gen,
        )
        for t in trajs:
            t.group += group_offset
        return trajs
