"""The manual's "How the code is laid out" (docs/development.md) names only files and
folders that exist."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TITLE = "## How the code is laid out"


def _section() -> str:
    text = (REPO / "docs" / "development.md").read_text(encoding="utf-8")
    assert TITLE in text
    return text.split(TITLE, 1)[1].split("\n## ", 1)[0]


def _bullets(section: str) -> list[str]:
    return [b.replace("\n", " ") for b in re.split(r"\n- ", section)[1:]]


def _named(bullet: str) -> tuple[Path, list[str]]:
    """The folder a bullet is about (its first name) and every file or folder it names."""
    names = re.findall(r"`([\w./-]+(?:\.py|/))`", bullet)
    assert names and names[0].endswith("/"), bullet[:80]
    return REPO / names[0], names


def _missing(section: str) -> list[str]:
    missing = []
    intro = section.split("\n- ", 1)[0]
    for name in re.findall(r"`([\w./-]+(?:\.py|/))`", intro):
        if not (REPO / name).exists():
            missing.append(name)
    for bullet in _bullets(section):
        folder, names = _named(bullet)
        for name in names:
            # A path is from the repository's top; a bare name is in the bullet's folder.
            where = REPO / name if "/" in name.rstrip("/") or name == names[0] else folder / name
            if not where.exists() or (name.endswith("/") and not where.is_dir()):
                missing.append(name)
    return missing


def test_every_file_and_folder_the_layout_names_exists() -> None:
    section = _section()
    named = [name for bullet in _bullets(section) for name in _named(bullet)[1]]
    assert len(named) > 30 and "tinax/_format/" in named and "location.py" in named
    assert _missing(section) == []


def test_the_check_finds_a_name_that_does_not_exist() -> None:
    section = _section().replace("`locate.py`", "`nowhere.py`")
    assert _missing(section) == ["nowhere.py"]
    section = _section().replace("`tests/test_layering.py`", "`tests/test_nowhere.py`")
    assert _missing(section) == ["tests/test_nowhere.py"]


def test_every_package_has_a_bullet() -> None:
    folders = {_named(b)[0] for b in _bullets(_section())}
    packages = {p.parent for p in (REPO / "tinax").rglob("__init__.py")} - {
        REPO / "tinax" / "checkpointing" / "legacy"
    }
    assert packages | {REPO / "widgets", REPO / "tests", REPO / "bench"} <= folders


LONG = 500


def test_every_long_module_says_at_its_top_why_it_is_long() -> None:
    unexplained = []
    for source in sorted([*(REPO / "tinax").rglob("*.py"), *(REPO / "widgets").rglob("*.py")]):
        text = source.read_text(encoding="utf-8")
        if text.count("\n") > LONG and "(Over 500 lines:" not in text[:1500]:
            unexplained.append(str(source.relative_to(REPO)))
    assert unexplained == []
