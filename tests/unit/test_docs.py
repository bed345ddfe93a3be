"""The README stays a front page (what it is, the two commands, a short SDK example, a map of docs/), and the
docs site's nav holds every page (`make docs` builds it strictly; docs/hooks.py adds checks of its own)."""

from __future__ import annotations

import ast
import importlib.util
import re
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"


def _hooks():
    spec = importlib.util.spec_from_file_location("docs_hooks", ROOT / "docs" / "hooks.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _nav_pages(nav: list) -> set[str]:
    pages = set()
    for entry in nav:
        value = next(iter(entry.values())) if isinstance(entry, dict) else entry
        pages |= _nav_pages(value) if isinstance(value, list) else {value}
    return pages


def test_the_readme_is_a_front_page():
    text = README.read_text()
    assert len(text.splitlines()) <= 200
    assert "make demo" in text and "make test" in text
    (example,) = re.findall(r"```python\n(.*?)```", text, re.S)
    assert len(example.splitlines()) <= 10
    ast.parse(example)
    assert "](docs/index.md)" in text


def test_every_link_in_the_readme_names_a_file_that_exists():
    assert _hooks().readme_links_missing(README) == []


def test_a_missing_readme_link_is_found(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "here.md").write_text("# here\n")
    readme = tmp_path / "README.md"
    readme.write_text("[a](docs/here.md#x) [b](docs/gone.md) [c](https://example.org/x.md) [d](#top)\n")
    assert _hooks().readme_links_missing(readme) == ["docs/gone.md"]


def test_every_docs_page_is_in_the_nav_and_drafts_are_not_built():
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    pages = {p.relative_to(ROOT / "docs").as_posix() for p in (ROOT / "docs").glob("*.md")}
    assert _nav_pages(config["nav"]) == pages
    assert config["strict"] is True
    assert "incoming/" in config["exclude_docs"].split()
