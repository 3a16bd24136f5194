"""The docs say what the code does: their generated tables match the code's own tables, their
links lead somewhere, and the README stays a newcomer's page."""

from __future__ import annotations

import difflib
import re
import subprocess
import sys
from pathlib import Path

import pytest

from switchboard import docs
from switchboard.engine import validation
from switchboard.server.config import CONFIG_KEYS

ROOT = Path(__file__).resolve().parents[2]
README_MAX_LINES = 250
LINK = re.compile(r"\]\((?!https?://)(?P<path>[^)#\s]*)(?:#(?P<anchor>[^)\s]+))?\)")


def test_committed_docs_match_the_code() -> None:
    tables: dict[str, str] = {}
    for path in docs.documents():
        text = path.read_text()
        rendered = docs.render(text, tables)
        drift = "".join(difflib.unified_diff(text.splitlines(True), rendered.splitlines(True),
                                             str(path.relative_to(ROOT)), "generated", n=0))
        assert rendered == text, (f"{path.relative_to(ROOT)} differs from what the code "
                                  f"generates; run `{docs.FIX_COMMAND}`:\n{drift[:4000]}")


def test_every_table_is_in_a_doc() -> None:
    names = {match["name"] for path in docs.documents()
             for match in docs.BLOCK.finditer(path.read_text())}
    assert names == set(docs.TABLES)


def test_render_rewrites_only_the_blocks(monkeypatch) -> None:
    monkeypatch.setitem(docs.TABLES, "flags", lambda: "| a |\n")
    text = "before\n<!-- generated: flags -->\nstale\n<!-- end generated -->\nafter\n"
    assert docs.render(text) == ("before\n<!-- generated: flags -->\n\n| a |\n\n"
                                 "<!-- end generated -->\nafter\n")
    with pytest.raises(ValueError, match="unknown generated block 'nope'"):
        docs.render("<!-- generated: nope -->\n<!-- end generated -->")


def test_check_mode_reports_a_stale_doc_with_the_fix(tmp_path, capsys) -> None:
    (tmp_path / "stale.md").write_text("<!-- generated: flags -->\n<!-- end generated -->\n")
    assert docs.main(["--check", "--docs", str(tmp_path)]) == 1
    assert docs.FIX_COMMAND in capsys.readouterr().err
    assert docs.main(["--docs", str(tmp_path)]) == 0
    assert docs.main(["--check", "--docs", str(tmp_path)]) == 0
    assert "`--model MODEL`" in (tmp_path / "stale.md").read_text()


def test_a_parameter_the_engine_adds_needs_a_note(monkeypatch) -> None:
    monkeypatch.setattr(validation, "SUPPORTED_PARAMS",
                        validation.SUPPORTED_PARAMS | {"new_knob"})
    with pytest.raises(ValueError, match="without a note.*new_knob"):
        docs.parameters_table()


def test_the_gateway_tables_load_no_torch() -> None:
    code = ("import sys; from switchboard import docs; docs.routes_table(); docs.flags_table(); "
            "assert 'torch' not in sys.modules, 'torch was loaded'")
    ran = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120)
    assert ran.returncode == 0, ran.stderr


def test_every_config_file_key_is_documented() -> None:
    text = (ROOT / "docs" / "configuration.md").read_text()
    assert [key for key in CONFIG_KEYS if f"`{key}`" not in text] == []


def test_the_docs_index_links_every_doc() -> None:
    index = (ROOT / "docs" / "README.md").read_text()
    linked = {match["path"] for match in LINK.finditer(index)}
    assert sorted(path.name for path in (ROOT / "docs").glob("*.md")
                  if path.name != "README.md" and path.name not in linked) == []


def _anchors(path: Path) -> set[str]:
    """GitHub's heading anchors of a Markdown file."""
    return {re.sub(r"[^\w\- ]", "", line.lstrip("#").strip().lower()).replace(" ", "-")
            for line in path.read_text().splitlines() if line.startswith("#")}


@pytest.mark.parametrize("document", [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))],
                         ids=lambda path: str(path.relative_to(ROOT)))
def test_relative_links_lead_somewhere(document: Path) -> None:
    broken = []
    for match in LINK.finditer(document.read_text()):
        target = (document.parent / match["path"]).resolve() if match["path"] else document
        if not target.exists():
            broken.append(match[0])
        elif match["anchor"] and target.suffix == ".md" and match["anchor"] not in _anchors(target):
            broken.append(match[0])
    assert broken == []


def test_the_readme_stays_a_newcomers_page() -> None:
    lines = (ROOT / "README.md").read_text().count("\n")
    assert lines <= README_MAX_LINES, (f"README.md has {lines} lines; reference material "
                                       "belongs in docs/ (docs/README.md is the index)")
