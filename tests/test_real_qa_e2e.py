"""Real QA data end to end: the stage functions of the flows on small
files in the public row formats, with a hub-style model, tokenizer and encoder loaded from
local directories, as on a cluster without hub access (docs/paper-profile.md).

HotpotQA as its original files are (a JSON array: `_id`, `supporting_facts` as
[[title, sent_id]], `context` as [[title, [sentences]]]) for training and as the hub's rows
exported to JSON Lines (`id`, column dicts) for test; NQ in FlashRAG's rows (`id`,
`question`, `golden_answers` with several aliases). Entities are invented.

compose (hotpotqa+nq, 2 objectives; the test split from the held-out files) -> `mem1
export-corpus` of both HotpotQA files -> a BM25 index as the build-index flow makes it and a
dense one prebuilt with `mem1 index` (a BERT encoder built from config) -> two PPO
iterations from the Qwen2-architecture stand-in of tests/conftest.py (byte-level BPE, tags
as text), no warm start, retrieving from the prebuilt dense index -> the evaluation stage
at N = 1, 2 (its dense index built in the run from the corpus).
EM and F1 are checked on the real gold aliases by an agent that answers with chosen
aliases through the same environment and tokenizer.
"""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from mem1_core.config import load_config
from mem1_core.data.prompts import ANSWER_CLOSE, ANSWER_OPEN, IS_CLOSE, IS_OPEN, join_answers
from mem1_core.rollout.generation import Generation
from mem1_core.runs.layout import RunPaths

pytestmark = pytest.mark.slow  # the whole path: ~30 s of one core, most of it PPO

PEOPLE = [
    "Velmora Quist",
    "Oskar Brannt",
    "Ilse Varro",
    "Tomas Kelvane",
    "Rhea Dunmoor",
    "Caspar Ollin",
    "Mirela Sandt",
    "Joren Halvik",
    "Anouk Pereth",
    "Bastian Lorre",
    "Edda Finmark",
    "Lucan Merrow",
]
PLACES = [
    "Tarrow Mill",
    "Kesh Observatory",
    "Orsk Chapel",
    "Veldt Bridge",
    "Halm Library",
    "Dorrin Lighthouse",
    "Pellan Theatre",
    "Quor Abbey",
    "Brisk Foundry",
    "Saltmere Hall",
    "Ivel Tower",
    "Corran Docks",
]
CITIES = ["Tolm", "Ardeval", "Nisk", "Perrow"]
N_TRAIN, N_TEST = 8, 4  # HotpotQA rows of the train and dev files (NQ: the same)
SPLITS_AND_NS = [("train", 2), ("test", 1), ("test", 2)]


def hotpot_row(i: int) -> dict:
    """A bridge question in the original HotpotQA format."""
    place, person, city, year = PLACES[i], PEOPLE[i], CITIES[i % 4], str(1800 + 7 * i)
    other = PLACES[i % 3]  # the same distractor paragraph in several rows and both files
    return {
        "_id": f"5a8b{i:020x}",
        "question": f"In what year was the founder of the {place} born?",
        "answer": year,
        "supporting_facts": [[place, 1], [person, 0]],
        "context": [
            [place, [f"The {place} is a building in {city}.", f" It was founded by {person}."]],
            [person, [f"{person} was born in {year}.", f" {person} lived in {city}."]],
            [f"{other} (film)", [f"{other} is a film.", " It is set in a harbour town."]],
        ],
        "type": "bridge",
        "level": "medium",
    }


def hub_row(row: dict) -> dict:
    """The same question as the hub's `hotpotqa/hotpot_qa` rows (exported to JSON Lines)."""
    titles, sent_ids = zip(*row["supporting_facts"], strict=True)
    ctx_titles, sentences = zip(*row["context"], strict=True)
    return {
        "id": row["_id"],
        "question": row["question"],
        "answer": row["answer"],
        "type": row["type"],
        "level": row["level"],
        "supporting_facts": {"title": list(titles), "sent_id": list(sent_ids)},
        "context": {"title": list(ctx_titles), "sentences": [list(s) for s in sentences]},
    }


def nq_row(i: int, split: str) -> dict:
    """A FlashRAG NQ row: several gold aliases, the last a short form of the first."""
    person = PEOPLE[i]
    return {
        "id": f"{split}_{i}",
        "question": f"who designed the bell of the {PLACES[i].lower()}",
        "golden_answers": [person, f"Master {person}", person.split()[-1]],
    }


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.fixture(scope="module")
def qa_files(tmp_path_factory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("qa")
    train = [hotpot_row(i) for i in range(N_TRAIN)]
    (d / "hotpot_train_v1.1.json").write_text(json.dumps(train))
    test = [hub_row(hotpot_row(i)) for i in range(N_TRAIN, N_TRAIN + N_TEST)]
    return {
        "hotpotqa": d / "hotpot_train_v1.1.json",
        "hotpotqa_test": write_jsonl(d / "hotpot_dev.jsonl", test),
        "nq": write_jsonl(d / "nq_train.jsonl", [nq_row(i, "train") for i in range(N_TRAIN)]),
        "nq_test": write_jsonl(
            d / "nq_test.jsonl", [nq_row(i, "test") for i in range(N_TRAIN, N_TRAIN + N_TEST)]
        ),
    }


@pytest.fixture(scope="module")
def corpus(qa_files, tmp_path_factory) -> Path:
    """`mem1 export-corpus` of both HotpotQA files: one document per paragraph title."""
    from mem1_core.cli.main import main

    out = tmp_path_factory.mktemp("corpus") / "hotpot_corpus.parquet"
    args = ["export-corpus", "--input", str(qa_files["hotpotqa"])]
    assert main([*args, "--input", str(qa_files["hotpotqa_test"]), "--out", str(out)]) == 0
    return out


@pytest.fixture(scope="module")
def encoder_dir(corpus, tmp_path_factory) -> Path:
    from mem1_core.retrieval.corpus import format_contents
    from mem1_core.retrieval.tiny import build_tiny_encoder

    docs = pq.read_table(corpus).to_pylist()
    texts = [format_contents(d["title"], d["contents"]) for d in docs]
    return build_tiny_encoder(tmp_path_factory.mktemp("encoder") / "e5-tiny", texts * 3)


def real_data_config(qa_files, corpus, encoder_dir, hub_dir, *extra: str):
    """The `paper` profile's choices where they matter (hotpotqa+nq, dense retrieval, a
    pretrained model by path) at the smoke profile's sizes, with local paths for all."""
    return load_config(
        "smoke",
        overrides=[
            "data.source=hotpotqa+nq",
            *(f"data.{k}={v}" for k, v in qa_files.items()),
            "data.eval_objectives=[1, 2]",
            "data.max_eval_tasks=4",
            "retrieval.kind=dense",
            f"retrieval.encoder={encoder_dir}",
            f"retrieval.corpus={corpus}",
            f"model.name_or_path={hub_dir}",
            "rollout.gen_tokens_base=16",
            "rollout.gen_tokens_per_objective=4",
            "ppo.iterations=2",
            "ppo.checkpoint_every=1",
            "ppo.tasks_per_iteration=4",
            "ppo.minibatch_size=4",
            "ppo.micro_batch_size=4",
            "ppo.minutes=60",
            # the untrained stand-in never answers (reward 0): an entropy bonus moves it
            "ppo.entropy_coef=0.05",
            *extra,
        ],
    )


class AliasAnswerer:
    """An agent that answers at once with the aliases `pick` chooses from each task's gold
    lists: EM and F1 of known answers, through the environment that scores the models."""

    reads_trajectories = True

    def __init__(self, tokenizer, tasks, pick):
        self.tok, self.pick = tokenizer, pick
        self.golden = {t.task_id: t.golden_answers for t in tasks}

    def generate(self, contexts, params, generator=None, trajectories=None) -> list[Generation]:
        out = []
        for traj in trajectories:
            answers = [self.pick(golds) for golds in self.golden[traj.task_id]]
            text = f"{IS_OPEN} Start. {IS_CLOSE}{ANSWER_OPEN} {join_answers(answers)}{ANSWER_CLOSE}"
            ids = self.tok.encode(text, add_special_tokens=False)
            out.append(Generation(ids, [0.0] * len(ids), "stop"))
        return out


@pytest.fixture(scope="module")
def cfg(qa_files, corpus, encoder_dir, hub_dir):
    return real_data_config(qa_files, corpus, encoder_dir, hub_dir)


@pytest.fixture(scope="module")
def paths(tmp_path_factory) -> RunPaths:
    return RunPaths(tmp_path_factory.mktemp("run"))


@pytest.fixture(scope="module")
def composed(cfg, paths) -> dict:
    """The compose-tasks flow's task (ensure_tasks) for each (split, N)."""
    from flows.data import compose_one

    return {(s, n): compose_one.fn(cfg, paths, s, n) for s, n in SPLITS_AND_NS}


@pytest.fixture(scope="module")
def indexes(qa_files, corpus, encoder_dir, hub_dir, paths, tmp_path_factory) -> dict[str, Path]:
    """BM25 as the build-index flow builds it (under the run's indexes/, by fingerprint) and
    a dense index as docs/paper-profile.md builds one before a run (`mem1 index`)."""
    from flows.index import build_or_reuse, corpus_path
    from mem1_core.cli.main import main
    from mem1_core.retrieval.run_index import index_options

    bm25_cfg = real_data_config(qa_files, corpus, encoder_dir, hub_dir, "retrieval.kind=bm25")
    assert corpus_path.fn(bm25_cfg, paths.root) == corpus
    built = build_or_reuse.fn(corpus, "bm25", paths.indexes, index_options(bm25_cfg))
    assert not built["cached"]
    prebuilt = tmp_path_factory.mktemp("prebuilt") / "hotpot-e5"
    args = ["index", "--corpus", str(corpus), "--kind", "dense", "--model", str(encoder_dir)]
    assert main([*args, "--out", str(prebuilt)]) == 0
    return {"bm25": Path(built["index"]), "dense": prebuilt}


@pytest.fixture(scope="module")
def trained(qa_files, corpus, encoder_dir, hub_dir, paths, composed, indexes) -> dict:
    """Two PPO iterations from the pretrained stand-in (no warm start on real data:
    init=None, as flows/stages.py passes), retrieving from the prebuilt dense index."""
    from mem1_core.training.train_rl import train_rl

    ppo_cfg = real_data_config(
        qa_files, corpus, encoder_dir, hub_dir, f"retrieval.index={indexes['dense']}"
    )
    mp = pytest.MonkeyPatch()
    mp.setenv("WANDB_MODE", "disabled")
    try:
        result = train_rl(ppo_cfg, paths.root, init=None, use_ray=False, show=False)
    finally:
        mp.undo()
    return result | {"indexes_after": sorted(p.name for p in paths.indexes.iterdir())}


def test_tasks_keep_every_alias_and_hold_out_the_test_files(composed):
    files = {key: Path(c["path"]) for key, c in composed.items()}
    assert composed["train", 2]["sources"] == "hotpotqa, nq"
    train = pq.read_table(files["train", 2]).to_pylist()
    # per source: 8 HotpotQA and 8 NQ training questions -> 4 + 4 two-objective tasks
    assert len(train) == N_TRAIN and all(r["n_objectives"] == 2 for r in train)
    assert sorted(r["sources"][0] for r in train) == ["hotpotqa"] * 4 + ["nq"] * 4
    assert all(len(set(r["sources"])) == 1 for r in train)
    nq = [nq_row(i, "train") for i in range(N_TRAIN)]
    nq += [nq_row(i, "test") for i in range(N_TRAIN, N_TRAIN + N_TEST)]
    gold_of = {r["id"]: (r["question"], r["golden_answers"]) for r in nq}
    for i in range(N_TRAIN + N_TEST):
        row = hotpot_row(i)
        gold_of[row["_id"]] = (row["question"], [row["answer"]])
    test = [r for n in (1, 2) for r in pq.read_table(files["test", n]).to_pylist()]
    for r in train + test:  # each question beside all its aliases, in order
        for qid, q, gold in zip(
            r["question_ids"], r["questions"], r["golden_answers"], strict=True
        ):
            assert (q, gold) == gold_of[qid]
    # the sources take turns, so the capped test tasks (data.max_eval_tasks) keep the mix
    n1 = pq.read_table(files["test", 1])["sources"].to_pylist()
    assert n1 == [["hotpotqa"], ["nq"], ["hotpotqa"], ["nq"]]
    train_ids = {q for r in train for q in r["question_ids"]}
    test_ids = {q for r in test for q in r["question_ids"]}
    assert len(train_ids) == 2 * N_TRAIN and len(test_ids) == 2 * N_TEST
    assert not train_ids & test_ids  # the test tasks come from the held-out files


def test_the_exported_corpus_is_indexed_and_found(corpus, indexes):
    from mem1_core.retrieval import load_index, read_manifest

    docs = pq.read_table(corpus).to_pylist()
    # one document per title across both files (the distractors repeat)
    assert len(docs) == len({d["title"] for d in docs}) == 2 * (N_TRAIN + N_TEST) + 3
    founder = next(d for d in docs if d["title"] == PLACES[0])
    assert (
        founder["contents"]
        == f"The {PLACES[0]} is a building in Tolm. It was founded by {PEOPLE[0]}."
    )
    assert {read_manifest(d).documents for d in indexes.values()} == {len(docs)}
    bm25 = load_index(indexes["bm25"])
    for i in range(N_TRAIN + N_TEST):  # BM25 finds a supporting paragraph of every question
        row = hotpot_row(i)
        (hits,) = bm25.search([row["question"]], 3)
        assert {h.title for h in hits} & {t for t, _ in row["supporting_facts"]}
    (dense_hits,) = load_index(indexes["dense"]).search([hotpot_row(0)["question"]], 3)
    assert len(dense_hits) == 3 and {h.title for h in dense_hits} <= {d["title"] for d in docs}


def test_two_ppo_iterations_from_the_pretrained_stand_in(cfg, paths, indexes, trained):
    from mem1_core.domains.inputs import ensure_tokenizer
    from mem1_core.models.tags import tag_scheme
    from mem1_core.trajectory.record import read_trajectories

    tok = ensure_tokenizer(cfg, paths)
    assert tag_scheme(tok) == "text"  # the hub stand-in: its tags stay text
    assert trained["indexes_after"] == [indexes["bm25"].name]  # the prebuilt dense one used
    assert trained["iterations"] == 2 and trained["checkpoint"].endswith("iter_000002")
    rows = paths.read_metrics()
    assert [r["iteration"] for r in rows] == [0, 1]
    assert all(r["train/skipped_steps"] == 0 and r["train/optimizer_steps"] >= 1 for r in rows)
    assert rows[-1]["eval/tasks"] == 4  # held-out 2-objective tasks, greedy
    trajs = read_trajectories(paths.part(1))
    assert len(trajs) == 4 and all(t.turns for t in trajs)
    assert all(x.info_ids for t in trajs for x in t.turns[:-1])  # every turn got an <info>


def test_evaluation_at_one_and_two_objectives(cfg, paths, indexes, trained):
    """The evaluation stage (flows/stages.py: evaluate_objective_scaling) on the trained
    policy; its config has no retrieval.index, so the run builds a dense index itself."""
    from mem1_core.evaluation.stage import run_objective_scaling
    from mem1_core.retrieval import read_manifest

    policy = str(Path(trained["checkpoint"]) / "policy")
    out = paths.root / "eval"
    ev = run_objective_scaling(cfg, paths.root, out, [("mem1-ppo", policy, "mem1")], progress=False)
    (dense,) = [p for p in paths.indexes.iterdir() if p.name.startswith("dense-")]
    fingerprint = read_manifest(indexes["dense"]).corpus_fingerprint
    assert read_manifest(dense).corpus_fingerprint == fingerprint
    table = {(r["agent"], r["N"]) for r in ev["headline"]}
    # the scripted teacher plays from the world's plans; real questions have none
    assert table == {("mem1-ppo", 1), ("mem1-ppo", 2)}
    assert (out / "metrics.csv").is_file()
    with pytest.raises(ValueError, match="nothing to evaluate"):
        run_objective_scaling(cfg, paths.root, out / "none", [], teacher=True, progress=False)


def test_em_and_f1_on_the_gold_aliases(cfg, paths, composed):
    """Known answers through the environment that scores the models: any alias scores 1
    after SQuAD normalisation; a partial name scores its token F1."""
    from mem1_core.domains.inputs import ensure_tokenizer, load_tasks, make_env
    from mem1_core.evaluation.scaling import Agent, evaluate_scaling
    from mem1_core.trajectory.record import read_trajectories

    tok = ensure_tokenizer(cfg, paths)
    env = make_env(cfg, paths, tok)
    tasks_by_n = {n: load_tasks(cfg, paths, "test", n) for n in (1, 2)}
    every = [t for ts in tasks_by_n.values() for t in ts]
    picks = {
        "last-alias": lambda golds: golds[-1],  # NQ: the surname alone, an alias of its own
        "first-alias": lambda golds: f"the {golds[0].upper()}.",  # normalised: EM 1
        "first-word": lambda golds: golds[0].split()[0],
    }
    agents = [Agent(name, "mem1", None, AliasAnswerer(tok, every, p)) for name, p in picks.items()]
    out = paths.root / "aliases"
    scored = evaluate_scaling(agents, tok, env, tasks_by_n, cfg.rollout, out, False)
    by = {(r.agent, r.n_objectives): r for r in scored.itertuples()}
    for n in (1, 2):
        for name in ("last-alias", "first-alias"):
            assert by[name, n].em_frac == 1.0 and by[name, n].f1_frac == 1.0, (name, n)
            assert by[name, n].em_sum == n
    for traj in read_trajectories(out / "trajectories" / "first-word_n1.parquet"):
        (gold,) = traj.golden_answers
        # "Velmora" against "Velmora Quist": no EM, F1 2PR/(P+R) = 2/3; a year stays whole
        want = (1.0, 1.0) if len(gold) == 1 else (0.0, 2 / 3)
        assert (traj.em[0], traj.f1[0]) == pytest.approx(want), (gold, traj.answer)
