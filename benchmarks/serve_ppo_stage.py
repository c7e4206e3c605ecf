"""The fault benchmark's Prefect runner (benchmarks/faults/flow_cancel.py): serves the PPO
stage flow as the deployment `train-ppo-mem1/faults`, one flow run at a time, until stopped.

    python -m benchmarks.serve_ppo_stage
"""

from __future__ import annotations

DEPLOYMENT_NAME = "faults"


def main() -> None:
    from flows.stages import train_ppo

    train_ppo.serve(name=DEPLOYMENT_NAME, limit=1)


if __name__ == "__main__":
    main()
