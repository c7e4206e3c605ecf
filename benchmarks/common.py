"""What the benchmarks share: a free port, the servers they start and wait for (a Prefect
server, `mem1 serve-retriever`) and synthetic trajectories of token ids.

Run a benchmark as a module from the checkout (`python -m benchmarks.faults`) or as a file
(`python benchmarks/gpu_check.py`); either way it imports this as `benchmarks.common`.
"""

from __future__ import annotations

import os
import random
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from mem1_core.trajectory.tree import Segment

ROOT = Path(__file__).resolve().parents[1]
"""The checkout: benchmarks start their children here, with it on PYTHONPATH."""

Paths = list[list[Segment]]
"""One trajectory: each turn's context segments, the last one that turn's generation."""


# ---- processes and ports ---------------------------------------------------------------------


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now (the OS picks it)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_until(
    what: str, check: Callable[[], Any], timeout: float, proc: subprocess.Popen | None = None
) -> Any:
    """Poll `check` until it returns something true (returned); raise RuntimeError if `proc`
    exits first, TimeoutError after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        if value := check():
            return value
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"waiting for {what}: the process exited ({proc.returncode})")
        if time.monotonic() > deadline:
            raise TimeoutError(f"no {what} within {timeout:.0f} s")
        time.sleep(0.05)


def answers(url: str, timeout: float = 2.0) -> bool:
    """Whether GET `url`/health answers 200."""
    import httpx

    try:
        return httpx.get(f"{url}/health", timeout=timeout).status_code == 200
    except httpx.HTTPError:
        return False


def retriever_command(index: Path, port: int, *options: str) -> list[str]:
    """`mem1 serve-retriever` over `index` on 127.0.0.1:`port`, under this Python."""
    return [sys.executable, "-m", "mem1_core.cli.main", "serve-retriever", "--index", str(index),
            "--host", "127.0.0.1", "--port", str(port), *options]  # fmt: skip


def wait_for_retriever(port: int, proc: subprocess.Popen, timeout: float = 300) -> str:
    """Wait until the retrieval server started as `proc` answers; -> its base URL."""
    url = f"http://127.0.0.1:{port}"
    wait_until("retrieval server", lambda: answers(url, timeout=1), timeout, proc)
    return url


class PrefectServer:
    """The Prefect server at PREFECT_API_URL, or one started on a free port (its own session,
    its home and log under `work`) and stopped, with its process group, on exit. Entering
    sets PREFECT_API_URL: enter before prefect is imported, which reads it once."""

    def __init__(self, work: Path, env: dict[str, str] | None = None):
        self.work, self.env, self.proc = work, env, None
        self.api = os.environ.get("PREFECT_API_URL", "")

    def __enter__(self) -> PrefectServer:
        if self.api and answers(self.api):
            return self
        port = free_port()
        self.api = f"http://127.0.0.1:{port}/api"
        home = self.work / "prefect_home"
        home.mkdir(parents=True, exist_ok=True)
        os.environ.update(PREFECT_API_URL=self.api, PREFECT_HOME=str(home))
        exe = Path(sys.executable).with_name("prefect")
        with open(self.work / "prefect_server.log", "ab") as log:
            self.proc = subprocess.Popen(
                [str(exe), "server", "start", "--host", "127.0.0.1", "--port", str(port)],
                env={**os.environ, **(self.env or {})}, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True,
            )  # fmt: skip
        try:
            wait_until("Prefect server", lambda: answers(self.api), 300, self.proc)
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        """SIGTERM the server's process group (uvicorn and its workers), SIGKILL after 30 s."""
        if self.proc is None:
            return
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
            self.proc.wait(timeout=30)
        except ProcessLookupError:
            pass
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        self.proc = None


# ---- synthetic trajectories ------------------------------------------------------------------


def window_paths(
    prompt: Sequence[int],
    gens: Sequence[Sequence[int]],
    infos: Sequence[Sequence[int]],
    window: int,
) -> Paths:
    """Turn t reads the prompt and the last `window` turns (generation, then info), and
    generates gens[t]: MEM1 is window 1 (its internal state re-read), full context all turns."""
    paths = []
    for t in range(len(gens)):
        ctx = [Segment(("prompt",), tuple(prompt), False)]
        for s in range(max(t - window, 0), t):
            ctx.append(Segment(("gen", s), tuple(gens[s]), False))
            ctx.append(Segment(("info", s), tuple(infos[s]), False))
        paths.append([*ctx, Segment(("gen", t), tuple(gens[t]), True)])
    return paths


MEMORY_WINDOWS: dict[str, Callable[[int], int]] = {
    "mem1": lambda turns: 1,
    "full": lambda turns: turns,
    "truncate": lambda turns: 2,
}
"""Memory policy -> how many past turns a context holds, given the number of turns."""


def synthetic_trajectories(
    rng: random.Random,
    memory: str,
    n: int,
    turns: int,
    lens: tuple[int, int, int],
    vocab: int,
    jitter: float = 0.25,
) -> list[Paths]:
    """n trajectories of `turns` turns under `memory` (a key of MEMORY_WINDOWS), token ids in
    [0, vocab), segment lengths (prompt, generated turn, info block) drawn uniformly in
    mean * [1 - jitter, 1 + jitter] (at least 1)."""

    def ids(mean: int) -> list[int]:
        k = rng.randint(round(mean * (1 - jitter)), round(mean * (1 + jitter)))
        return [rng.randrange(vocab) for _ in range(max(k, 1))]

    window = MEMORY_WINDOWS[memory](turns)
    out = []
    for _ in range(n):
        prompt = ids(lens[0])
        gens = [ids(lens[1]) for _ in range(turns)]
        infos = [ids(lens[2]) for _ in range(turns)]
        out.append(window_paths(prompt, gens, infos, window))
    return out


def matmul_peak(dtype=None, repeats: int = 5, sizes: Sequence[int] = (1024, 2048)) -> float:
    """GFLOP/s of the best square matmul (of each of `sizes`) in `dtype` (default float32) on
    the current torch threads: the ceiling a dense training step can reach here."""
    import torch

    dtype = dtype or torch.float32
    best = 0.0
    for n in sizes:
        a, b = torch.randn(n, n, dtype=dtype), torch.randn(n, n, dtype=dtype)
        torch.mm(a, b)
        for _ in range(repeats):
            t0 = time.perf_counter()
            torch.mm(a, b)
            best = max(best, 2 * n**3 / (time.perf_counter() - t0))
    return best / 1e9


def copy_bandwidth(mib: int = 256, repeats: int = 5) -> float:
    """GB/s of the best copy of `mib` MiB between two tensors on the current torch threads
    (bytes read plus bytes written): the ceiling of a pass that streams weights, as decoding
    does."""
    import torch

    a = torch.ones(mib * 2**18)  # float32: 4 bytes each
    b = torch.empty_like(a)
    b.copy_(a)
    best = 0.0
    for _ in range(repeats):
        t0 = time.perf_counter()
        b.copy_(a)
        best = max(best, 2 * a.numel() * 4 / (time.perf_counter() - t0))
    return best / 1e9
