"""The prose a newcomer reads: links that resolve, a short README, short table cells, and a README that names
only subcommands and settings that exist (and every setting that does)."""
from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from jido.cli import _DELEGATES, build_parser
from jido.config import FLAT_CONFIGS, JSON_CONFIGS
from jido.server.config import ServerConfig

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCS = [README, ROOT / "CHANGELOG.md", ROOT / "benchmarks" / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
TABLE_DOCS = [README, *sorted((ROOT / "docs").glob("*.md"))]
MAX_README_LINES = 200
MAX_CELL_CHARS = 300
LINK = re.compile(r"\]\(([^)\s]+)\)")


def _table_cells(text: str) -> list[str]:
    cells = []
    for line in text.splitlines():
        if line.startswith("|") and line.rstrip().endswith("|"):
            cells += [cell.strip() for cell in re.split(r"(?<!\\)\|", line.strip()[1:-1])]
    return cells


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(doc: Path) -> None:
    broken = []
    for target in LINK.findall(doc.read_text(encoding="utf-8")):
        if re.match(r"[a-z]+:", target) or target.startswith("#"):
            continue
        path = (doc.parent / target.split("#", 1)[0]).resolve()
        if not path.exists():
            broken.append(target)
    assert broken == []


def test_readme_fits_on_a_few_screens() -> None:
    assert len(README.read_text(encoding="utf-8").splitlines()) <= MAX_README_LINES


@pytest.mark.parametrize("doc", TABLE_DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_table_cell_is_a_paragraph(doc: Path) -> None:
    long_cells = [cell[:80] for cell in _table_cells(doc.read_text(encoding="utf-8")) if len(cell) > MAX_CELL_CHARS]
    assert long_cells == []


def test_readme_names_only_jido_subcommands_that_exist() -> None:
    parser = build_parser()
    subparsers = next(action for action in parser._actions if action.dest == "command")
    commands = set(subparsers.choices) | set(_DELEGATES)
    # a command as typed: `jido X` in a code span, or a line of a code block that runs .venv/bin/jido X
    named = set(re.findall(r"(?:`|bin/)jido ([a-z][a-z-]*)", README.read_text(encoding="utf-8")))
    assert named - commands == set()


def _live_settings() -> set[str]:
    names = {field.name for cls in FLAT_CONFIGS for field in dataclasses.fields(cls)}
    return names | set(JSON_CONFIGS) | {field.name for field in dataclasses.fields(ServerConfig)}


def _readme_settings() -> set[str]:
    text = README.read_text(encoding="utf-8")
    table = text[text.index("| setting |"):]
    names: set[str] = set()
    for line in table.splitlines()[2:]:
        if not line.startswith("|"):
            break
        names |= set(re.findall(r"`([a-z_]+)`", line.split("|")[1]))
    return names


def test_readme_settings_table_matches_the_config_classes() -> None:
    readme, live = _readme_settings(), _live_settings()
    assert (sorted(readme - live), sorted(live - readme)) == ([], [])
