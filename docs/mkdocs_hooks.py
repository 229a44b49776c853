"""MkDocs hooks of the docs site (``hooks:`` in ``mkdocs.yml``).

A page may link a file of the repository outside ``docs/`` by its relative path, as on
GitHub (``[the chart's values](../deploy/helm/ipam-bridge/values.yaml)``). MkDocs can only
link pages of ``docs/``: `on_page_markdown` turns such a link into one to the file in the
repository (``<repo_url>/blob/main/<path>``, ``tree`` for a folder) when the file exists,
and leaves any other link alone, so ``mkdocs build --strict`` still fails on a broken one.
The hook API: https://www.mkdocs.org/user-guide/configuration/#hooks.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

__all__ = ["on_page_markdown"]

#: A Markdown link (or image) target that climbs out of the page's folder: ``](../x)``.
_LINK = re.compile(r"\]\((?P<path>(?:\.\./)+[^)#\s]*)(?P<anchor>#[^)\s]*)?\)")
#: The branch the repository links point at.
BRANCH = "main"


def repo_link(target: str, page_dir: Path, docs_dir: Path, repo_url: str) -> str | None:
    """Return the repository URL of a relative link ``target`` of a page, or None.

    Parameters
    ----------
    target:
        The link as written (``../README.md``), relative to the page's folder.
    page_dir:
        The folder of the page's source file.
    docs_dir:
        The site's ``docs_dir``; the repository is its parent.

    Returns
    -------
    str or None
        ``<repo_url>/blob/<BRANCH>/<path>`` (``tree`` for a folder) when the target lies
        outside ``docs_dir``, inside the repository, and exists; else None.
    """
    root = docs_dir.resolve().parent
    path = (page_dir / target).resolve()
    if path.is_relative_to(docs_dir.resolve()) or not path.is_relative_to(root):
        return None
    if not path.exists():
        return None
    kind = "tree" if path.is_dir() else "blob"
    return f"{repo_url.rstrip('/')}/{kind}/{BRANCH}/{path.relative_to(root).as_posix()}"


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    """Rewrite a page's links to repository files outside ``docs/`` (see the module)."""
    docs_dir = Path(config["docs_dir"])
    page_dir = (docs_dir / page.file.src_path).parent
    repo_url = str(config.get("repo_url") or "")
    if not repo_url:
        return markdown

    def replace(match: re.Match[str]) -> str:
        url = repo_link(match.group("path"), page_dir, docs_dir, repo_url)
        if url is None:
            return match.group(0)
        return f"]({url}{match.group('anchor') or ''})"

    return _LINK.sub(replace, markdown)
