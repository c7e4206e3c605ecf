"""Process trees: find every process under a pid and stop them all, each in its process group
(a Prefect worker starts each flow run in a session of its own). Used by the launcher
(deployments/launch.py), the fault benchmark and the tests."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

STOP_GRACE_SECONDS = 10.0


def descendants(pid: int) -> list[int]:
    """Every live process under `pid` (children, grandchildren, …), from `ps`."""
    out = subprocess.run(["ps", "-A", "-o", "pid=,ppid="], capture_output=True, text=True).stdout
    children: dict[int, list[int]] = {}
    for line in out.splitlines():
        child, parent = (int(x) for x in line.split())
        children.setdefault(parent, []).append(child)
    found, stack = [], [pid]
    while stack:
        for c in children.get(stack.pop(), []):
            found.append(c)
            stack.append(c)
    return found


def alive(pid: int) -> bool:
    """Whether `pid` is a process that has not exited."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie has exited; it only waits for its parent (a container's init may be slow) to
    # reap it.
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[-1].split()[0] not in "ZX"
    except OSError:
        return True


def _signal_groups(pids: list[int], sig: int) -> None:
    """Send `sig` once to each process group among `pids` (a group twice would make the
    worker CLI escalate to SIGKILL); a pid in our own group gets it alone."""
    own, groups = os.getpgrp(), set()
    for pid in pids:
        try:
            group = os.getpgid(pid)
        except ProcessLookupError:
            continue
        if group == own:
            _kill(pid, sig)
        elif group not in groups:
            groups.add(group)
            try:
                os.killpg(group, sig)
            except ProcessLookupError:
                pass


def _kill(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def stop_processes(pids: list[int], grace: float = STOP_GRACE_SECONDS) -> None:
    """SIGTERM `pids`, each in its process group, then SIGKILL what is left after `grace`.

    Read the tree before calling: a process whose parent dies is re-parented and can no
    longer be found from it."""
    _signal_groups(pids, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and any(alive(p) for p in pids):
        time.sleep(0.1)
    _signal_groups([p for p in pids if alive(p)], signal.SIGKILL)


def stop_process_tree(proc: subprocess.Popen, grace: float = STOP_GRACE_SECONDS) -> None:
    """SIGTERM `proc` and every process under it — each in its process group, since a
    worker starts each flow run in a new session — then SIGKILL what is left after `grace`.

    The tree is read before any signal: once the worker dies its orphans are re-parented
    and could no longer be found from it."""
    stop_processes([proc.pid, *descendants(proc.pid)] if proc.poll() is None else [], grace)
    proc.wait()
