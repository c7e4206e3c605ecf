"""`mem1 train sft|ppo|grpo`: train the policy into a run directory.

mem1 train ppo --profile smoke --out runs/x [--resume] [--init DIR] [--set ppo.iterations=4]
"""

from __future__ import annotations

import argparse
import json

from mem1_core.cli.commands.data import add_config_args, config_from_args
from mem1_core.config import MEMORIES

TRAINERS = {
    "ppo": "PPO with a critic (GAE), the paper's RL (sets ppo.adv_estimator=gae)",
    "grpo": "GRPO: group-relative advantages, no critic (defaults: ppo.adv_estimator=grpo, "
    "4 samples per task, the KL as a k3 loss term; --set overrides them, e.g. "
    "ppo.adv_estimator=rloo)",
    "sft": "supervised fine-tuning on teacher trajectories",
}


def register(sub: argparse._SubParsersAction) -> None:
    register_pretrain(sub)
    p = sub.add_parser("train", help="train the policy: sft, ppo or grpo")
    trainers = p.add_subparsers(dest="trainer", required=True, metavar="TRAINER")
    for name, help_ in TRAINERS.items():
        t = trainers.add_parser(name, help=help_)
        t.add_argument("--out", required=True, help="run directory (assets, checkpoints, logs)")
        t.add_argument("--resume", action="store_true", help="continue from the latest checkpoint")
        t.add_argument(
            "--init",
            default=None,
            metavar="CHECKPOINT_OR_MODEL_DIR",
            help="start from a saved policy (e.g. the SFT warm start)",
        )
        add_config_args(t)
        if name == "sft":
            t.add_argument(
                "--warm-start",
                action="store_true",
                help="the warm start: teacher trajectories of sft.warm_start_objectives "
                "with the warm-start budget (default: train_objectives, sft budget)",
            )
            t.add_argument(
                "--memory",
                default=None,
                choices=list(MEMORIES),
                help="memory policy of the teacher trajectories (default: rollout.memory)",
            )
            t.set_defaults(func=cmd_sft)
            continue
        t.add_argument(
            "--no-ray",
            dest="use_ray",
            action="store_false",
            help="run workers and learner in this process instead of Ray actors",
        )
        t.add_argument("--no-progress", dest="progress", action="store_false")
        t.set_defaults(func=cmd_rl)


def cmd_rl(args: argparse.Namespace) -> int:
    from mem1_core.config.training import TRAINER_DEFAULTS
    from mem1_core.training.train_rl import train_rl

    # The trainer's name is a shorthand: its defaults, then the user's --set.
    args.overrides = [*TRAINER_DEFAULTS[args.trainer], *args.overrides]
    cfg = config_from_args(args)
    result = train_rl(
        cfg,
        args.out,
        resume=args.resume,
        init=args.init,
        use_ray=args.use_ray,
        show=args.progress,
    )
    print(json.dumps(result, default=str))
    return 0


def cmd_sft(args: argparse.Namespace) -> int:
    from mem1_core.training.sft import train_sft  # the lead's module

    result = train_sft(
        config_from_args(args),
        args.out,
        resume=args.resume,
        init=args.init,
        warm_start=args.warm_start,
        memory=args.memory,
    )
    print(json.dumps(result, default=str))
    return 0


def register_pretrain(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "pretrain",
        help="train the embedded default's base model on fresh worlds (run once, shipped in data/)",
    )
    p.add_argument("--out", required=True, help="directory for worlds, checkpoint and base/")
    p.add_argument("--resume", action="store_true", help="continue from the checkpoint in --out")
    p.add_argument("--no-progress", dest="progress", action="store_false")
    add_config_args(p)
    p.set_defaults(func=cmd_pretrain)


def cmd_pretrain(args: argparse.Namespace) -> int:
    from mem1_core.training.pretrain import pretrain

    manifest = pretrain(
        config_from_args(args), args.out, resume=args.resume, progress=args.progress
    )
    print(json.dumps({k: manifest[k] for k in ("steps", "minutes", "held_out")}, default=str))
    return 0
