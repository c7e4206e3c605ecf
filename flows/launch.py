"""`./dev train-eval`: run the main job against the local Prefect server.

The full `mem1/train-eval` deployment (train → evaluate) is not built yet; until it is,
this runs the stages that exist, as real flow runs on the server, and says so.
"""

from __future__ import annotations

import argparse
import os
import sys


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="./dev train-eval")
    p.add_argument("--profile", default="tiny")
    p.add_argument("--runs-root", default="runs")
    args = p.parse_args(argv)
    from flows.data import compose_tasks

    print("note: the training and evaluation stages are not built yet; running the stages that "
          "exist: compose-tasks", file=sys.stderr)
    result = compose_tasks(profile=args.profile, runs_root=args.runs_root)
    print(f"tasks written under {result['dir']}")
    api = os.environ.get("PREFECT_API_URL", "")
    if api:
        print(f"Prefect UI: {api.removesuffix('/api')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
