"""The vllm_deployment section's driver, run under the Prefect venv's Python (no vLLM there):
PPO on the smoke profile through `train_rl` with Ray, the rollout workers under the vLLM venv.

    python -m benchmarks.gpu.deployment_driver OUT OVERRIDES_JSON
"""

from __future__ import annotations

import json
import sys

from mem1_core.config import load_config
from mem1_core.training.train_rl import train_rl
from mem1_core.training.vllm_engine import vllm_importable


def main(argv: list[str]) -> int:
    if vllm_importable():
        sys.exit("this Python imports vLLM: not the Prefect venv's")
    out, overrides = argv[0], json.loads(argv[1])
    result = train_rl(load_config("smoke", None, overrides), out, use_ray=True, show=False)
    print("RESULT", json.dumps({"iterations": result["iterations"]}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
