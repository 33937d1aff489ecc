"""Layers import only downwards, and the on-disk format has one home.

    tinax.widgets  →  tinax.explore  →  tinax.checkpointing  →  tinax._format, tinax._paths,
    tinax._cli     ↗                                              tinax._claims, tinax._targets

The command line (``tinax._cli``) sits beside the widgets, above explore: its writing
commands (``derive``, ``average``) run tinax.checkpointing, which read-only explore never
imports.

Checked twice: statically, over every import statement of every module (including
imports inside functions), and at run time, over what importing a layer loads.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
# Package → directory in the repository.
PACKAGES = {
    "tinax._format": REPO / "tinax" / "_format",
    "tinax.checkpointing": REPO / "tinax" / "checkpointing",
    "tinax.explore": REPO / "tinax" / "explore",
    "tinax.widgets": REPO / "widgets",
    "tinax._cli": REPO / "tinax" / "_cli",
}
# Scripts that ``python -m`` runs and nothing imports: ``python -m tinax.explore`` is the
# command line, which sits above the package it is named after.
ENTRY_POINTS = {
    "tinax.explore.__main__": {
        "tinax._cli.entry",
        "tinax._cli.entry.console",
        "tinax._cli.entry.MODULE_PROG",
    }
}
# The layers that are one module each, directly under tinax/.
SINGLE_MODULES = ("tinax._paths", "tinax._claims", "tinax._targets")
# What each layer may not import, at any depth of its modules.
FORBIDDEN = {
    "tinax._format": (
        "jax",
        "orbax",
        "pandas",
        "ipywidgets",
        "grain",
        "flax",
        "optax",
        "tinax._paths",
        "tinax.checkpointing",
        "tinax.explore",
        "tinax.widgets",
        "tinax._cli",
    ),
    "tinax._paths": (
        "jax",
        "orbax",
        "pandas",
        "ipywidgets",
        "tensorstore",
        "tinax._claims",
        "tinax.checkpointing",
        "tinax.explore",
        "tinax.widgets",
        "tinax._cli",
    ),
    "tinax._claims": (
        "jax",
        "orbax",
        "pandas",
        "ipywidgets",
        "tensorstore",
        "tinax.checkpointing",
        "tinax.explore",
        "tinax.widgets",
        "tinax._cli",
    ),
    # Restore targets, leaf by leaf: JAX walks the pytree; no Orbax, no Grain.
    "tinax._targets": (
        "orbax",
        "grain",
        "pandas",
        "ipywidgets",
        "tinax._paths",
        "tinax._claims",
        "tinax.checkpointing",
        "tinax.explore",
        "tinax.widgets",
        "tinax._cli",
    ),
    "tinax.checkpointing": ("pandas", "ipywidgets", "tinax.explore", "tinax.widgets", "tinax._cli"),
    # Read-only: nothing of checkpointing that writes a checkpoint (the command line's
    # derive and average run those).
    "tinax.explore": (
        "ipywidgets",
        "orbax",
        "matplotlib",
        "tinax.widgets",
        "tinax._cli",
        "tinax.checkpointing.derive_checkpoint",
        "tinax.checkpointing.average_checkpoints",
        "tinax.checkpointing.save_checkpointables",
        "tinax.checkpointing.save_training_checkpoint",
        "tinax.checkpointing.TrainingRun",
        "tinax.checkpointing._derive",
        "tinax.checkpointing._average",
        "tinax.checkpointing._surgery",
    ),
    "tinax.widgets": ("orbax", "tensorstore", "tinax._cli"),
    # The command line: a terminal's tables, and checkpointing's writers run from it.
    "tinax._cli": ("ipywidgets", "matplotlib", "orbax", "jax", "tinax.widgets"),
}


def _modules(package: str) -> dict[str, Path]:
    if package in SINGLE_MODULES:
        return {package: REPO / "tinax" / f"{package.rsplit('.', 1)[1]}.py"}
    root = PACKAGES[package]
    found = {}
    for source in sorted(root.rglob("*.py")):
        parts = source.relative_to(root).with_suffix("").parts
        found[".".join((package, *parts)).removesuffix(".__init__")] = source
    return found


def _imports(module: str, source: Path) -> set[str]:
    """Every module named by an import statement of ``source``, made absolute."""
    found = set()
    is_package = source.name == "__init__.py"
    for node in ast.walk(ast.parse(source.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".") if is_package else module.split(".")[:-1]
                base = base[: len(base) - (node.level - 1)]
                target = ".".join([*base, node.module] if node.module else base)
            else:
                target = node.module or ""
            found.add(target)
            found.update(f"{target}.{alias.name}" for alias in node.names)
    return found


def _under(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


@pytest.mark.parametrize("layer", sorted(FORBIDDEN))
def test_no_layer_imports_upwards_or_past_its_boundary(layer: str) -> None:
    modules = _modules(layer)
    assert modules
    for module, source in modules.items():
        bad = {
            name
            for name in _imports(module, source) - ENTRY_POINTS.get(module, set())
            for forbidden in FORBIDDEN[layer]
            if _under(name, forbidden)
        }
        assert not bad, f"{module} imports {sorted(bad)}"


# tinax._format's subpackages, in the one order they import: each only those before it.
FORMAT_ORDER = ("naming", "storage", "metadata", "records", "integrity", "arraydata", "writing")
# Its modules directly under tinax/_format/, which any of them may use: they import
# only the spellings of ``naming``.
FORMAT_SHARED = ("callbacks", "hostmem", "lru", "pools", "safetensors")


def _format_part(module: str) -> str | None:
    """The subpackage (or shared module) of tinax._format that ``module`` is in."""
    parts = module.split(".")
    return parts[2] if len(parts) > 2 and parts[:2] == ["tinax", "_format"] else None


def _format_order_breaks(graph: dict[str, set[str]]) -> list[str]:
    breaks = []
    for module, imported in sorted(graph.items()):
        part = _format_part(module)
        if part is None:
            continue
        allowed = {"naming"} if part in FORMAT_SHARED else set(FORMAT_SHARED)
        if part in FORMAT_ORDER:
            allowed |= set(FORMAT_ORDER[: FORMAT_ORDER.index(part) + 1])
        breaks += [
            f"{module} imports {name}"
            for name in sorted(imported)
            if _format_part(name) not in (None, part) and _format_part(name) not in allowed
        ]
    return breaks


def test_the_format_s_subpackages_import_one_way() -> None:
    graph = _import_graph()
    parts = {_format_part(m) for m in graph} - {None}
    assert parts == {*FORMAT_ORDER, *FORMAT_SHARED}, parts
    assert _format_order_breaks(graph) == []
    # The check finds an import against the order where there is one.
    graph["tinax._format.naming.names"] = {"tinax._format.storage.location"}
    assert _format_order_breaks(graph) == [
        "tinax._format.naming.names imports tinax._format.storage.location"
    ]


def test_relative_imports_are_resolved_for_the_check() -> None:
    imports = _imports("tinax.widgets._restore", PACKAGES["tinax.widgets"] / "_restore.py")
    assert "tinax.widgets._choice" in imports


def test_checkpointing_and_explore_read_through_the_format_module() -> None:
    for layer in ("tinax.checkpointing", "tinax.explore"):
        used = set().union(*(_imports(m, s) for m, s in _modules(layer).items()))
        assert any(_under(name, "tinax._format") for name in used), layer


def _strings(source: Path) -> set[str]:
    """Every string constant in ``source``."""
    return {
        node.value
        for node in ast.walk(ast.parse(source.read_text(encoding="utf-8")))
        if isinstance(node, ast.Constant) and isinstance(node.value, str)
    }


def test_no_module_outside_the_format_module_spells_an_orbax_file_name() -> None:
    from tinax._format.naming import names

    spelled = {
        names.CHECKPOINT_METADATA,
        names.PYTREE_METADATA,
        names.OCDBT_MANIFEST,
        names.EMPTY_PYTREE,
        names.TEMPORARY_SUFFIX,
        names.STRINGS,
        names.SHARDINGS,
        names.COMMIT_SUCCESS,
        names.ZARR3_METADATA,
        names.CLAIM_SUFFIX,
    }
    for layer in (
        "tinax._paths",
        "tinax._claims",
        "tinax.checkpointing",
        "tinax.explore",
        "tinax.widgets",
        "tinax._cli",
    ):
        for module, source in _modules(layer).items():
            found = _strings(source) & spelled
            assert not found, f"{module} spells {sorted(found)}"


def test_no_module_outside_the_format_module_spells_a_status_word() -> None:
    from tinax._format.naming import words

    statuses = {
        words.COMPLETE,
        words.IN_PROGRESS,
        words.INTERRUPTED,
        words.SHAPE_DIFFERS,
        words.DTYPE_DIFFERS,
        words.KIND_DIFFERS,
        words.MISSING_FROM_CHECKPOINT,
        words.NOT_IN_TARGET,
        words.SAME,
        words.CHANGED,
        words.ONLY_IN_A,
        words.ONLY_IN_B,
    }
    for layer in (
        "tinax._claims",
        "tinax.checkpointing",
        "tinax.explore",
        "tinax.widgets",
        "tinax._cli",
    ):
        for module, source in _modules(layer).items():
            found = _strings(source) & statuses
            assert not found, f"{module} spells {sorted(found)}"


def test_private_orbax_imports_live_in_one_file() -> None:
    users = {
        module
        for layer in PACKAGES
        for module, source in _modules(layer).items()
        if any(_under(name, "orbax") and "._src" in name for name in _imports(module, source))
    }
    assert users == {"tinax.checkpointing._orbax"}


def test_private_jax_imports_live_in_one_file() -> None:
    users = {
        module
        for layer in PACKAGES
        for module, source in _modules(layer).items()
        if any(_under(name, "jax._src") for name in _imports(module, source))
    }
    assert users == {"tinax.checkpointing._processes"}


def _loaded_after(statement: str) -> set[str]:
    code = f"import sys; {statement}; print('\\n'.join(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True)
    return set(out.stdout.split())


def test_importing_the_format_module_loads_no_jax_orbax_pandas_or_ipywidgets() -> None:
    loaded = _loaded_after(
        "import tinax._format.metadata.layout, tinax._format.metadata.pytree, tinax._format.metadata.arrays, "
        "tinax._format.metadata.jsonitems, tinax._paths, tinax._claims"
    )
    assert "tinax._format.metadata.arrays" in loaded
    # tensorstore (and NumPy) too are imported only where an array is read.
    assert not {"jax", "orbax", "pandas", "ipywidgets", "grain", "tensorstore"} & loaded


def test_the_widgets_package_re_exports_the_widgets_only() -> None:
    import tinax.widgets as widgets

    assert sorted(widgets.__all__) == [
        "AsyncProgress",
        "CheckpointExplorer",
        "ExportPanel",
        "RestoreTargetBuilder",
        "RunTimeline",
        "SavePanel",
    ]
    assert Path(widgets.__file__).parent == PACKAGES["tinax.widgets"]
    assert (PACKAGES["tinax.widgets"] / "py.typed").is_file()


def test_no_layer_above_the_format_module_knows_which_storage_it_reads() -> None:
    # Storages differ in capabilities (``commits_by_rename``, ``implicit_directories``),
    # never by name: only tinax._format picks and implements them.
    storage_names = ("tinax._format.storage.gcs", "gcsfs", "google.cloud")
    for layer in ("tinax.checkpointing", "tinax.explore", "tinax.widgets", "tinax._cli"):
        for module, source in _modules(layer).items():
            bad = {n for n in _imports(module, source) for s in storage_names if _under(n, s)}
            assert not bad, f"{module} imports {sorted(bad)}"
            text = source.read_text(encoding="utf-8")
            for word in ("is_local", "LocalStorage", "GcsStorage", "GCS_SCHEME"):
                assert word not in text, f"{module} uses {word}"


# The public faces the widgets may use: each layer's package itself, and the
# vocabulary of status words and keys. Everything with a leading underscore below
# tinax.widgets is another layer's own business.
WIDGETS_MAY_IMPORT = ("tinax.checkpointing", "tinax.explore", "tinax.vocabulary")


def test_widgets_import_only_the_public_faces_of_the_layers_below() -> None:
    for module, source in _modules("tinax.widgets").items():
        used = {n for n in _imports(module, source) if _under(n, "tinax")}
        bad = set()
        for name in used:
            if _under(name, "tinax.widgets"):
                continue
            parts = name.split(".")
            public = next((p for p in WIDGETS_MAY_IMPORT if _under(name, p)), None)
            # ``from tinax.explore import diff_table`` names tinax.explore.diff_table:
            # fine; tinax.explore._diff (or tinax._format) is not.
            private = public is None or any(p.startswith("_") for p in parts[1:])
            if private and name != "tinax":
                bad.add(name)
        assert not bad, f"{module} imports private modules {sorted(bad)}"


def test_the_widgets_split_keys_with_the_format_s_parser() -> None:
    # One grammar of keys: no pattern of its own in the widgets.
    for module, source in _modules("tinax.widgets").items():
        text = source.read_text(encoding="utf-8")
        assert "re.compile" not in text or module.endswith("._text"), module


def test_the_vocabulary_is_inert_and_complete() -> None:
    import tinax.vocabulary as vocabulary
    from tinax._format.naming import words

    # Every word of the format's vocabulary is public, under the same name.
    for name, value in vars(words).items():
        if name.isupper() and isinstance(value, str):
            assert getattr(vocabulary, name) == value, name
    loaded = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys, tinax.vocabulary;"
            "print(sorted(m for m in ('jax', 'pandas', 'orbax', 'ipywidgets') if m in sys.modules))",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    assert loaded.stdout.strip() == "[]"


def _all_modules() -> dict[str, Path]:
    found = {}
    for layer in (*PACKAGES, *SINGLE_MODULES):
        found.update(_modules(layer))
    found["tinax"] = REPO / "tinax" / "__init__.py"
    return found


def _import_graph() -> dict[str, set[str]]:
    """Module → the project's modules it imports, at any depth of its code.

    Importing a submodule runs its packages' ``__init__`` first, so a module naming
    one of its own packages (``from tinax.explore import _checkpoint``) is no edge.
    """
    modules = _all_modules()
    return {
        module: {
            name
            for name in _imports(module, source)
            if name in modules and name != module and not _under(module, name)
        }
        for module, source in modules.items()
    }


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected groups of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        on_stack.add(module)
        for other in sorted(graph[module]):
            if other not in index:
                visit(other)
                low[module] = min(low[module], low[other])
            elif other in on_stack:
                low[module] = min(low[module], index[other])
        if low[module] == index[module]:
            group = []
            while True:
                other = stack.pop()
                on_stack.discard(other)
                group.append(other)
                if other == module:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for module in sorted(graph):
        if module not in index:
            visit(module)
    return found


def test_no_import_goes_in_a_circle() -> None:
    graph = _import_graph()
    assert "tinax._format.storage.location" in graph["tinax._format.storage.gcs"]
    assert _circles(graph) == []
    # The check finds a circle where there is one.
    assert _circles({**graph, "tinax._format.storage.location": {"tinax._format.storage.gcs"}}) == [
        ["tinax._format.storage.gcs", "tinax._format.storage.location"]
    ]


def test_importing_explore_loads_no_jax_orbax_or_grain() -> None:
    # Every table of it, each imported when first used.
    loaded = _loaded_after("import tinax.explore as ex; [getattr(ex, n) for n in ex.__all__]")
    assert "pandas" in loaded and "tinax.explore" in loaded
    heavy = {m for m in loaded for top in ("jax", "jaxlib", "orbax", "grain") if _under(m, top)}
    assert not heavy, sorted(heavy)[:20]


def test_comparing_live_state_with_a_checkpoint_loads_no_orbax_or_grain(tmp_path: Path) -> None:
    # compare_table and state_table need JAX to walk the live pytree, and nothing more.
    import numpy as np

    from tinax.checkpointing import save_checkpointables

    path = tmp_path / "ckpt"
    save_checkpointables(path, {"model": {"w": np.ones((2, 3), np.float32)}}).result()
    loaded = _loaded_after(
        "import jax.numpy as jnp, tinax.explore as ex; "
        f"t = ex.compare_table({str(path)!r}, {{'model': {{'w': jnp.zeros((2, 3))}}}}); "
        "assert list(t['status']) == ['ok'], t; "
        "ex.state_table({'model': {'w': jnp.zeros((2, 3))}})"
    )
    assert "jax" in loaded and "tinax._targets" in loaded
    heavy = {m for m in loaded for top in ("orbax", "grain") if _under(m, top)}
    assert not heavy, sorted(heavy)[:20]


def test_explore_exports_its_tables_and_two_public_submodules() -> None:
    import tinax.explore as explore

    tables = {
        "list_checkpoints",
        "checkpoint_table",
        "state_table",
        "compare_table",
        "read_leaf",
        "diff_table",
        "verify",
        "export_safetensors",
        "lineage",
        "run_table",
        "drift_table",
        "scan_run",
        "restore_plan",
    }
    documented = {"readable", "retention_table", "run_policy"}
    # The opened checkpoint every table takes in place of a path, and its type.
    opened = {"open_checkpoint", "Checkpoint"}
    # The one health verdict every view shows, for one checkpoint, and its type.
    verdict = {"checkpoint_health", "Health"}
    assert set(explore.__all__) == tables | documented | opened | verdict | {"display", "toolkit"}
    # Nothing else public: the widgets' helpers live in tinax.explore.toolkit. Each
    # name is imported when first used, and is then an attribute like any other.
    public = {name for name in vars(explore) if not name.startswith("_")}
    assert public <= set(explore.__all__), sorted(public - set(explore.__all__))
    assert all(getattr(explore, name) is not None for name in explore.__all__)
    public = {name for name in vars(explore) if not name.startswith("_")}
    assert public == set(explore.__all__), sorted(public - set(explore.__all__))
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        explore.nope  # noqa: B018
    for name in explore.toolkit.__all__:
        assert getattr(explore.toolkit, name) is not None
        assert name not in explore.__all__
        assert name not in explore.display.__all__, f"{name} is display's, not the toolkit's"


def test_every_toolkit_name_has_a_user_outside_explore() -> None:
    """A name ``tinax.explore.toolkit`` exports is used, through the toolkit, by the
    widgets, a benchmark, a demo, a notebook or a test of it as public API; else it
    stays in its private module."""
    import re

    import tinax.explore as explore

    users = [
        path.read_text(encoding="utf-8")
        for folder in ("widgets", "bench", "demo", "notebooks", "tests")
        for path in sorted((REPO / folder).rglob("*"))
        if path.suffix in (".py", ".ipynb") and path.resolve() != Path(__file__).resolve()
    ]
    through = [text for text in users if "toolkit" in text]
    unused = [
        name
        for name in explore.toolkit.__all__
        if not any(re.search(rf"\b{re.escape(name)}\b", text) for text in through)
    ]
    assert not unused, f"exported by tinax.explore.toolkit with no user outside: {unused}"
