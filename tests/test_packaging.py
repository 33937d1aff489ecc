"""The package's own files: the lock pins what pyproject.toml declares; tinax.widgets is
installed from the repository's widgets/ folder and nowhere else."""

from __future__ import annotations

import functools
import subprocess
import sys
import tomllib
import zipfile
from collections.abc import Mapping
from pathlib import Path

from packaging.requirements import Requirement

REPO = Path(__file__).resolve().parents[1]


def _pyproject() -> dict:
    return tomllib.loads((REPO / "pyproject.toml").read_text())


def _lock_pins() -> dict[str, str]:
    pins = {}
    for line in (REPO / "requirements.lock").read_text().splitlines():
        if line and not line[0].isspace() and "==" in line and not line.startswith("#"):
            name, _, rest = line.partition("==")
            pins[name.strip().lower().replace("_", "-")] = rest.split()[0]
    return pins


def _declared() -> list[Requirement]:
    project = _pyproject()
    declared = list(project["project"]["dependencies"])
    for extra in project["project"]["optional-dependencies"].values():
        declared += extra
    for group in project["dependency-groups"].values():
        declared += [item for item in group if isinstance(item, str)]
    return [Requirement(text) for text in declared]


def test_the_lock_pins_every_declared_dependency_within_its_range() -> None:
    pins = _lock_pins()
    for requirement in _declared():
        name = requirement.name.lower().replace("_", "-")
        assert name in pins, f"{requirement} is declared in pyproject.toml but not locked"
        assert requirement.specifier.contains(pins[name], prereleases=True), (
            f"the lock pins {name}=={pins[name]}, outside {requirement}"
        )


def test_orbax_is_bounded_to_its_minor_release() -> None:
    (orbax,) = [r for r in _declared() if r.name == "orbax-checkpoint"]
    assert orbax.specifier.contains("0.12.8")
    assert not orbax.specifier.contains("0.13.0"), "a new Orbax minor release must be vetted"


def test_flax_and_optax_are_not_runtime_dependencies() -> None:
    runtime = {Requirement(t).name for t in _pyproject()["project"]["dependencies"]}
    assert not {"flax", "optax"} & runtime
    assert {"flax", "optax"} <= {r.name for r in _declared()}


def test_every_package_directory_is_installed() -> None:
    listed = set(_pyproject()["tool"]["setuptools"]["packages"])
    found = {
        ".".join(p.parent.relative_to(REPO).parts) for p in (REPO / "tinax").rglob("__init__.py")
    }
    assert found | {"tinax.widgets"} == listed
    assert _pyproject()["tool"]["setuptools"]["package-dir"] == {"tinax.widgets": "widgets"}


def test_the_wheel_installs_tinax_widgets_and_no_top_level_widgets(tmp_path: Path) -> None:
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "--quiet",
            "-w",
            str(tmp_path),
            str(REPO),
        ],
        check=True,
        capture_output=True,
    )
    (wheel,) = tmp_path.glob("tinax-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    tops = {name.split("/")[0] for name in names if not name.split("/")[0].endswith(".dist-info")}
    assert tops == {"tinax"}
    assert "tinax/widgets/__init__.py" in names and "tinax/widgets/py.typed" in names
    assert "tinax/_format/naming/names.py" in names


def test_widgets_without_its_extra_says_what_to_install() -> None:
    code = (
        "import sys\n"
        "class Block:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name == 'ipywidgets':\n"
        "            raise ModuleNotFoundError(\"No module named 'ipywidgets'\", name=name)\n"
        "sys.meta_path.insert(0, Block())\n"
        "try:\n"
        "    import tinax.widgets\n"
        "except ImportError as e:\n"
        "    print(e)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], check=True, capture_output=True, text=True
    ).stdout
    assert 'pip install "tinax[widgets]"' in out
    assert "ipywidgets" in out


def test_the_widgets_logger_is_named_after_the_package() -> None:
    import logging

    from tinax.widgets import _guard

    assert _guard._log is logging.getLogger("tinax.widgets")


def _third_party_imports(root: Path) -> dict[str, set[str]]:
    """Top-level third-party module → the files under ``root`` that import it."""
    import ast

    found: dict[str, set[str]] = {}
    for source in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(source.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                top = name.split(".")[0]
                if top != "tinax" and top not in sys.stdlib_module_names:
                    found.setdefault(top, set()).add(str(source.relative_to(REPO)))
    return found


@functools.cache
def _providers() -> Mapping[str, list[str]]:
    from importlib.metadata import packages_distributions

    return packages_distributions()


def _distributions_of(module: str) -> set[str]:
    names = _providers().get(module)
    assert names, f"{module} is imported but no installed distribution provides it"
    return {name.lower().replace("_", "-") for name in names}


def _names(requirements: list[str]) -> set[str]:
    return {Requirement(text).name.lower().replace("_", "-") for text in requirements}


def test_every_imported_package_is_declared_where_its_importer_is_installed() -> None:
    project = _pyproject()["project"]
    core = _names(project["dependencies"])
    extras = {name: _names(extra) for name, extra in project["optional-dependencies"].items()}
    # What each part of the package may rely on: the core dependencies, plus the
    # extra that installs it (tinax.explore and the command line, tinax.widgets and
    # gs:// support: the modules only a gs:// path imports).
    allowed = {
        "tinax/_format/storage/gcs.py": core | extras["gcs"],
        "tinax/_format/storage/gcs_listing.py": core | extras["gcs"],
        "tinax/_format/storage/gcs_upload.py": core | extras["gcs"],
        "tinax/explore": core | extras["explore"],
        "tinax/_cli": core | extras["explore"],
        "widgets": core | extras["widgets"],
        "tinax": core,
    }
    imports = _third_party_imports(REPO / "tinax")
    for module, files in _third_party_imports(REPO / "widgets").items():
        imports.setdefault(module, set()).update(files)
    assert {"numpy", "jax", "orbax", "tensorstore", "ml_dtypes", "pandas", "gcsfs"} <= set(imports)
    for module, files in sorted(imports.items()):
        provided = _distributions_of(module)
        for file in sorted(files):
            part = next(p for p in allowed if file == p or file.startswith(p + "/"))
            assert provided & allowed[part], (
                f"{file} imports {module} ({sorted(provided)}), which {part}'s "
                "dependencies in pyproject.toml do not declare"
            )


def test_gcsfs_is_an_extra_and_not_a_core_dependency() -> None:
    project = _pyproject()["project"]
    assert "gcsfs" not in _names(project["dependencies"])
    assert "gcsfs" in _names(project["optional-dependencies"]["gcs"])


def test_a_gs_path_without_gcsfs_says_what_to_install() -> None:
    code = (
        "import sys\n"
        "class Block:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] == 'gcsfs':\n"
        '            raise ModuleNotFoundError(f"No module named {name!r}", name=name)\n'
        "sys.meta_path.insert(0, Block())\n"
        "import tinax.explore\n"
        "try:\n"
        "    tinax.explore.list_checkpoints('gs://some-bucket/run')\n"
        "except ImportError as e:\n"
        "    print(type(e).__name__, e)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], check=True, capture_output=True, text=True, timeout=120
    ).stdout
    assert out.startswith("ModuleNotFoundError"), out
    assert "pip install 'tinax[gcs]'" in out
