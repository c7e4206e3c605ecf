"""What a round of the base's pretraining (mem1_core.training.pretrain) trains on: one fresh
world, generated for the round, cut into token rows. Nothing in it would make N >= 4 a
memorised setting:

- **Teacher turns on fresh worlds.** Every round generates a new world (new names and facts;
  seeds from `pretrain.world_seed` up, never a run's evaluation world) and plays the scripted
  teacher on its 1- and 2-objective tasks (never more: the paper trains on 2) under both
  memories (`mem1` and `full`, so both arms of the comparison start from a base that knows
  their format). Loss on the generated tokens, plus `context_weight` times the next-token
  loss on the prompt and `<info>` tokens (reading: a name in `<info>` repeats the query).
- **Documents.** Packed encyclopedia text of the fresh worlds, next-token loss, up to
  `text_len` tokens a row, so positions far beyond a 2-objective context are trained.
- **List drills** (generic, any length): numbered fact lists `Q1: a. Q2: b. … Qk: z.` carried
  from one `<IS>` to the next with one new entry taken from a passage, under the prompt's
  last line `Answer all m questions.`; when the list holds m entries it is copied into
  `<answer> a; b; …`, else the state names the next entry — the bookkeeping and counting a
  pretrained LLM can already do for any k. These hold no question, so they are not
  multi-objective QA tasks.
- **Question-list drills** (generic, any length): a task prompt listing k <= `drill_max_facts`
  numbered questions, then the first turn (`Start. Next: Q1.` and the search for question 1)
  — starting on a list of any length, as a pretrained LLM does. Only the first turn: no
  `<info>`, no answer, no later question. (Drills that began at question j > 1 with the
  earlier answers in the state taught the model to write answers it had never read: a state
  must come from the context, so those need the earlier turns, which would be the N-turn
  task itself. The N-turn task is never shown above 2 objectives.)

Names never repeat across rounds, so nothing can be memorised: the loss only falls by
copying.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, replace
from pathlib import Path

import pyarrow.parquet as pq

from mem1_core.config import TeacherConfig
from mem1_core.data.prompts import (
    ANSWER_CLOSE,
    ANSWER_OPEN,
    INFO_CLOSE,
    INFO_OPEN,
    IS_CLOSE,
    IS_OPEN,
    join_answers,
)


@dataclass
class Source:
    """One fresh world's data: teacher trees, documents and drills."""

    seed: int
    trees: list
    ctx_rows: list[bool]
    texts: list[list[int]]


def world_config(cfg, seed: int):
    """`cfg` with its world generated from `seed`."""
    return replace(cfg, world=replace(cfg.world, seed=seed))


def build_source(cfg, tok, root: Path, seed: int, pcfg) -> Source:
    """Generate world `seed`, play the teacher on its 1- and 2-objective tasks under every
    memory of `pcfg.memories`, and cut its documents and drills into token rows."""
    from mem1_core.data.compose import compose
    from mem1_core.data.qa_data import world_questions
    from mem1_core.domains.inputs import make_env
    from mem1_core.qa.tasks import ensure_world
    from mem1_core.rollout.loop import tasks_from_table
    from mem1_core.runs.layout import RunPaths
    from mem1_core.training.sft import teacher_trajectories
    from mem1_core.trajectory.record import turn_paths
    from mem1_core.trajectory.tree import flatten

    wcfg = world_config(cfg, seed)
    paths = RunPaths(root / f"seed{seed}")
    world = ensure_world(wcfg, paths)
    questions = world_questions(pq.read_table(world / "questions.parquet")).table
    env = make_env(wcfg, paths, tok)
    trees, ctx = [], []
    for n in pcfg.objectives:
        table, _ = compose(questions, n, "per_source", seed, None, shuffle=True)
        tasks = tasks_from_table(table)[: pcfg.tasks_per_world]
        for memory in pcfg.memories:
            trajs = teacher_trajectories(
                tasks, tok, env, cfg.rollout, memory=memory, teacher=TeacherConfig(seed=seed)
            )
            for t in trajs:
                if t.turns:
                    trees.append(flatten(turn_paths(t)))
                    ctx.append(True)
    corpus = pq.read_table(world / "corpus.parquet")
    rng = random.Random(seed)
    texts = _doc_rows(corpus["contents"].to_pylist(), tok, pcfg.text_len, rng)
    texts += _drill_rows(corpus, tok, pcfg, rng)
    texts += _question_drill_rows(questions, tok, pcfg, rng)
    rng.shuffle(texts)
    # the world's files are regenerated from the seed on resume; keep the disk small
    import shutil

    shutil.rmtree(paths.root, ignore_errors=True)
    return Source(seed, trees, ctx, texts)


def _doc_rows(docs: list[str], tok, length: int, rng: random.Random) -> list[list[int]]:
    """Documents packed into rows of up to `length` tokens (eos between documents)."""
    rng.shuffle(docs)
    rows, cur = [], []
    for d in docs:
        cur += tok.encode(d, add_special_tokens=False) + [tok.eos_token_id]
        while len(cur) >= length:
            rows.append(cur[:length])
            cur = cur[length:]
    return rows


def drill_text(facts: list[str], new_fact: str, passage: str, wanted: int) -> str:
    """One list drill: the prompt's last line (`wanted` answers), a state of k numbered facts,
    a passage, then the state carried forward with the (k+1)-th fact read from the passage;
    then, if the list is complete (k + 1 == wanted), every fact copied into an answer, else
    the state names the next entry (the count decides whether to go on or to answer)."""
    from mem1_core.data.prompts import prompt_end

    k = len(facts)
    if not k + 1 <= wanted:
        raise ValueError(f"a drill of {k + 1} facts cannot want {wanted}")
    state = " ".join(f"Q{i}: {f}." for i, f in enumerate(facts, 1))
    state = state or "Start."
    nxt = " ".join(f"Q{i}: {f}." for i, f in enumerate([*facts, new_fact], 1))
    head = f"{prompt_end(wanted)}\n{IS_OPEN} {state} Next: Q{k + 1}. {IS_CLOSE}"
    head += f"{INFO_OPEN} {passage} {INFO_CLOSE}"
    if k + 1 < wanted:
        return f"{head}{IS_OPEN} {nxt} Next: Q{k + 2}. {IS_CLOSE}"
    return (
        f"{head}{IS_OPEN} {nxt} {IS_CLOSE}"
        f"{ANSWER_OPEN} {join_answers([*facts, new_fact])}{ANSWER_CLOSE}"
    )


def _drill_rows(corpus, tok, pcfg, rng: random.Random) -> list[list[int]]:
    titles = corpus["title"].to_pylist()
    contents = corpus["contents"].to_pylist()
    rows = []
    for _ in range(pcfg.drills_per_world):
        k = rng.randint(0, pcfg.drill_max_facts - 1)
        facts = [
            rng.choice(titles) if rng.random() < 0.7 else str(rng.randint(1000, 2099))
            for _ in range(k)
        ]
        # half the lists are complete after this entry, half want more (up to the longest)
        top = max(k + 1, pcfg.drill_max_facts)
        wanted = k + 1 if rng.random() < 0.5 or k + 1 == top else rng.randint(k + 2, top)
        j = rng.randrange(len(titles))
        # the new fact is the passage's own title: read from <info>, not remembered
        ids = tok.encode(
            drill_text(facts, titles[j], contents[j], wanted), add_special_tokens=False
        )
        rows.append(ids[: pcfg.text_len])
    return rows


def question_drill_text(questions: list[str], plans: list[str]) -> tuple[str, str]:
    """One question-list drill: (the task prompt of `questions`, the first turn, which searches
    for question 1), written as the scripted teacher writes that turn."""
    from mem1_core.data.prompts import QUERY_CLOSE, QUERY_OPEN, task_prompt
    from mem1_core.qa.teacher import ScriptedTeacher

    first = json.loads(plans[0])[0]
    state = f"{ScriptedTeacher.state_text(None, [], [])} Next: Q1."
    turn = f"{IS_OPEN} {state} {IS_CLOSE}{QUERY_OPEN} {first['query']}{QUERY_CLOSE}"
    return task_prompt(questions), turn


def _question_drill_rows(questions, tok, pcfg, rng: random.Random) -> list[list[int]]:
    rows = [r for r in questions.to_pylist() if json.loads(r.get("plan") or "[]")]
    out = []
    for _ in range(pcfg.question_drills_per_world if rows else 0):
        k = rng.randint(1, min(pcfg.drill_max_facts, len(rows)))
        picked = rng.sample(rows, k)
        prompt, turn = question_drill_text(
            [r["question"] for r in picked], [r["plan"] for r in picked]
        )
        # prompt and turn encoded apart, as the rollout builds a context from id segments
        out.append(
            tok.encode(prompt, add_special_tokens=False)
            + tok.encode(turn, add_special_tokens=False)
        )
    return out
