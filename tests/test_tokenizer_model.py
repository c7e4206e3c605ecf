"""The tiny tokenizer and model: tags as single tokens, cheap copying, safetensors only."""

from __future__ import annotations

import dataclasses

import torch

from mem1_core.config import ModelConfig, WorldConfig
from mem1_core.data.prompts import TAGS
from mem1_core.data.world import generate_world
from mem1_core.models.model import build_tiny_model, load_model, save_model
from mem1_core.models.tokenizer import YEARS, load_tokenizer, tag_ids


def test_tags_are_single_special_tokens(small_tokenizer):
    ids = tag_ids(small_tokenizer)
    assert len(set(ids.values())) == len(TAGS)
    text = "<IS> a </IS><query>b</query>"
    enc = small_tokenizer.encode(text, add_special_tokens=False)
    assert enc[0] == ids["<IS>"] and enc[-1] == ids["</query>"]


def test_every_year_is_one_token(small_tokenizer):
    for y in YEARS:
        assert len(small_tokenizer.encode(f" {y}", add_special_tokens=False)) == 1, y


def test_unseen_names_are_a_few_syllable_tokens(small_tokenizer, small_world_config):
    # names of another world: never seen when the tokenizer was trained
    other = generate_world(dataclasses.replace(small_world_config, seed=123))
    names = [t for t in other.corpus["title"].to_pylist() if " " in t][:200]
    lengths = [len(small_tokenizer.encode(" " + n, add_special_tokens=False)) for n in names]
    assert sum(lengths) / len(lengths) <= 5.0
    unk = small_tokenizer.unk_token_id
    assert all(unk not in small_tokenizer.encode(" " + n) for n in names)
    # copying: a name's ids inside a sentence are the ids of the name alone
    n = names[0]
    alone = small_tokenizer.encode(" " + n, add_special_tokens=False)
    inside = small_tokenizer.encode(f"Born in 1900 in {n}.", add_special_tokens=False)
    assert any(inside[i : i + len(alone)] == alone for i in range(len(inside)))


def test_save_and_load_round_trip_in_safetensors(small_tokenizer, tmp_path):
    cfg = ModelConfig(
        hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1, intermediate_size=64
    )
    model = build_tiny_model(cfg, small_tokenizer)
    save_model(model, small_tokenizer, tmp_path / "m")
    files = {p.name for p in (tmp_path / "m").iterdir()}
    assert "model.safetensors" in files and not any(f.endswith(".bin") for f in files)
    tok2 = load_tokenizer(tmp_path / "m")
    model2 = load_model(tmp_path / "m", cfg, tok2)
    ids = torch.tensor([small_tokenizer.encode("Question 1: who?")])
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, model2(ids).logits)
    assert tag_ids(tok2) == tag_ids(small_tokenizer)
    # the tokenizer read back from a policy directory (beside a Qwen2 config) encodes and
    # decodes exactly as the one it was saved from, and survives a second save/load
    text = "Question 1: In which city was Kalo Vesh born in 1874?<IS> Q1: x </IS>"
    ids = small_tokenizer.encode(text, add_special_tokens=False)
    assert tok2.encode(text, add_special_tokens=False) == ids
    assert tok2.decode(ids) == small_tokenizer.decode(ids)
    save_model(model2, tok2, tmp_path / "m2")
    assert load_tokenizer(tmp_path / "m2").encode(text, add_special_tokens=False) == ids


def test_world_config_default_is_the_tiny_profile():
    assert WorldConfig().n_people >= 1000


def test_master_weights_let_a_tiny_learning_rate_move_a_bf16_model(small_tokenizer):
    """The paper's actor lr (1e-6) on bf16 parameters rounds every update away; on float32
    master weights under bf16 autocast the same step moves them, and compute stays bf16."""
    from mem1_core.models.model import master_weights

    cfg = ModelConfig(
        hidden_size=32,
        num_layers=1,
        num_heads=2,
        num_kv_heads=1,
        intermediate_size=64,
        dtype="bfloat16",
    )
    ids = torch.tensor([[1, 5, 9, 13, 17, 21]])

    def one_step(model, autocast) -> float:
        """-> the fraction of weights (with a gradient) that the step changed."""
        before = [p.detach().float().clone() for p in model.parameters()]
        opt = torch.optim.AdamW(model.parameters(), lr=1e-6, weight_decay=0.0)
        with autocast:
            logits = model(input_ids=ids).logits
            loss = logits.float().logsumexp(-1).mean()
        loss.backward()
        grads = [p.grad is not None and p.grad.ne(0) for p in model.parameters()]
        opt.step()
        moved = sum(
            int(((p.detach().float() != b) & g).sum())
            for p, b, g in zip(model.parameters(), before, grads, strict=True)
        )
        return moved / sum(int(g.sum()) for g in grads)

    torch.manual_seed(0)
    pure = build_tiny_model(cfg, small_tokenizer).to(torch.bfloat16)
    mixed = build_tiny_model(cfg, small_tokenizer).to(torch.bfloat16)
    mixed.load_state_dict(pure.state_dict())
    assert one_step(pure, torch.autocast("cpu", enabled=False)) < 0.1  # the trap
    autocast = master_weights(mixed, "bfloat16")
    assert all(p.dtype == torch.float32 for p in mixed.parameters())
    with autocast:
        assert mixed(input_ids=ids).logits.dtype == torch.bfloat16
    assert one_step(mixed, autocast) > 0.99


def test_a_run_adopts_the_tokenizer_of_the_policy_it_starts_from(small_tokenizer, tmp_path):
    import pytest

    from mem1_core.config import Config
    from mem1_core.models.policy import adopt_init_tokenizer
    from mem1_core.models.tokenizer import train_tiny_tokenizer
    from mem1_core.runs.layout import RunPaths

    cfg = Config()
    init = tmp_path / "policy"
    small_tokenizer.save_pretrained(init)
    fresh = RunPaths(tmp_path / "fresh")
    adopt_init_tokenizer(cfg, fresh, init)  # a new run directory takes the policy's
    assert load_tokenizer(fresh.tokenizer).get_vocab() == small_tokenizer.get_vocab()
    adopt_init_tokenizer(cfg, fresh, init)  # the same one again: nothing to do

    other = RunPaths(tmp_path / "other")  # a run directory with a tokenizer of its own
    train_tiny_tokenizer(["Ka Lo Mi went to Zu in 1901."] * 4, 400).save_pretrained(other.tokenizer)
    with pytest.raises(ValueError, match="another tokenizer"):
        adopt_init_tokenizer(cfg, other, init)


def test_sft_from_a_policy_tokenises_with_its_tokenizer(small_tokenizer, tmp_path):
    """`mem1 train sft --init` once retrained a tokenizer in its new run directory and fed the
    policy another tokenizer's ids (loss 6.7 at step 2 from a converged warm start)."""
    import pytest

    from mem1_core.config import load_config
    from mem1_core.models.tokenizer import train_tiny_tokenizer
    from mem1_core.training.sft import train_sft

    cfg = load_config("smoke", None, ["sft.steps=1", "sft.n_teacher_tasks=8"])
    init = tmp_path / "policy"
    build_tiny_model(cfg.model, small_tokenizer).save_pretrained(init)
    small_tokenizer.save_pretrained(init)
    assets = tmp_path / "run"
    train_tiny_tokenizer(["Ka Lo Mi went to Zu in 1901."] * 4, 400).save_pretrained(
        assets / "tokenizer"
    )
    with pytest.raises(ValueError, match="another tokenizer"):
        train_sft(cfg, tmp_path / "sft", init=init, assets_dir=assets, progress=False)
