from __future__ import annotations

import pytest

from mem1_core.config import load_config


def test_profiles_select_defaults():
    tiny, smoke, paper = (load_config(p) for p in ("tiny", "smoke", "paper"))
    assert tiny.retrieval.kind == "bm25" and paper.retrieval.kind == "dense"
    assert smoke.world.n_people < tiny.world.n_people
    assert paper.data.source == "hotpotqa+nq"


def test_yaml_then_overrides(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("world:\n  seed: 5\n  n_people: 300\ndata:\n  eval_objectives: [1, 3]\n")
    cfg = load_config("tiny", path, ["world.seed=7", "retrieval.topk=5"])
    assert cfg.world.seed == 7 and cfg.world.n_people == 300
    assert cfg.data.eval_objectives == (1, 3) and cfg.retrieval.topk == 5


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["world.nope=1"], "unknown config field"),
        (["world.seed=abc"], "expected int"),
        (["retrieval.kind=magic"], "bm25 or dense"),
        (["seed"], "section.field=value"),
        (["teacher.forget_rate=1.5"], r"teacher.forget_rate must be in \[0, 1\]"),
    ],
)
def test_bad_overrides_say_how_to_fix_them(overrides, message):
    with pytest.raises(ValueError, match=message):
        load_config("tiny", None, overrides)


def test_unknown_profile():
    with pytest.raises(ValueError, match="unknown profile"):
        load_config("huge")


def test_the_gpu_training_fields_default_off_on_cpu_and_on_for_paper():
    tiny, paper = load_config("tiny"), load_config("paper")
    assert (tiny.model.gradient_checkpointing, tiny.model.seq_bucket_tokens) == (False, 1)
    assert paper.model.attn == "flex_attention" and paper.model.gradient_checkpointing
    assert paper.model.seq_bucket_tokens == 128 and paper.resources.learner_strategy == "single"
    # The bucket follows the attention unless set: 128 (the BlockMask block) under flex.
    assert load_config("tiny", None, ["model.attn=flex_attention"]).model.seq_bucket_tokens == 128
    assert load_config("paper", None, ["model.seq_bucket=64"]).model.seq_bucket_tokens == 64
    fsdp = load_config(
        "paper", None, ["resources.learner_strategy=fsdp", "resources.learner_gpus=4"]
    )
    assert fsdp.resources.learner_strategy == "fsdp"


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["model.seq_bucket=0"], "seq_bucket"),
        (["resources.learner_strategy=ddp"], "single or fsdp"),
        (["resources.learner_strategy=fsdp", "resources.learner_gpus=0"], "whole number >= 1"),
        (["resources.learner_strategy=fsdp", "resources.learner_gpus=1.5"], "whole number >= 1"),
    ],
)
def test_gpu_training_fields_reject_bad_values(overrides, message):
    with pytest.raises(ValueError, match=message):
        load_config("tiny", None, overrides)


def test_rollout_backend():
    from mem1_core.training.vllm_engine import choose_backend, vllm_importable

    # Without Ray the workers run in this process: vLLM only if this Python has it. (With Ray,
    # a vLLM venv's Python counts too: tests/test_rollout_python.py.) The choice is handed to
    # the workers; the config keeps saying `auto`.
    paper = load_config("paper")
    assert choose_backend(paper, use_ray=False) == ("vllm" if vllm_importable() else "hf")
    assert paper.rollout.backend == "auto"
    assert choose_backend(load_config("tiny")) == "hf"
    assert load_config("tiny").rollout.backend == "hf"
    paper = load_config("paper")
    assert paper.rollout.backend == "auto" and paper.rollout.gpu_memory_utilization == 0.85
    with pytest.raises(ValueError, match=r"rollout.backend='sglang': use hf .*, vllm .* or auto"):
        load_config("tiny", None, ["rollout.backend=sglang"])
    with pytest.raises(ValueError, match="gpu_memory_utilization"):
        load_config("tiny", None, ["rollout.gpu_memory_utilization=0"])


def test_profiles_are_the_yaml_files_in_data_profiles():
    from mem1_core.config import profile_names
    from mem1_core.config.loader import PROFILES_DIR

    assert PROFILES_DIR.parts[-2:] == ("data", "profiles")
    assert {"tiny", "smoke", "paper"} <= set(profile_names())


def test_a_field_in_the_wrong_section_names_the_section_that_has_it(tmp_path):
    """Nothing is read under an old name: a field set in a section that lacks it is an error
    that names where it is (or the nearest field), and the file or overrides holding it."""
    path = tmp_path / "old.yaml"
    path.write_text("ppo:\n  num_rollout_workers: 3\n  actor_lr: 0.5\n")
    with pytest.raises(ValueError, match=rf"config file {path}: unknown config field") as e:
        load_config("tiny", path)
    assert "'num_rollout_workers': it is resources.num_rollout_workers" in str(e.value)
    with pytest.raises(ValueError, match=r"--set overrides: .*\['policy'\] in rollout.*'memory'"):
        load_config("tiny", None, ["rollout.policy=full"])
    with pytest.raises(ValueError, match=r"'eval_every_minutes': did you mean 'eval_every'"):
        load_config("tiny", None, ["pretrain.eval_every_minutes=10"])


def test_rl_toolbox_defaults_and_verl_meanings():
    smoke = load_config("smoke")
    ppo = smoke.ppo
    assert (ppo.adv_estimator, ppo.policy_loss, ppo.loss_agg_mode) == (
        "gae",
        "vanilla",
        "token-mean",
    )
    assert ppo.clip_range == (0.2, 0.2) and ppo.clip_ratio_c == 3.0  # verl's dual-clip default
    assert (ppo.rollout_is, ppo.rollout_is_threshold, ppo.kl_ctrl) == (None, 2.0, "fixed")
    # clip_eps is the symmetric shorthand; clip_ratio_low/high override one side each.
    higher = load_config("smoke", None, ["ppo.clip_eps=0.1", "ppo.clip_ratio_high=0.28"]).ppo
    assert higher.clip_range == (0.1, 0.28)
    # GSPO's own small ranges unless set.
    assert load_config("smoke", None, ["ppo.policy_loss=gspo"]).ppo.clip_range == (3e-4, 4e-4)
    # Dr. GRPO's fixed normaliser: the trajectory's generation budget (verl: max response
    # length), smoke at N=2: (1 + 2 * 2) turns x (32 + 8 * 2) tokens.
    assert smoke.loss_scale_factor == 5 * 48
    assert load_config("smoke", None, ["ppo.loss_scale_factor=100"]).loss_scale_factor == 100
    assert load_config("smoke", None, ["ppo.clip_ratio_c=null"]).ppo.clip_ratio_c is None


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["ppo.adv_estimator=ppo"], "ppo.adv_estimator='ppo': use one of gae, grpo"),
        (["ppo.policy_loss=gpg"], "use one of vanilla, gspo"),
        (["ppo.loss_agg_mode=token-sum"], "use one of token-mean, seq-mean-token-mean"),
        (["ppo.kl_ctrl=pid"], "use one of fixed, adaptive"),
        (["ppo.rollout_is=turn"], "use token, sequence, or null"),
        (["ppo.rollout_is_threshold=0"], "must be > 0"),
        (["ppo.loss_scale_factor=0"], "null for the trajectory's generation budget"),
        (["ppo.clip_ratio_low=1.0"], r"0 < low < 1 and high > 0"),
        (["ppo.clip_ratio_high=-0.1"], r"0 < low < 1 and high > 0"),
        (["ppo.clip_ratio_c=0.9"], "needs c > 1.*null to turn dual-clip off"),
        (["ppo.kl_ctrl=adaptive", "ppo.target_kl=0"], "target_kl > 0 and ppo.kl_horizon > 0"),
        (["ppo.kl_ctrl=adaptive", "ppo.kl_coef=0"], "start it above 0"),
    ],
)
def test_rl_toolbox_fields_reject_bad_values_with_the_fix(overrides, message):
    with pytest.raises(ValueError, match=message):
        load_config("smoke", None, overrides)


def test_trainer_shorthands_set_the_estimator_before_the_users_overrides():
    from mem1_core.config.training import TRAINER_DEFAULTS

    assert load_config("smoke", None, list(TRAINER_DEFAULTS["ppo"])).ppo.adv_estimator == "gae"
    grpo = load_config("smoke", None, list(TRAINER_DEFAULTS["grpo"])).ppo
    assert (grpo.adv_estimator, grpo.samples_per_task, grpo.kl_in_loss) == ("grpo", 4, True)
    rloo = load_config("smoke", None, [*TRAINER_DEFAULTS["grpo"], "ppo.adv_estimator=rloo"])
    assert (rloo.ppo.adv_estimator, rloo.ppo.samples_per_task) == ("rloo", 4)
