"""Checks every internal link of a built HTML site: the page it names exists, and so
does the anchor after its ``#``.

``sphinx-build -W -n`` already fails on a reference it cannot resolve; this reads the
pages as a browser would, so a link written as a plain URL, an anchor renamed, or a
file that did not make it into the build fails too. Links out of the site (``http:``,
``https:``, ``mailto:``) are not followed: the check reads the built files alone.

Usage: ``python docs/_ext/check_links.py docs/_build/html``; exits 1 naming every
broken link.
"""

from __future__ import annotations

import sys
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urlsplit


class _Page(HTMLParser):
    """The ids a page defines and the links (``href``, ``src``) it holds."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.ids: set[str] = set()
        self.links: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        for name, value in attrs:
            if value is None:
                continue
            if name in ("id", "name"):
                self.ids.add(value)
            elif (name == "href" and tag in ("a", "link", "area")) or (
                name == "src" and tag in ("img", "script", "iframe", "source")
            ):
                self.links.append(value)


def _read(path: Path) -> _Page:
    page = _Page()
    page.feed(path.read_text(encoding="utf-8", errors="replace"))
    return page


def broken_links(site: Path) -> list[str]:
    """Every internal link of the site's pages that names a missing page or anchor."""
    site = site.resolve()
    # _static/ holds the theme's template fragments, not pages.
    pages = {
        path: _read(path)
        for path in site.rglob("*.html")
        if path.relative_to(site).parts[0] != "_static"
    }
    broken = []
    for path, page in sorted(pages.items()):
        for link in page.links:
            parts = urlsplit(link)
            if parts.scheme or link.startswith("//"):
                continue  # outside the site
            target = (path.parent / unquote(parts.path)).resolve() if parts.path else path
            if target.is_dir():
                target = target / "index.html"
            where = f"{path.relative_to(site)}: {link}"
            if not target.is_relative_to(site) or not target.exists():
                broken.append(f"{where} (no such file)")
            elif parts.fragment and target.suffix == ".html":
                ids = pages[target].ids if target in pages else _read(target).ids
                if unquote(parts.fragment) not in ids:
                    broken.append(f"{where} (no anchor #{parts.fragment})")
    return broken


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: check_links.py SITE_DIRECTORY", file=sys.stderr)
        return 2
    site = Path(argv[0])
    if not (site / "index.html").is_file():
        print(f"{site} holds no built site (no index.html)", file=sys.stderr)
        return 2
    broken = broken_links(site)
    for line in broken:
        print(f"broken link: {line}", file=sys.stderr)
    print(f"{len(broken)} broken internal links")
    return 1 if broken else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
