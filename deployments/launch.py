"""`./dev train-eval` and `./dev experiment`: run the main job (`mem1/train-eval`) or the paper's
experiment (`mem1/experiment`, `--experiment NAME`) through Prefect, the way a cluster user would.

Against the server at PREFECT_API_URL (`./dev` starts one if none answers): create the
process work pool if missing, deploy everything in deployments/prefect.yaml, start a worker
as a child in its own session, run the deployment, follow its state and logs until it ends,
then print the headline table (an experiment's claims table), the run directory and the UI
address. On exit, Ctrl-C or SIGTERM the flow run is cancelled if still going, and the worker and
every process under it (flow runs start in sessions of their own) are stopped.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any
from uuid import UUID

import httpx

from deployments.follow import cancel, follow, force_cancelled, headline_table, say
from deployments.processes import stop_process_tree

ROOT = Path(__file__).resolve().parents[1]
PREFECT_FILE = ROOT / "deployments" / "prefect.yaml"
POOL = "mem1-process"
DEPLOYMENT = "mem1/train-eval"
EXPERIMENT_DEPLOYMENT = "mem1/experiment"
SERVER_STOPS_ENV = "MEM1_SERVER_STOPS_ON_EXIT"
"""Set to 1 by `./dev train-eval` when the Prefect server it started stops with it."""


def prefect_exe() -> str:
    """The `prefect` CLI of this interpreter's environment (the venv), else the PATH's."""
    beside = Path(sys.executable).with_name("prefect")
    return str(beside) if beside.exists() else "prefect"


def ui_url(api: str) -> str:
    return os.environ.get("PREFECT_UI_URL") or api.rstrip("/").removesuffix("/api")


def server_answers(api: str, timeout: float = 2.0) -> bool:
    try:
        return httpx.get(f"{api.rstrip('/')}/health", timeout=timeout).status_code == 200
    except httpx.HTTPError:
        return False


# ---- pool, deployments, worker ------------------------------------------------------------


def ensure_pool(name: str = POOL) -> bool:
    """Create the process work pool `name` unless it exists; True if created."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import WorkPoolCreate
    from prefect.exceptions import ObjectNotFound
    from prefect.workers.process import ProcessWorker

    with get_client(sync_client=True) as client:
        try:
            client.read_work_pool(name)
            return False
        except ObjectNotFound:
            client.create_work_pool(
                WorkPoolCreate(
                    name=name,
                    type="process",
                    base_job_template=ProcessWorker.get_default_base_job_template(),
                )
            )
            return True


def deploy(prefect_file: Path = PREFECT_FILE, root: Path = ROOT) -> None:
    """`prefect deploy --all` from `prefect_file`, run from the repository root."""
    env = {**os.environ, "MEM1_ROOT": str(root)}
    cmd = [prefect_exe(), "deploy", "--all", "--prefect-file", str(prefect_file), "--no-prompt"]
    done = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(
            f"`{' '.join(cmd)}` failed ({done.returncode}):\n{done.stdout}\n{done.stderr}"
        )


def _dies_with(parent: int):
    """A `preexec_fn` (Linux): the child gets SIGKILL when the thread that started it ends, so a
    worker never outlives a launcher killed by SIGKILL. One that did kept polling the pool on
    the server's address, and took the flow runs of the next server started there, with its
    own checkout's code. SIGKILL, not SIGTERM: on SIGTERM Prefect's worker shuts down
    gracefully, and beside a full test run that shutdown had not ended after two minutes
    ("Received SIGTERM" in its log, never "stopped"). A launcher that ends normally has
    stopped its worker in order before (its handlers). Elsewhere: None (no such call)."""
    if not sys.platform.startswith("linux"):
        return None
    import ctypes

    prctl = ctypes.CDLL(None, use_errno=True).prctl  # resolved here, not in the forked child
    pr_set_pdeathsig = 1

    def preexec() -> None:
        prctl(pr_set_pdeathsig, signal.SIGKILL)
        if os.getppid() != parent:  # the launcher died before the call: nothing will tell us
            os._exit(1)

    return preexec


def start_worker(log_path: Path, pool: str = POOL, root: Path = ROOT) -> subprocess.Popen:
    """A process worker for `pool`, in its own session (so a terminal's Ctrl-C reaches this
    launcher, which stops it in order), its output in `log_path`; it ends when the launcher's
    thread that started it does, however that ends (`_dies_with`)."""
    env = {**os.environ, "MEM1_ROOT": str(root)}
    # The default 10 s poll would add up to 10 s before the run starts.
    env.setdefault("PREFECT_WORKER_QUERY_SECONDS", "2")
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as log:
        return subprocess.Popen(
            [
                prefect_exe(),
                "worker",
                "start",
                "--pool",
                pool,
                "--type",
                "process",
                "--name",
                f"mem1-launch-{os.getpid()}",
            ],
            cwd=root,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            preexec_fn=_dies_with(os.getpid()),
        )


# ---- main ---------------------------------------------------------------------------------


def _shell_param(key: str, value: Any) -> str:
    return shlex.quote(f"{key}={value if isinstance(value, str) else json.dumps(value)}")


def _interrupt(signum: int, _frame: Any) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="./dev train-eval",
        description=__doc__.splitlines()[0],
        epilog="./dev train-eval also takes --keep-server: leave the Prefect server running.",
    )
    p.add_argument("--profile", default="tiny", help="config profile (tiny, smoke, smol, paper)")
    p.add_argument(
        "--experiment",
        help="run the experiment deployment (mem1/experiment) with this experiment "
        "(a name under data/experiments/, or a YAML file) instead of mem1/train-eval",
    )
    p.add_argument(
        "--reuse", help="(--experiment) a finished run whose warm start and arms are linked"
    )
    p.add_argument("--seeds", help="(--experiment) only what these training seeds need: K[,K...]")
    p.add_argument("--part", help="(--experiment) only the arms of this part (the file's `parts:`)")
    p.add_argument("--config", dest="config_path", help="YAML config file on top of the profile")
    p.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="SECTION.FIELD=VALUE",
        help="config override (repeatable)",
    )
    p.add_argument("--runs-root", default=str(ROOT / "runs"), help="where run directories go")
    p.add_argument("--run-name", help="run directory name (default: a timestamp)")
    p.add_argument("--timeout", type=float, default=0, help="give up after this many seconds")
    p.add_argument("--no-deploy", action="store_true", help="reuse the deployments on the server")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    api = os.environ.get("PREFECT_API_URL", "")
    if not api or not server_answers(api):
        say(
            f"no Prefect server answers at PREFECT_API_URL={api!r}; run `./dev train-eval`, "
            "which starts one"
        )
        return 2
    from prefect.deployments import run_deployment

    from flows.pipeline import default_run_name

    if args.experiment:
        run_name = args.run_name or f"{Path(args.experiment).stem}-{default_run_name()}"
    else:
        run_name = args.run_name or default_run_name()
    run_dir = Path(args.runs_root).expanduser().resolve() / run_name
    deployment = EXPERIMENT_DEPLOYMENT if args.experiment else DEPLOYMENT
    params = {"overrides": args.overrides, "runs_root": str(run_dir.parent), "run_name": run_name}
    if args.experiment:
        from mem1_core.experiment.parse import load_experiment
        from mem1_core.experiment.parts import parse_seeds, select_overrides

        try:  # a bad part fails here, in one line, before anything is deployed
            seeds = parse_seeds(args.seeds) if args.seeds else None
            load_experiment(args.experiment, [*args.overrides, *select_overrides(seeds, args.part)])
        except (ValueError, FileNotFoundError) as e:
            say(str(e))
            return 2
        params = {"experiment": args.experiment, **params, "reuse": args.reuse, "seeds": seeds,
                  "part": args.part}  # fmt: skip
    elif args.seeds or args.part:
        say("--seeds and --part select a part of an experiment: give --experiment NAME")
        return 2
    else:
        params = {"profile": args.profile, "config_path": args.config_path, **params}
    # Explicit handlers: a launcher started in the background inherits SIGINT ignored, and a
    # closed terminal (SIGHUP) or `kill` (SIGTERM) must clean up like Ctrl-C.
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _interrupt)
    worker: subprocess.Popen | None = None
    flow_run_id: UUID | None = None
    finished = False
    rc = 1
    try:
        if ensure_pool():
            say(f"created work pool {POOL} (process)")
        # The worker boots (~10 s) while the deployments are created.
        worker = start_worker(run_dir / "logs" / "worker.log")
        say(f"worker started (pid {worker.pid}, log {run_dir / 'logs' / 'worker.log'})")
        if not args.no_deploy:
            t0 = time.perf_counter()
            deploy()
            say(f"deployed {PREFECT_FILE.relative_to(ROOT)} in {time.perf_counter() - t0:.0f} s")
        if args.experiment and (run_dir / "experiment.json").is_file():
            say(f"{run_dir} exists: resuming it (finished stages are skipped)")
        run = run_deployment(
            deployment, parameters=params, flow_run_name=run_name, timeout=0, as_subflow=False
        )
        flow_run_id = run.id
        say(f"flow run {run.name}: {ui_url(api)}/runs/flow-run/{run.id}")
        say(
            f"(the same as: prefect deployment run {deployment} "
            + " ".join(f"--param {_shell_param(k, v)}" for k, v in params.items() if v)
            + ")"
        )
        final = follow(run.id, args.timeout or None, progress=run_dir / "progress.json")
        finished = True
        summary_path = run_dir / "summary.json"
        claims = run_dir / "eval" / "headline.md"
        if args.experiment and claims.exists():
            print(claims.read_text().split("\n## World")[0])
            print(f"(agents x N per world, the plots: {claims})")
        elif summary_path.exists():
            print(headline_table(json.loads(summary_path.read_text())))
        rc = 0 if final.state.is_completed() else 1
        if rc:
            say(f"flow run ended {final.state.name}: {final.state.message or ''}")
    except KeyboardInterrupt:
        say("interrupted: stopping the flow run and the worker")
        rc = 130
    except TimeoutError as e:
        say(f"{e}: stopping it")
        rc = 124
    except RuntimeError as e:
        say(str(e))
        rc = 1
    finally:
        # A second Ctrl-C must not cut the clean-up short and leave processes behind.
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, signal.SIG_IGN)
        if flow_run_id is not None and not finished:
            cancel(flow_run_id, worker)
            if args.experiment:
                say(f"to resume: the same command with --run-name {run_name}")
        if worker is not None:
            stop_process_tree(worker)
            say("worker stopped")
        if flow_run_id is not None and not finished:
            force_cancelled(flow_run_id)
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, signal.SIG_DFL)
    print(f"run directory: {run_dir}")
    this_run = f"{ui_url(api)}/runs/flow-run/{flow_run_id}" if flow_run_id else ui_url(api)
    if os.environ.get(SERVER_STOPS_ENV) == "1":
        # `./dev train-eval` stops the server it started when this returns: no dead link
        print(
            "Prefect UI:    the server stops with this command; `./dev server` brings it back "
            f"on the same history, then open {this_run}"
        )
    else:
        print(f"Prefect UI:    {this_run}")
    return rc


if __name__ == "__main__":
    sys.exit(main())
