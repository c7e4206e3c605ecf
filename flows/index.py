"""Flow `build-index`: the retrieval index of a profile's corpus, cached on the corpus
fingerprint (a rerun over an unchanged corpus reuses the index), published as a table
artifact (documents, build time, index size). A prebuilt `retrieval.index` is reported as
it is; with `retrieval.url` there is nothing to build."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from prefect import flow, task

from flows.common import build_config, publish_table, run_dir, stage_run_name
from mem1_core.config import Config

# The library's retrieval and run assets are imported where they are used: importing this
# module (as `prefect deploy` does) stays free of pandas, torch and transformers.


@task(name="corpus", cache_policy=None)
def corpus_path(cfg: Config, out: Path) -> Path:
    """The corpus the run's domain searches (QA: the generated world's, built if missing, or
    `retrieval.corpus`)."""
    from mem1_core.domains.registry import domain_of
    from mem1_core.runs.layout import RunPaths

    return domain_of(cfg).index_corpus(cfg, RunPaths(out))


# No Prefect cache: `ensure_index` caches on the corpus fingerprint itself, which also
# survives outside Prefect (the CLI, another flow run with a fresh cache store).
@task(name="build-index", cache_policy=None)
def build_or_reuse(corpus: Path, kind: str, root: Path, options: dict[str, Any]) -> dict[str, Any]:
    from mem1_core.retrieval import ensure_index

    index_dir, built = ensure_index(corpus, kind, root, show_progress=False, **options)
    return describe(index_dir, built)


def describe(index_dir: Path, built: bool) -> dict[str, Any]:
    from mem1_core.retrieval import read_manifest
    from mem1_core.retrieval.index import index_size_bytes

    m = read_manifest(index_dir)
    return {
        "index": str(index_dir),
        "kind": m.kind.value,
        "documents": m.documents,
        "build_seconds": m.build_seconds,
        "size_mb": round(index_size_bytes(index_dir) / 2**20, 3),
        "cached": not built,
        "dropped_documents": m.corpus_report.get("dropped", 0),
        "corpus_fingerprint": m.corpus_fingerprint[:16],
    }


@flow(name="build-index", flow_run_name=stage_run_name, log_prints=True)
def build_index_flow(
    profile: str = "tiny",
    config_path: str | None = None,
    overrides: list[str] | None = None,
    runs_root: str | None = None,
    index_root: str | None = None,
    out_dir: str | None = None,
    config: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Corpus of the profile -> index (built or reused) -> table artifact. With `out_dir`
    (the pipeline's run directory) everything goes there, in the run layout of
    mem1_core.retrieval.run_index; else under `runs_root/index-<profile>`. `config`: the
    parent flow's resolved config (built once)."""
    from mem1_core.domains.registry import domain_of
    from mem1_core.retrieval.run_index import index_options, prebuilt_index

    cfg = build_config(profile, config_path, overrides, config)
    if cfg.retrieval.url is not None:
        print(f"retrieval served at {cfg.retrieval.url}: no index to build")
        return {"url": cfg.retrieval.url, "kind": cfg.retrieval.kind}
    if not domain_of(cfg).uses_index(cfg):
        print(f"env.kind={cfg.env.kind}: the run searches no index of its own, none to build")
        return {"kind": "none"}
    if cfg.retrieval.index is not None:  # prebuilt (`mem1 index`): used as it is
        result = describe(prebuilt_index(cfg), built=False)
        print(f"prebuilt {result['kind']} index {result['index']}")
        return result
    out = Path(out_dir) if out_dir else run_dir(runs_root, f"index-{profile}")
    corpus = corpus_path(cfg, out)
    root = Path(index_root) if index_root else out / "indexes"
    result = build_or_reuse(corpus, cfg.retrieval.kind, root, index_options(cfg))
    print(f"{'reused' if result['cached'] else 'built'} {result['kind']} index {result['index']}")
    publish_table(
        f"index-{profile}",
        [{k: v for k, v in result.items() if k != "index"}],
        f"Retrieval index for profile {profile}: {result['index']}",
    )
    return result
