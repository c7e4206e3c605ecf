"""Every text template the agent sees: the task prompt and the environment's hints.

One module, used by composition, rollout, training and evaluation alike, so that the hint
text can never differ between training and evaluation (a trap of the reference code,
docs/design.md §6).
"""

from __future__ import annotations

# Tags the agent writes or reads: one special token each in the tiny tokenizer, plain text in
# a pretrained one (mem1_core.models.tags).
IS_OPEN, IS_CLOSE = "<IS>", "</IS>"
QUERY_OPEN, QUERY_CLOSE = "<query>", "</query>"
INFO_OPEN, INFO_CLOSE = "<info>", "</info>"
ANSWER_OPEN, ANSWER_CLOSE = "<answer>", "</answer>"
TAGS = (
    IS_OPEN,
    IS_CLOSE,
    QUERY_OPEN,
    QUERY_CLOSE,
    INFO_OPEN,
    INFO_CLOSE,
    ANSWER_OPEN,
    ANSWER_CLOSE,
)
ANSWER_SEPARATOR = ";"
UNKNOWN = "?"
"""What the scripted teacher answers (and writes in its state) for a fact it does not hold."""

TASK_INSTRUCTIONS = (
    f"Answer by searching. Each turn write {IS_OPEN} {IS_CLOSE}, your only memory: keep every "
    f"fact you still need. Then search with {QUERY_OPEN} {QUERY_CLOSE} (results come in "
    f"{INFO_OPEN} {INFO_CLOSE}) or answer {ANSWER_OPEN} a1; a2 {ANSWER_CLOSE}, one answer per "
    "question in order."
)


KEEP_ANSWERS_INSTRUCTIONS = (
    f"Answer by searching. Each turn write {IS_OPEN} {IS_CLOSE}, your only memory: keep every "
    "answer you have found so far, one per question, and every fact you still need. Then "
    f"search with {QUERY_OPEN} {QUERY_CLOSE} (results come in {INFO_OPEN} {INFO_CLOSE}) or "
    f"answer {ANSWER_OPEN} a1; a2 {ANSWER_CLOSE}, one answer per question in order."
)
"""Beyond the paper (`rollout.keep_answers_prompt`): the instructions with an `<IS>` that is
asked to carry every answer found so far, against forgetting found answers on long tasks."""


def keep_answers_prompt(prompt: str) -> str:
    """A task prompt (task_prompt's) with KEEP_ANSWERS_INSTRUCTIONS in place of the paper's."""
    if TASK_INSTRUCTIONS not in prompt:
        raise ValueError(
            "rollout.keep_answers_prompt: the task prompt does not hold the task instructions "
            "(tasks composed with another prompt); recompose them or turn the option off"
        )
    return prompt.replace(TASK_INSTRUCTIONS, KEEP_ANSWERS_INSTRUCTIONS, 1)


def task_prompt(questions: list[str]) -> str:
    """The task prompt for an N-objective task (N = len(questions))."""
    if not questions:
        raise ValueError("a task needs at least one question")
    lines = [TASK_INSTRUCTIONS]
    lines += [f"Question {i}: {q.strip()}" for i, q in enumerate(questions, 1)]
    lines.append(prompt_end(len(questions)))
    return "\n".join(lines) + "\n"


def prompt_end(n: int) -> str:
    """The prompt's last line. Without it the end of the question list is not in the text: a
    model that has read longer lists continues it ("Question 5: …") instead of starting its
    turn, since nothing marks where the prompt stops (a chat template's role markers do this
    for an instruction-tuned LLM). It also says how many answers the task wants."""
    return f"Answer all {n} question{'s' if n != 1 else ''}."


def turns_left_hint(turns_left: int) -> str:
    """Appended inside every `<info>` block; identical text in training and evaluation."""
    if turns_left <= 1:
        return "[HINT] This is your last turn: answer now."
    return f"[HINT] You have {turns_left} turns left."


def progress_hint(turns_left: int, n: int, unfound: int) -> str:
    """Beyond the paper (`rollout.progress_hint`): the turns-left hint and, on the same line,
    how many of the task's `n` questions have answers no `<info>` has shown yet."""
    return (
        f"{turns_left_hint(turns_left)} The task has {n} question{'s' if n != 1 else ''}; "
        f"{unfound} still without an answer in the results so far."
    )


def join_answers(answers: list[str]) -> str:
    return f"{ANSWER_SEPARATOR} ".join(a.strip() for a in answers)


def split_answers(text: str) -> list[str]:
    """`a1; a2; …` -> [a1, a2, …] (the paper splits answers on `;`, docs/design.md §6)."""
    return [a.strip() for a in text.split(ANSWER_SEPARATOR)]


FORMAT_HINT = (
    f"[FORMAT] Invalid turn. Write {IS_OPEN} state {IS_CLOSE} then either "
    f"{QUERY_OPEN} search {QUERY_CLOSE} or {ANSWER_OPEN} answers {ANSWER_CLOSE}."
)
