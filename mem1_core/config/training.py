"""The configuration sections of training: SFT, the PPO / GRPO algorithm (and the defaults
of its trainers) and the base model's pretraining. Where RL training runs is
mem1_core.config.resources."""

from __future__ import annotations

from dataclasses import dataclass

from mem1_core.config.methods import (
    ADV_ESTIMATORS,
    KL_CONTROLLERS,
    KL_ESTIMATORS,
    LOSS_AGG_MODES,
    POLICY_LOSSES,
    ROLLOUT_IS_LEVELS,
    TRAJECTORY_MODES,
)
from mem1_core.config.sections import Section


@dataclass(frozen=True)
class SFTConfig(Section):
    """Supervised training on teacher trajectories (loss on generated tokens only)."""

    warm_start_objectives: tuple[int, ...] = (1, 2)
    """N of the teacher trajectories of the warm start (the tag format, and `;` between the
    answers of several questions: from N=1 alone the tiny model does not generalise to N=2,
    measured 1/32 tasks at N=2, so PPO would start with no reward at all; nor does SmolLM2,
    which then answers only the first question and whose PPO samples never find the `;`).
    An N given k times gets k shares of the `n_teacher_tasks`:
    (1, 1, 1, 2) is three N=1 trajectories to each N=2."""
    warm_start_minutes: float = 20.0
    """Cap on the warm start's training minutes: it stops a run far slower than planned, with a
    warning and `stopped_by: minutes` in its result."""
    warm_start_steps: int = 100000
    """Length of the warm start in steps: it decides (the lr schedule and the evaluations are
    laid out over it), so a busy machine trains the same model, only later."""
    minutes: float = 8.0
    """Cap on the minutes of the SFT arm of the ablation (as `warm_start_minutes`)."""
    steps: int = 100000
    """Length of the SFT arm in steps (on train_objectives-objective tasks); it decides."""
    lr: float = 2e-3
    """Peak learning rate of AdamW (2e-3 suits the tiny model from scratch; a pretrained
    model wants ~1e-4, as the `smol` profile sets)."""
    warmup_steps: int = 50
    """Linear warm-up steps before the cosine decay."""
    batch_size: int = 16
    """Trajectories per step (each a flattened tree)."""
    n_teacher_tasks: int = 4000
    """Teacher trajectories generated for SFT (cycled if training runs longer), spread evenly
    over the run's world and the `teacher_worlds` extra ones."""
    teacher_worlds: int = 0
    """Extra generated worlds (fresh names, train split only) the teacher also plays, so the
    model cannot memorise entities and must learn to copy (see mem1_core.qa.tasks.teacher_world).
    The world-based sources only; 0 for hub data."""
    warm_start_context_weight: float = 0.0
    """Warm start only: weight of a next-token loss on the prompt and <info> tokens of the
    extra worlds' trajectories (never the run's own world, whose <info> can show held-out
    entities): the pretraining a base model brings, which teaches copying."""
    weight_decay: float = 0.0
    """AdamW's decoupled weight decay."""
    grad_clip: float = 1.0
    """Clip the gradient norm to this before a step."""
    eval_tasks: int = 32
    """Held-out tasks (greedy) scored before, during and after an SFT stage; 0 turns those
    evaluations off (at 135M parameters on a CPU each costs minutes)."""
    evals: int = 4
    """Held-out evaluations during an SFT stage, at evenly spaced steps (0: only before and
    after)."""

    def __post_init__(self) -> None:
        if self.eval_tasks < 0 or self.evals < 0:
            raise ValueError("sft.eval_tasks and sft.evals must be >= 0 (0 turns them off)")


@dataclass(frozen=True)
class TrajectoryConfig(Section):
    """How the learner scores a trajectory whose contexts were pruned (mem1_core.trajectory.modes):
    the same rollout feeds every mode; PPO (every estimator), GRPO and SFT, on the single and
    the FSDP learner, honour it."""

    mode: str = "tree"
    """`tree`: every turn context in one flattened prefix tree, one exact pass (the paper's
    masked trajectory, docs/design.md §4.2). `turns`: each turn its own row with its real
    context, exact, every context paid in full (the per-turn samples of TRL, AReaL, SkyRL); a
    trajectory's rows share its outcome, and GAE chains across them. `concat`: the public
    MEM1 code's scoring, the whole trajectory as one causal sequence with global positions;
    not exact once a turn was pruned (an ablation: what exactness buys)."""

    def __post_init__(self) -> None:
        TRAJECTORY_MODES.check(self.mode)


OLD_LOGPROBS = ("recompute", "rollout")
"""The sources of PPO's old log-probs (`ppo.old_logprobs`)."""

GSPO_CLIP_RANGE = (3e-4, 4e-4)
"""GSPO's (low, high) clip of the sequence ratio (Zheng et al. 2025, §5.1)."""


@dataclass(frozen=True)
class PPOConfig(Section):
    """PPO / GRPO over masked trajectories (the paper's defaults where they apply). The RL
    toolbox keeps verl's names and meanings; the names of
    each family of methods are their registries' (mem1_core.config.methods)."""

    # -- Parameters that control the length of the run, its checkpoints and evaluations --
    iterations: int = 1000
    """Length of a run in iterations (rollout + update): it decides."""
    minutes: float = 8.0
    """Cap on a run's minutes: it stops a run far slower than planned, with a warning and
    `stopped_by: minutes` in its last metrics row."""
    checkpoint_every: int = 1
    """Write a checkpoint every this many iterations (the newest few are kept)."""
    eval_every: int = 0
    """Greedy evaluation on held-out tasks every K iterations (0: only at the end)."""
    eval_objectives: tuple[int, ...] = ()
    """More N for those evaluations, beside `data.train_objectives` (`eval/reward`): each
    adds `eval/n{N}/...` to metrics.jsonl on `data.eval_tasks(N)` test tasks, so a run draws
    its held-out curve at task lengths it never trained on."""
    max_nonfinite_in_row: int = 3
    """Stop with an error after this many skipped (non-finite) updates in a row."""

    # -- Parameters that control which task lengths an iteration trains on --
    curriculum: tuple[int, ...] = ()
    """Beyond the paper (which trains on data.train_objectives only): the N of the training
    tasks as a stagewise curriculum, e.g. (1, 2, 4): the iterations split into len(curriculum)
    consecutive stages of equal length (the first stages take the remainder), stage k on
    N=curriculum[k], as the h1 recipe trains on chained short problems before longer ones
    (arXiv 2510.07312). Each iteration's N and the horizon reached so far (the largest N
    trained) go to metrics.jsonl (`train_objectives`, `horizon`). Empty: the paper."""
    curriculum_mixture: bool = False
    """With `curriculum`: every iteration trains on all its N at once (tasks_per_iteration
    split evenly over them, the smaller N first taking the remainder), a mixture instead of
    stages."""

    # -- Parameters that control the samples of an iteration --
    tasks_per_iteration: int = 32
    """Tasks rolled out per iteration (drawn from the training tasks, fixed per iteration)."""
    samples_per_task: int = 1
    """Trajectories per task: GRPO needs several (a group); PPO uses 1."""
    overlap_rollouts: bool = False
    """Beyond the paper: roll out iteration k+1 while the learner runs iteration k's
    update, as verl's one-step off-policy recipe and AReaL's asynchronous RL do (AReaL with a
    staleness bound of 1). Iteration k+1 then trains on samples of the policy before update k,
    one update stale (`rollout_staleness` in metrics.jsonl), so it needs `rollout_is`: the
    learner's recomputed log-probs are PPO's proximal (old) policy and the rollout's are the
    behaviour policy (verl's decoupled mode; mem1_core.rl.rollout_correction). On Ray only;
    with --no-ray the same schedule runs one step after the other (same numbers, no speed-up).
    False: the synchronous loop, unchanged."""

    # -- Parameters that control the optimisation --
    actor_lr: float = 1e-4
    """AdamW learning rate of the policy (no weight decay: PPO's small steps should not also
    shrink the warm start)."""
    critic_lr: float = 1e-4
    """AdamW learning rate of the critic (`gae` only)."""
    critic_layers: int | None = None
    """The critic's transformer: a copy of the initial policy's first this many decoder layers
    under its value head (`gae` only; verl lets a critic be another, smaller model). None:
    all of them (verl's and OpenRLHF's default). Fewer make the critic's forward and backward
    cheaper in proportion; with gamma = lam = 1 it is only the per-token baseline."""
    ppo_epochs: int = 2
    """Passes over an iteration's trajectories, each in shuffled minibatches."""
    minibatch_size: int = 16
    """Trajectories per optimiser step."""
    micro_batch_size: int = 8
    """Trajectories per forward/backward pass (gradients accumulate exactly over a
    minibatch's micro-batches); a divisor of minibatch_size."""
    micro_batch_tokens: int | None = None
    """Micro-batches by tokens instead (verl: `use_dynamic_bsz` with
    `ppo_max_token_len_per_gpu`): a minibatch's rows, in order, into passes of at most this
    many tokens each (rows times the length they are cut to, padding included; a longer row
    runs alone). The sums are the same, so the update is (to float rounding). Rows differ in
    size by `trajectory.mode`: a whole tree against one turn, so a row count gives the tree
    7-15x the tokens a pass; on a CPU, passes of a few thousand tokens run faster than
    passes of ten thousand. None: `micro_batch_size` rows. Single learner only."""
    grad_clip: float = 1.0
    """Clip each model's gradient norm to this before a step."""

    # -- Parameters that control the advantages --
    adv_estimator: str = "gae"
    """The advantage estimator (verl: algorithm.adv_estimator; mem1_core.rl.estimators): `gae`
    (PPO with a critic, the paper's), `grpo`, `grpo_mean` (Dr. GRPO: no std division),
    `rloo`, `reinforce_plus_plus`, `reinforce_plus_plus_baseline`. `mem1 train ppo` sets
    gae and `mem1 train grpo` grpo, before any --set."""
    gamma: float = 1.0
    """Discount over generated tokens (`gae`, `reinforce_plus_plus`)."""
    lam: float = 1.0
    """GAE's lambda."""

    # -- Parameters that control the policy and value losses --
    policy_loss: str = "vanilla"
    """`vanilla` (token-level PPO clip) or `gspo` (GSPO's sequence-level ratio over the whole
    trajectory; verl: actor.policy_loss.loss_mode)."""
    loss_agg_mode: str = "token-mean"
    """How per-token losses become a scalar (verl: actor.loss_agg_mode): `token-mean`,
    `seq-mean-token-mean`, `seq-mean-token-sum` or `seq-mean-token-sum-norm` (Dr. GRPO: each
    trajectory's token sum / loss_scale_factor). Applies to the policy, value, entropy and KL
    terms, as in verl; `policy_loss=gspo`'s own term is always seq-mean-token-mean (verl)."""
    loss_scale_factor: float | None = None
    """seq-mean-token-sum-norm's fixed normaliser (verl: actor.loss_scale_factor). None: the
    most tokens a training trajectory can generate, rollout.max_turns(N) *
    rollout.max_new_tokens(N) at N = data.train_objectives (verl's max response length;
    Config.loss_scale_factor)."""
    clip_eps: float = 0.2
    """The symmetric PPO clip (verl: actor.clip_ratio); clip_ratio_low / _high override a side."""
    clip_ratio_low: float | None = None
    """Lower side of the ratio clip, 1 - low (verl: actor.clip_ratio_low). None: clip_eps
    (under policy_loss=gspo: 3e-4, GSPO §5.1)."""
    clip_ratio_high: float | None = None
    """Upper side, 1 + high; larger than low is DAPO's clip-higher (verl: 0.28 in its DAPO
    recipe). None: clip_eps (under policy_loss=gspo: 4e-4, GSPO §5.1)."""
    clip_ratio_c: float | None = 3.0
    """Dual-clip (Ye et al. 2020; verl: actor.clip_ratio_c, default 3.0): a
    negative-advantage token's loss is capped at -A * c. On by default, as verl's vanilla loss
    always applies it: it only binds where a ratio exceeds c, which a healthy on-policy step
    never reaches, so the paper's objective is unchanged. None turns it off; `gspo` ignores it."""
    value_clip_eps: float = 0.2
    """The critic's value clip around the old values (PPO's clipped value loss)."""
    entropy_coef: float = 0.0
    """Weight of the entropy bonus (0: off, the paper's)."""

    # -- Parameters that control the KL to the reference policy --
    kl_coef: float = 1e-3
    """The KL coefficient (verl: algorithm.kl_ctrl.kl_coef, or actor.kl_loss_coef with the KL
    as a loss term); under `kl_ctrl=adaptive` its starting value."""
    kl_kind: str = "k1"
    """The per-token KL estimator: `k1`, `k2` or `k3` (Schulman 2020; mem1_core.rl.advantages)."""
    kl_in_loss: bool = False
    """GRPO style: the KL is a loss term instead of a reward penalty."""
    kl_ctrl: str = "fixed"
    """`fixed` or `adaptive` (verl: algorithm.kl_ctrl.type; mem1_core.rl.kl_control): the
    adaptive controller moves kl_coef once per iteration towards `target_kl`."""
    target_kl: float = 0.1
    """`adaptive`: the KL per token the controller aims at (verl: kl_ctrl.target_kl)."""
    kl_horizon: int = 10000
    """`adaptive`: trajectories over which the coefficient may move by 20% (verl: kl_ctrl.horizon)."""

    # -- Parameters that control the old policy and the rollout correction --
    rollout_is: str | None = None
    """Truncated importance sampling of the rollout/learner log-prob gap (verl:
    algorithm.rollout_correction.rollout_is): None (off), `token` or `sequence` (one weight
    per trajectory); mem1_core.rl.rollout_correction."""
    rollout_is_threshold: float = 2.0
    """The truncation cap of those weights (verl's default 2.0)."""
    old_logprobs: str = "recompute"
    """Where the PPO ratio's old policy comes from. `recompute`: a forward of the policy over
    every tree token before the epochs (2P FLOPs a token); the rollout's recorded log-probs
    then measure the sampler/learner gap (`logp_mismatch_*`) and feed `rollout_is`. `rollout`:
    the sampler's recorded log-probs are the old policy and that forward is skipped (verl:
    algorithm.rollout_correction.bypass_mode; slime: --use-rollout-logprobs). The sampler is
    then the behaviour policy and the old one at once: the ratio pi_theta / pi_rollout
    corrects for any gap between them and its clip truncates it, so `rollout_is` (whose
    weights pi_old / pi_rollout would all be 1) and `overlap_rollouts` (whose clip would sit
    around weights an update stale) stay with `recompute`, and no `logp_mismatch_*` is logged
    (the first step's `approx_kl` is that gap). With one epoch and one minibatch in float32
    the two give the same update (mem1_core.rl.passes.score)."""

    @property
    def clip_range(self) -> tuple[float, float]:
        """(low, high): the policy ratio is clipped to [1 - low, 1 + high]."""
        gspo = self.policy_loss == "gspo"
        low = self.clip_ratio_low
        high = self.clip_ratio_high
        if low is None:
            low = GSPO_CLIP_RANGE[0] if gspo else self.clip_eps
        if high is None:
            high = GSPO_CLIP_RANGE[1] if gspo else self.clip_eps
        return low, high

    def __post_init__(self) -> None:
        if self.minibatch_size % self.micro_batch_size:
            raise ValueError("ppo.minibatch_size must be a multiple of ppo.micro_batch_size")
        if self.micro_batch_tokens is not None and self.micro_batch_tokens < 1:
            raise ValueError("ppo.micro_batch_tokens must be >= 1 (or null: micro_batch_size rows)")
        if any(n < 1 for n in self.eval_objectives):
            raise ValueError("ppo.eval_objectives: objective counts must be >= 1")
        if any(n < 1 for n in self.curriculum):
            raise ValueError("ppo.curriculum: objective counts must be >= 1")
        if self.curriculum_mixture and not self.curriculum:
            raise ValueError(
                "ppo.curriculum_mixture=true mixes the N of ppo.curriculum: give them, e.g. "
                "ppo.curriculum=[1,2,4]"
            )
        if self.curriculum and len(self.curriculum) > self.iterations:
            raise ValueError(
                f"ppo.curriculum has {len(self.curriculum)} stages but ppo.iterations="
                f"{self.iterations}: give at least one iteration per stage"
            )
        if self.critic_layers is not None and self.critic_layers < 1:
            raise ValueError(
                f"ppo.critic_layers={self.critic_layers}: keep at least 1 of the policy's "
                "layers, or null for all"
            )
        self._check_toolbox()

    def _check_toolbox(self) -> None:
        # The registries hold the names (mem1_core.config.methods), not a copy here.
        ADV_ESTIMATORS.check(self.adv_estimator)
        POLICY_LOSSES.check(self.policy_loss)
        LOSS_AGG_MODES.check(self.loss_agg_mode)
        KL_CONTROLLERS.check(self.kl_ctrl)
        KL_ESTIMATORS.check(self.kl_kind)
        if self.rollout_is is not None and self.rollout_is not in ROLLOUT_IS_LEVELS.names:
            raise ValueError(
                f"ppo.rollout_is={self.rollout_is!r}: use token, sequence, or null (off)"
            )
        if self.rollout_is_threshold <= 0:
            raise ValueError(
                f"ppo.rollout_is_threshold={self.rollout_is_threshold}: the cap of the "
                "importance weights must be > 0 (verl's default is 2.0)"
            )
        if self.old_logprobs not in OLD_LOGPROBS:
            raise ValueError(
                f"ppo.old_logprobs={self.old_logprobs!r}: use {' or '.join(OLD_LOGPROBS)}"
            )
        if self.old_logprobs == "rollout" and self.overlap_rollouts:
            raise ValueError(
                "ppo.old_logprobs=rollout with ppo.overlap_rollouts=true would clip the ratio "
                "around the sampler's weights, an update stale: use ppo.old_logprobs=recompute "
                "(with ppo.rollout_is=token) for overlapped rollouts"
            )
        if self.old_logprobs == "rollout" and self.rollout_is is not None:
            raise ValueError(
                f"ppo.rollout_is={self.rollout_is} weights pi_old / pi_rollout, which is 1 when "
                "ppo.old_logprobs=rollout makes the sampler the old policy (the ratio against "
                "it carries the correction): set ppo.rollout_is=null, or "
                "ppo.old_logprobs=recompute to correct a sampler that computes otherwise"
            )
        if self.overlap_rollouts and self.rollout_is is None:
            raise ValueError(
                "ppo.overlap_rollouts=true trains on rollouts sampled one update earlier: set "
                "ppo.rollout_is=token (or sequence) so the loss is importance-weighted from "
                "the policy that sampled them to the one the PPO ratio is taken against"
            )
        if self.loss_scale_factor is not None and self.loss_scale_factor <= 0:
            raise ValueError(
                f"ppo.loss_scale_factor={self.loss_scale_factor}: use a number of tokens > 0, "
                "or null for the trajectory's generation budget"
            )
        low, high = self.clip_range
        if not 0.0 < low < 1.0 or high <= 0.0:
            raise ValueError(
                f"ppo.clip_ratio_low={low} / ppo.clip_ratio_high={high}: the ratio is clipped "
                "to [1 - low, 1 + high]; use 0 < low < 1 and high > 0 (or ppo.clip_eps for both)"
            )
        if self.clip_ratio_c is not None and self.clip_ratio_c <= 1.0:
            raise ValueError(
                f"ppo.clip_ratio_c={self.clip_ratio_c}: dual-clip caps the loss at -A * c and "
                "needs c > 1 (verl's default is 3.0); set it to null to turn dual-clip off"
            )
        if self.kl_ctrl == "adaptive":
            if self.target_kl <= 0 or self.kl_horizon <= 0:
                raise ValueError(
                    f"ppo.kl_ctrl=adaptive needs ppo.target_kl > 0 and ppo.kl_horizon > 0 "
                    f"(got {self.target_kl}, {self.kl_horizon}; verl's defaults: 0.1, 10000)"
                )
            if self.kl_coef <= 0:
                raise ValueError(
                    "ppo.kl_ctrl=adaptive multiplies ppo.kl_coef up or down: start it above 0 "
                    "(the paper's 1e-3), or use ppo.kl_ctrl=fixed"
                )


PPO_DEFAULTS: tuple[str, ...] = ("ppo.adv_estimator=gae",)
"""Trainer defaults: the overrides `mem1 train ppo` applies before the user's: GAE with a critic (the paper)."""
GRPO_DEFAULTS: tuple[str, ...] = (
    "ppo.adv_estimator=grpo",
    "ppo.samples_per_task=4",
    "ppo.kl_in_loss=true",
    "ppo.kl_kind=k3",
)
"""Overrides `mem1 train grpo` applies before the user's: the grpo estimator, a group of 4
samples per task, the KL as a k3 loss term (DeepSeekMath §4.1). Explicit `--set` values win
(`--set ppo.adv_estimator=rloo` trains RLOO with the same group and KL)."""
TRAINER_DEFAULTS: dict[str, tuple[str, ...]] = {"ppo": PPO_DEFAULTS, "grpo": GRPO_DEFAULTS}
"""`mem1 train <name>` and the train-<name> flows: their defaults, by trainer name."""
