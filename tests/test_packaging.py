"""The package's own files: the lock pins what pyproject.toml declares; tinax.widgets is
installed from the repository's widgets/ folder and nowhere else."""

from __future__ import annotations

import subprocess
import sys
import tomllib
import zipfile
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
    assert "tinax/_format/names.py" in names


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
