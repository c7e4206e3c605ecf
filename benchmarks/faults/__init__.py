"""Faults a long run meets, each injected into a real short run; one JSON line per fault.

    .venv/bin/python -m benchmarks.faults [--only FAULT ...] [--work DIR] [--init POLICY]

Every fault runs `mem1 train ppo --profile smoke` through Ray (ITERATIONS iterations of 4
tasks, a checkpoint after each) in a child process, from a warm start that queries the
retriever (2 minutes of SFT, trained once into --work unless --init names one), and
injects its fault at a moment it watches for (a process title, a file):

  worker_kill          SIGKILL of the rollout worker's process during its rollout
  learner_kill         SIGKILL of the learner's process during its update
  retriever_restart    the HTTP retrieval server (`mem1 serve-retriever`) SIGKILLed during a
                       rollout and started again OUTAGE_S later
  retriever_down       the same server killed and left down past retrieval.outage_seconds
  checkpoint_truncated the newest checkpoint's weights cut short on disk, then --resume
  checkpoint_bitflip   one byte of the newest checkpoint's optimiser state flipped, then --resume
  disk_full            the run directory on a small tmpfs (needs root), filled after its
                       first checkpoint (the run paused meanwhile) to half a checkpoint's
                       room, so that its next checkpoint or Parquet write fails; freed, --resume
  flow_cancel          the `train-ppo` flow, served by a Prefect runner, cancelled through the
                       API during PPO; every process it started must stop; rerun with resume
  launcher_sigterm     SIGTERM to `deployments/launch.py` running the smoke pipeline
                       (mem1/train-eval) during its PPO stage; every process gone; relaunched

A fault the run survives in-process must leave it completing on its own; one it cannot
survive must stop it with exit code 1 and a one-line `error: ...`, after which
`--resume` (or the rerun) completes it. Either way the final run must hold every
iteration exactly once: `lost_iterations` and `duplicated_iterations` count the
iterations missing from, or repeated in, metrics.jsonl and trajectories/.
`seconds_to_recover`: from the fault until the run had again finished the iteration it
was in (through the resume, where there is one). The Prefect faults need a server:
PREFECT_API_URL, or one this script starts on a free port and stops.

Stopped by SIGTERM, SIGINT (Ctrl-C) or SIGHUP, the script stops every process it started
(training runs, servers, runners, the launcher) and unmounts its tmpfs, then exits 130.

One module per kind of fault, each fault a function of a `Context` (harness.py) that returns
its JSON line: actors.py (worker_kill, learner_kill), retriever.py (retriever_restart,
retriever_down), checkpoint.py (checkpoint_truncated, checkpoint_bitflip), disk_full.py,
flow_cancel.py, launcher.py (launcher_sigterm). run.py holds what they share: one training
run in a child process, the clock from a fault to its recovery, a fault's line. __main__.py is
the entry point and the registry of faults (`FAULTS`).
"""
