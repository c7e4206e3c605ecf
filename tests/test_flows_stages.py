"""The training stages' subflows on real QA data, called as functions (`.fn`, no Prefect run)."""

from __future__ import annotations

REAL = ["data.source=hotpotqa+nq", "data.nq=train.jsonl", "data.nq_test=test.jsonl"]


def test_real_qa_data_has_no_sft_stages(tmp_path):
    """No teacher plays HotpotQA or NQ (it follows the world's plans): the warm start and the
    SFT arm skip, writing nothing, and PPO starts from the pretrained model
    (tests/test_real_qa_e2e.py runs it). A profile's base is a warm start without a teacher."""
    from flows.stages import train_sft_arm, warm_start
    from mem1_core.config import load_config
    from mem1_core.training.sft import has_teacher, has_warm_start

    real = load_config("smoke", overrides=REAL)
    assert not has_teacher(real) and not has_warm_start(real)
    assert has_teacher(load_config("smoke")) and has_warm_start(load_config("smoke"))
    with_base = load_config("smoke", overrides=[*REAL, "model.base=data/base"])
    assert has_warm_start(with_base) and not has_teacher(with_base)
    for stage in (warm_start, train_sft_arm):
        out = stage.fn(profile="smoke", config_path=None, overrides=REAL, run_dir=str(tmp_path))
        assert "skipped" in out
    assert not list(tmp_path.iterdir())
