"""widgets talks to tinax.checkpointing and tinax.explore, never to Orbax or tensorstore."""

from __future__ import annotations

import ast
from pathlib import Path

import widgets

PACKAGE = Path(widgets.__file__).parent
FORBIDDEN = ("orbax", "tensorstore")


def _imported_modules(source: Path) -> set[str]:
    modules = set()
    for node in ast.walk(ast.parse(source.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            modules.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            modules.add(node.module)
    return modules


def test_widgets_import_neither_orbax_nor_tensorstore() -> None:
    sources = sorted(PACKAGE.glob("*.py"))
    assert len(sources) >= 10
    for source in sources:
        bad = {m for m in _imported_modules(source) if m.split(".")[0] in FORBIDDEN}
        assert not bad, f"{source.name} imports {sorted(bad)}"


def test_the_package_re_exports_the_four_widgets_only() -> None:
    assert sorted(widgets.__all__) == [
        "AsyncProgress",
        "CheckpointExplorer",
        "RestoreTargetBuilder",
        "SavePanel",
    ]
    init = _imported_modules(PACKAGE / "__init__.py")
    assert all(m.startswith("widgets._") for m in init), init
    assert (PACKAGE / "py.typed").is_file()
