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
    [(["world.nope=1"], "unknown config field"), (["world.seed=abc"], "expected int"),
     (["retrieval.kind=magic"], "bm25 or dense"), (["seed"], "section.field=value")],
)
def test_bad_overrides_say_how_to_fix_them(overrides, message):
    with pytest.raises(ValueError, match=message):
        load_config("tiny", None, overrides)


def test_unknown_profile():
    with pytest.raises(ValueError, match="unknown profile"):
        load_config("huge")
