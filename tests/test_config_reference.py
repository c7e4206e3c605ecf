"""`mem1 config show` and `mem1 config reference`: each field's value is load_config's, its
source the last layer that set it, its doc the docstring under it in mem1_core/config; and
docs/configuration.md is what `mem1 config reference` writes today."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mem1_core.cli.main import main
from mem1_core.config import load_config
from mem1_core.config.reference import (
    REFERENCE_COMMAND,
    config_fields,
    render_reference,
    resolve,
)

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def _repository_profiles(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MEM1_PROFILES", raising=False)


def by_key(rows) -> dict:
    return {r.key: r for r in rows}


def test_sources_follow_the_layers(tmp_path: Path) -> None:
    cfg_file = tmp_path / "local.yaml"
    cfg_file.write_text("ppo:\n  iterations: 7\n  minutes: 3.0\nretrieval:\n  topk: 5\n")
    rows = by_key(
        resolve("smol", cfg_file, ["ppo.minutes=2.5", "world.seed=4", "model.autocast=null"])
    )
    assert rows["world.seed"].source == "--set" and rows["world.seed"].value == 4
    assert rows["ppo.minutes"].source == "--set" and rows["ppo.minutes"].value == 2.5
    # set in the profile and again in the file: the file's
    assert rows["ppo.iterations"].source == f"file {cfg_file}"
    assert rows["ppo.iterations"].value == 7
    assert rows["retrieval.topk"].source == f"file {cfg_file}"
    # set in the profile only; set to null over the profile
    assert rows["sft.lr"].source == "profile smol" and rows["sft.lr"].value == 1.0e-4
    assert rows["model.autocast"].source == "--set" and rows["model.autocast"].value is None
    # untouched
    assert rows["world.n_people"].source == "default"
    assert rows["ppo.clip_eps"].source == "default" and rows["ppo.clip_eps"].value == 0.2
    assert rows["profile"].value == "smol"


def test_values_are_load_configs() -> None:
    overrides = ["ppo.iterations=3", "data.eval_objectives=[1,2]"]
    cfg = load_config("paper", None, overrides)
    for row in resolve("paper", None, overrides):
        node = cfg
        for part in row.key.split("."):
            node = getattr(node, part)
        assert row.value == node, row.key
    assert len(resolve("tiny")) == len(config_fields())


def test_docs_come_from_the_field_docstrings() -> None:
    docs = {f.key: f.doc for f in config_fields()}
    assert docs["world.seed"] == "Seed for names, relations, phrasing and the split."
    assert docs["ppo.minibatch_size"] == "Trajectories per optimiser step."
    assert docs["data.hotpotqa_test"].startswith("The test questions, in the same forms")
    assert "\n" in docs["data.hotpotqa_test"]  # a multi-line docstring, dedented whole
    # every field says what it is (the `resources` placement counts are documented in words
    # around them, not yet one by one)
    undocumented = {k for k, d in docs.items() if not d and not k.startswith("resources.")}
    assert not undocumented


def test_show_cli_json_and_text(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["config", "show", "--profile", "smol", "--set", "ppo.iterations=9", "--json"]) == 0
    rows = {r["key"]: r for r in map(json.loads, capsys.readouterr().out.splitlines())}
    assert rows["ppo.iterations"] == {
        "key": "ppo.iterations",
        "value": 9,
        "source": "--set",
        "doc": "Length of a run in iterations (rollout + update): it decides.",
    }
    assert rows["rollout.chat_template"]["source"] == "profile smol"
    assert rows["data.eval_objectives"]["value"] == [1, 2, 4, 8]

    assert main(["config", "show", "--profile", "smol", "--set", "ppo.iterations=9"]) == 0
    lines = capsys.readouterr().out.splitlines()
    line = next(ln for ln in lines if ln.startswith("ppo.iterations = "))
    assert line.split() == ["ppo.iterations", "=", "9", "#", "--set"]
    assert "    Length of a run in iterations (rollout + update): it decides." in lines
    assert "[ppo]" in lines

    assert main(["config", "show", "--profile", "smol", "--changed", "--json"]) == 0
    sources = {json.loads(ln)["source"] for ln in capsys.readouterr().out.splitlines()}
    assert sources == {"profile smol", "--profile"}


def test_show_names_a_bad_override(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["config", "show", "--set", "ppo.iteratons=3"]) == 2
    assert "did you mean 'iterations'" in capsys.readouterr().err


def test_docs_configuration_md_is_current() -> None:
    path = ROOT / "docs" / "configuration.md"
    assert path.read_text() == render_reference(), (
        f"docs/configuration.md is stale: regenerate it with `{REFERENCE_COMMAND}`"
    )


def test_reference_lists_every_field_and_profile_values() -> None:
    text = render_reference()
    for f in config_fields():
        section, _, name = f.key.partition(".")
        if name:
            assert f"| `{name}` | `" in text, f.key
    assert "smoke: `6`" in text  # world.n_countries in the smoke profile
    assert 'paper: `"hotpotqa+nq"`' in text
