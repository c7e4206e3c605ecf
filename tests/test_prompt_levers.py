"""The prompt levers beyond the paper (rollout.keep_answers_prompt, rollout.progress_hint):
the instructions that ask the `<IS>` to keep found answers, and a hint that counts the task's
questions still without an answer in the results, checked on hand-built trajectories whose
counts are known, and off by default (the paper's prompt and hint, unchanged)."""

from __future__ import annotations

import pytest

from mem1_core.config import load_config
from mem1_core.data.prompts import (
    KEEP_ANSWERS_INSTRUCTIONS,
    TASK_INSTRUCTIONS,
    task_prompt,
    turns_left_hint,
)
from mem1_core.qa.env import QAEnvironment, info_body
from mem1_core.trajectory.record import Action, Trajectory, Turn


def test_the_levers_are_off_by_default_and_named_in_the_config():
    cfg = load_config("smol")
    assert not cfg.rollout.keep_answers_prompt and not cfg.rollout.progress_hint


def test_the_keep_answers_prompt_replaces_only_the_instructions(small_tokenizer, small_index):
    prompt = task_prompt(["Who founded X?", "Where was Y born?"])
    plain = QAEnvironment(small_tokenizer, small_index, topk=2)
    keep = QAEnvironment(small_tokenizer, small_index, topk=2, keep_answers_prompt=True)
    assert plain.encode_prompt(prompt) == small_tokenizer.encode(prompt, add_special_tokens=False)
    want = prompt.replace(TASK_INSTRUCTIONS, KEEP_ANSWERS_INSTRUCTIONS)
    assert "keep every answer you have found so far" in want and want != prompt
    assert keep.encode_prompt(prompt) == small_tokenizer.encode(want, add_special_tokens=False)
    with pytest.raises(ValueError, match="does not hold the task instructions"):
        keep.encode_prompt("Question 1: a question composed with another prompt")


def _turn(info: str = "") -> Turn:
    return Turn(context=[], gen_ids=[], gen_logprobs=[], action=Action.QUERY, info_text=info)


def test_the_progress_hint_counts_the_questions_no_result_has_answered(
    small_tokenizer, small_index
):
    env = QAEnvironment(small_tokenizer, small_index, topk=2, progress_hint=True)
    tr = Trajectory("t", "mem1", [1], [["Ada Lovelace", "Ada"], ["1887"], ["Paris"]], max_turns=6)
    bodies = [
        "Doc 1 (Title: X) X was founded by Ada Lovelace in London.",  # answers question 1
        "No results.",
        "Doc 1 (Title: Y) Y was born in 18870.",  # not 1887 as a whole word
        "Doc 1 (Title: Z) Z moved to paris in 1887.",  # questions 2 and 3, case aside
    ]
    unfound = []
    for body in bodies:
        tr.turns.append(_turn())
        env.set_info(tr, body)
        hint = tr.turns[-1].info_text.rsplit("\n", 1)[1]
        unfound.append(int(hint.split("; ")[1].split()[0]))
        assert info_body(tr.turns[-1].info_text) == body  # one hint line: the body reads back
        assert "The task has 3 questions" in hint
    assert unfound == [2, 2, 2, 0]
    # off: the paper's hint alone
    plain = QAEnvironment(small_tokenizer, small_index, topk=2)
    tr.turns.append(_turn())
    plain.set_info(tr, "No results.")
    assert tr.turns[-1].info_text.endswith(f"\n{turns_left_hint(1)}</info>")
