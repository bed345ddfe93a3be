"""mkdocs hooks (mkdocs.yml `hooks:`): checks that fail the strict build.

- docs/plugins.md is what `switchyard policy plugins --markdown` prints now (it is generated from the
  plugin registry and docstrings, and committed so it reads on the repository too);
- every relative link in README.md names a file that exists (the README is not part of the site, so
  mkdocs does not check it).
"""

from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import Any

from policies.reference import REGENERATE, markdown, plugin_docs

log = logging.getLogger("mkdocs.hooks.switchyard")
ROOT = Path(__file__).resolve().parents[1]
LINK = re.compile(r"\]\(([^)\s]+)\)")


def on_pre_build(config: Any) -> None:
    page = Path(config["docs_dir"]) / "plugins.md"
    if not page.is_file() or page.read_text() != markdown(plugin_docs()):
        log.warning("docs/plugins.md is not what the registry says: run `%s`", REGENERATE)
    for target in readme_links_missing(ROOT / "README.md"):
        log.warning("README.md links to %s, which does not exist", target)


def readme_links_missing(readme: Path) -> list[str]:
    missing = []
    for target in LINK.findall(readme.read_text()):
        path = target.split("#", 1)[0]
        if not path or "://" in path or path.startswith("mailto:"):
            continue
        if not (readme.parent / path).exists():
            missing.append(target)
    return missing
