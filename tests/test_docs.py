"""The docs kept honest: the README's results agree with docs/results.md, relative links (files
and #anchors) resolve, the config fields and CLI flags the docs name exist (read from the config
dataclasses and the argparse parsers), and the code tour names files and functions that exist.

The history pages (docs/log.md, CHANGELOG.md) may name fields and flags since renamed, so only
their links are checked."""

from __future__ import annotations

import argparse
import ast
import dataclasses
import re
import shlex
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
RESULTS = ROOT / "docs" / "results.md"
PAGES = [README, *sorted((ROOT / "docs").glob("*.md"))]
HISTORY = {ROOT / "docs" / "log.md", ROOT / "CHANGELOG.md"}
CURRENT = [p for p in PAGES if p not in HISTORY]

FENCE = re.compile(r"^\s*(```|~~~)")
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(([^()\s]+)(?:\s+\"[^\"]*\")?\)")
CODE_SPAN = re.compile(r"(`+)(.+?)\1")
FILE_EXTENSIONS = {
    "md", "py", "yaml", "yml", "json", "jsonl", "png", "csv", "parquet", "pt", "txt", "gz",
    "safetensors", "html", "toml", "cfg", "sh", "bin", "gguf", "log",
}  # fmt: skip


# ---- reading markdown ------------------------------------------------------------------------


def prose_lines(text: str) -> list[tuple[int, str]]:
    """(line number, line) outside fenced code blocks."""
    out, fenced = [], False
    for i, line in enumerate(text.splitlines(), 1):
        if FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            out.append((i, line))
    return out


def code_snippets(text: str) -> list[tuple[int, str]]:
    """(line number, code): every inline code span outside fences, and every logical line of a
    fenced block (a line ending in `\\` joined with the next)."""
    out: list[tuple[int, str]] = []
    fenced, pending, start = False, "", 0
    for i, line in enumerate(text.splitlines(), 1):
        if FENCE.match(line):
            fenced = not fenced
            continue
        if fenced:
            if not pending:
                start = i
            if line.rstrip().endswith("\\"):
                pending += line.rstrip()[:-1] + " "
                continue
            out.append((start, pending + line))
            pending = ""
        else:
            out += [(i, m.group(2)) for m in CODE_SPAN.finditer(line)]
    return out


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: markup dropped, lowercase, punctuation removed, spaces to
    hyphens."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link: its text
    text = re.sub(r"`([^`]*)`", lambda m: m.group(1).replace("<", "").replace(">", ""), text)
    text = re.sub(r"<[^>]+>", "", text).strip().lower()  # HTML outside code spans
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """The anchors of a markdown page: its headings' slugs (repeats numbered as GitHub does)
    and explicit `<a id=…>` / `<a name=…>`."""
    seen: dict[str, int] = {}
    found: set[str] = set()
    for _, line in prose_lines(path.read_text()):
        m = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if m:
            base = slug(m.group(1))
            k = seen.get(base, 0)
            seen[base] = k + 1
            found.add(base if k == 0 else f"{base}-{k}")
        found |= set(re.findall(r"<a\s+(?:id|name)=\"([^\"]+)\"", line))
    return found


# ---- the slug itself, against GitHub's own anchors --------------------------------------------


@pytest.mark.parametrize(
    ("heading", "anchor"),
    [  # anchors as GitHub renders them for these headings
        ("The headline: `eval/headline.json`", "the-headline-evalheadlinejson"),
        ("3. Layout", "3-layout"),
        ("2026-12-01 — a pretrained base for the embedded default", "2026-12-01--a-pretrained-base-for-the-embedded-default"),
        ("Settings: `data/experiments/<name>.yaml`", "settings-dataexperimentsnameyaml"),
        ("The embedded default (`tiny`)", "the-embedded-default-tiny"),
    ],
)  # fmt: skip
def test_slug_matches_githubs_anchor(heading, anchor):
    assert slug(heading) == anchor


# ---- links -----------------------------------------------------------------------------------


def test_every_relative_link_and_anchor_resolves():
    broken = []
    for page in PAGES:
        for i, line in prose_lines(page.read_text()):
            line = CODE_SPAN.sub("", line)
            for m in LINK.finditer(line):
                target = m.group(1)
                if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
                    continue
                file, _, anchor = target.partition("#")
                dest = (page.parent / file).resolve() if file else page
                where = f"{page.relative_to(ROOT)}:{i}: {target}"
                if not dest.exists():
                    broken.append(f"{where} (no such file)")
                elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
                    broken.append(f"{where} (no heading with that anchor in {dest.name})")
    assert not broken, "broken links:\n" + "\n".join(broken)


# ---- config fields ---------------------------------------------------------------------------


def config_sections() -> dict[str, set[str]]:
    """section -> its field names, from the config dataclasses."""
    from mem1_core.config.run import Config

    hints = {f.name: f for f in dataclasses.fields(Config)}
    sections = {}
    for name, f in hints.items():
        default = f.default_factory() if f.default_factory is not dataclasses.MISSING else None
        if dataclasses.is_dataclass(default):
            sections[name] = {g.name for g in dataclasses.fields(default)}
    return sections


def experiment_keys() -> tuple[set[str], set[str]] | None:
    """The experiment file's own keys and its `eval:` keys, as the loader checks them."""
    from mem1_core.experiment import parse as spec

    keys, eval_keys = getattr(spec, "_KEYS", None), getattr(spec, "_EVAL_KEYS", None)
    return (set(keys), set(eval_keys)) if keys and eval_keys else None


def named_fields(code: str, sections: set[str]) -> list[tuple[str, str, str | None]]:
    """(section, field, subfield) for each config `section.field` and experiment
    `experiment.key[.sub]` in a code snippet; a file name (`data.md`), an attribute chain
    (`cfg.model.seed`) or a module path (`trajectory.logprobs.logprob_tolerance(…)`) is not one."""
    names = "|".join(sorted(sections | {"experiment"}))
    pattern = (
        rf"(?<![\w./$-])({names})\.([a-z_][a-z0-9_-]*)(?:\.([a-z_][a-z0-9_-]*))?(?![\w(/]|\.\w)"
    )
    found = []
    for m in re.finditer(pattern, code):
        if (m.group(3) or m.group(2)) in FILE_EXTENSIONS:
            continue
        if m.group(3) and m.group(1) != "experiment":
            continue  # three parts: a module path; a config field has two
        found.append((m.group(1), m.group(2), m.group(3)))
    return found


def test_named_fields_reads_fields_not_files_or_attributes():
    sections = {"model", "data", "ppo", "trajectory"}
    code = "--set ppo.iterations=8 data.md cfg.model.seed trajectory.logprobs.tol(1) model.seed"
    assert named_fields(code, sections) == [("ppo", "iterations", None), ("model", "seed", None)]
    got = named_fields("--set experiment.eval.worlds=[7] experiment.ray", sections)
    assert got == [("experiment", "eval", "worlds"), ("experiment", "ray", None)]


def test_every_config_field_the_docs_name_exists():
    sections = config_sections()
    exp = experiment_keys()
    unknown = []
    for page in CURRENT:
        for i, code in code_snippets(page.read_text()):
            for section, field, sub in named_fields(code, set(sections)):
                where = f"{page.relative_to(ROOT)}:{i}: {section}.{field}"
                if section != "experiment":
                    # `eval.worlds`: a key of an experiment file's `eval:`, not of the config
                    experiment_eval = section == "eval" and exp is not None and field in exp[1]
                    if field not in sections[section] and not experiment_eval:
                        unknown.append(where)
                elif exp is not None:
                    keys, eval_keys = exp
                    if field not in keys or (field == "eval" and sub and sub not in eval_keys):
                        unknown.append(where + (f".{sub}" if sub else ""))
    assert not unknown, "config fields the docs name that do not exist:\n" + "\n".join(unknown)


# ---- CLI flags -------------------------------------------------------------------------------


def options(parser: argparse.ArgumentParser) -> set[str]:
    return set(parser._option_string_actions)


def subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def launcher_flags() -> set[str]:
    """The flags of the launcher behind `./dev train-eval` and `./dev experiment`: every
    `add_argument("--flag", …)` in deployments/launch.py's parse_args."""
    tree = ast.parse((ROOT / "deployments" / "launch.py").read_text())
    fn = next(
        n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == "parse_args"
    )
    return {
        a.value
        for call in ast.walk(fn)
        if isinstance(call, ast.Call) and getattr(call.func, "attr", "") == "add_argument"
        for a in call.args
        if isinstance(a, ast.Constant) and str(a.value).startswith("--")
    }


def dev_verbs() -> dict[str, set[str] | None]:
    """`./dev` verb -> the flags it takes (None: its arguments go to pytest), read from the
    script's dispatch and the flags it handles itself (`"$a" = --keep-server`)."""
    dev = (ROOT / "dev").read_text()
    dispatch = dev[dev.index('case "${1:-}" in') :]
    own = set(re.findall(r'"\$a" = (--[a-z-]+)', dev))
    verbs: dict[str, set[str] | None] = {}
    for verb, handler in re.findall(r"^  ([a-z][a-z-]*)\) (.*)$", dispatch, flags=re.M):
        if "cmd_test" in handler:
            verbs[verb] = None
        elif "cmd_train_eval" in handler or "cmd_experiment" in handler:
            verbs[verb] = launcher_flags() | own
        else:
            verbs[verb] = set()
    return verbs


COMMAND = re.compile(r"(?:^|(?<=[\s;&|(]))(?:[\w./-]*/)?(mem1|\./dev)\s+([^#|;&]*)")


def commands(code: str) -> list[tuple[str, list[str]]]:
    """('mem1' or './dev', its words) for each command in a snippet; `[--opt]` brackets and
    `a|b` alternatives kept for the caller."""
    out = []
    for m in COMMAND.finditer(code):
        try:
            words = shlex.split(m.group(2))
        except ValueError:
            words = m.group(2).split()
        out.append((m.group(1), [w.strip("[]") for w in words if w.strip("[]")]))
    return out


def unknown_mem1_flags(words: list[str], parser: argparse.ArgumentParser) -> list[str]:
    current = [parser]
    bad = []
    for w in words:
        if w.startswith("--"):
            flag = w.split("=")[0]
            if flag != "--help" and not any(flag in options(p) for p in current):
                bad.append(flag)
        elif not w.startswith("-"):
            subs = [subcommands(p) for p in current]
            chosen = [s[c] for s in subs for c in w.split("|") if c in s]
            if chosen:
                current = chosen
            elif any(subs):
                return bad  # not a subcommand where one is due (a placeholder): stop here
    return bad


def test_commands_reads_each_command_and_its_words():
    code = ".venv/bin/mem1 train ppo --out R --set ppo.iterations=8 | tee x; ./dev test -x"
    assert commands(code) == [
        ("mem1", ["train", "ppo", "--out", "R", "--set", "ppo.iterations=8"]),
        ("./dev", ["test", "-x"]),
    ]


def test_every_cli_flag_the_docs_name_exists():
    from mem1_core.cli.main import build_parser

    parser = build_parser()
    verbs = dev_verbs()
    assert "--profile" in verbs["train-eval"] and "--keep-server" in verbs["experiment"]
    unknown = []
    for page in CURRENT:
        for i, code in code_snippets(page.read_text()):
            for program, words in commands(code):
                where = f"{page.relative_to(ROOT)}:{i}: {program} {' '.join(words)}"
                if program == "mem1":
                    bad = unknown_mem1_flags(words, parser)
                elif words and words[0] in verbs:
                    flags = verbs[words[0]]
                    if flags is None:
                        continue
                    bad = [
                        w.split("=")[0]
                        for w in words[1:]
                        if w.startswith("--") and w.split("=")[0] not in flags | {"--help"}
                    ]
                else:
                    bad = [f"no verb {words[0]!r}"] if words and words[0][0].isalpha() else []
                unknown += [f"{where}: {b}" for b in bad]
    assert not unknown, "CLI flags the docs name that do not exist:\n" + "\n".join(unknown)


# ---- the README's results against the results page ------------------------------------------


def section(text: str, heading: str) -> str:
    start = text.index(f"\n## {heading}\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end != -1 else len(text)]


def table_after(text: str, lead: str) -> list[list[str]]:
    """The rows (header first) of the first table after the line that starts with `lead`."""
    lines = text.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith(lead))
    rows = []
    for line in lines[at + 1 :]:
        if line.startswith("|"):
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if not all(re.fullmatch(r":?-+:?", c) for c in cells):
                rows.append(cells)
        elif rows:
            break
    return rows


NUMBER = re.compile(r"(?<![A-Za-z\d.,])(?:\d[\d,]*\.\d+|\d{3,}(?:,\d{3})*)")
"""A figure: a decimal, or an integer of 3 digits or more; not part of a name (`Qwen2.5`)."""


def numbers(text: str) -> set[str]:
    return set(NUMBER.findall(text))


def test_readme_held_out_table_matches_the_results_page():
    readme = section(README.read_text(), "Results at a glance")
    mine = table_after(readme, "World 4242 (held out)")
    # the glance is the SmolLM2 experiment's (the horizon experiment's tables come first)
    smol = section(RESULTS.read_text(), "The SmolLM2 experiment")
    theirs = table_after(smol, "World 4242 (held out): EM fraction")
    header, by_agent = theirs[0], {row[0]: row for row in theirs[1:]}
    assert mine and mine[0][0] == "agent"
    wrong = []
    for row in mine[1:]:
        agent = re.match(r"`([^`]+)`", row[0]).group(1)
        source = by_agent.get(f"{agent} · pooled") or by_agent[agent]
        for column, cell in zip(mine[0][1:], row[1:], strict=True):
            theirs_cell = source[header.index(column)]
            if numbers(cell) != numbers(theirs_cell):
                wrong.append(f"{agent} {column}: README {cell!r}, results.md {theirs_cell!r}")
    assert not wrong, "\n".join(wrong)


def test_every_figure_the_readme_quotes_from_its_results_is_on_the_results_page():
    text = README.read_text()
    summary = text[: text.index("\n## Run this\n")]
    summary = summary[summary.index("![") :]  # from the headline figure, after the intro
    quoted = "\n".join(
        line
        for line in (summary + section(text, "Results at a glance")).splitlines()
        if not line.startswith(("|", "!["))
    )
    quoted = re.sub(r"\]\([^)]*\)", "]", quoted)  # link targets are not figures
    missing = sorted(numbers(quoted) - numbers(RESULTS.read_text()))
    assert not missing, f"README figures not on docs/results.md: {missing}"


# ---- the code tour ---------------------------------------------------------------------------


def definitions(path: Path) -> set[str]:
    """Top-level functions and classes of a module, and `Class.method` for their methods."""
    found = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            found.add(node.name)
        if isinstance(node, ast.ClassDef):
            found |= {
                f"{node.name}.{f.name}"
                for f in node.body
                if isinstance(f, ast.FunctionDef | ast.AsyncFunctionDef)
            }
    return found


def test_the_code_tour_names_files_and_functions_that_exist():
    tour = (ROOT / "docs" / "code-tour.md").read_text()
    stops = re.findall(r"^\d+\. `([\w./-]+\.py)` · `([\w.]+)`", tour, flags=re.M)
    assert len(stops) >= 40
    missing = [
        f"{file} · {name}"
        for file, name in stops
        if not (ROOT / file).is_file() or name not in definitions(ROOT / file)
    ]
    assert not missing, "the code tour names what does not exist:\n" + "\n".join(missing)


def test_the_first_runnable_command_is_on_the_readmes_first_screen():
    first_screen = README.read_text().splitlines()[:40]
    assert any("`./dev train-eval --profile smoke`" in line for line in first_screen)
