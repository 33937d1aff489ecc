"""The scripts that draw the tutorials' widgets, served by the site itself.

myst-nb writes the widget state each executed notebook saved into its page; a page
needs the ipywidgets HTML manager to draw it, and anywidget's front end for tinax's
tables and run timeline (anywidget views whose own code travels in the saved state).
By default myst-nb loads RequireJS and the manager from public CDNs, so that a page
opened without a network (a reader on a plane, a build checked offline) showed the
widgets' space empty. This extension puts everything those pages load under
``_static/widgets/``:

- RequireJS and ``@jupyter-widgets/html-manager`` (``embed-amd.js`` and the icon fonts
  its stylesheet names), from the npm registry at the versions pinned below, each
  tarball checked against its pinned sha512 before a byte of it is used, and kept in
  a cache (``$TINAX_DOCS_CACHE``, else ``~/.cache/tinax/docs``) so that a second build
  needs no network; ``$TINAX_NPM_REGISTRY`` names a mirror of the registry;
- anywidget's front end (its RequireJS module), from the installed ``anywidget``
  package, the very version whose views the notebooks saved;
- ``NOTICE.txt``: where each file comes from, at which version, under which licence.

``docs/_static/widgets/paths.js`` (loaded between the two) tells RequireJS where
these modules are; ``conf.py``'s ``nb_ipywidgets_js`` names the three scripts.
"""

from __future__ import annotations

import base64
import hashlib
import importlib.metadata
import io
import os
import re
import tarfile
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sphinx.application import Sphinx
from sphinx.util import logging

logger = logging.getLogger(__name__)

REGISTRY = "https://registry.npmjs.org"
# The folder under the site's _static/ that the pages load the widgets' scripts from.
FOLDER = "widgets"


@dataclass(frozen=True)
class NpmPackage:
    """A package of the npm registry, pinned to one version and its tarball's digest."""

    name: str
    version: str
    integrity: str  # the registry's ``dist.integrity``: "sha512-" and the base64 digest
    licence: str

    @property
    def tarball(self) -> str:
        """The tarball's file name, as the registry serves it."""
        return f"{self.name.rsplit('/', 1)[-1]}-{self.version}.tgz"

    def url(self, registry: str) -> str:
        return f"{registry.rstrip('/')}/{self.name}/-/{self.tarball}"


# The HTML manager of the ipywidgets release in the lock (8.1.9 and html-manager 1.0.15
# were released together) and the RequireJS it needs on the page.
HTML_MANAGER = NpmPackage(
    "@jupyter-widgets/html-manager",
    "1.0.15",
    "sha512-5thBIV6ymNgmPVOHvzx+gGy8ZSKmSazhtGw4/c4xJDVzRhG9PTeQsRjF3FUTopvFi//SABeNz1yp47bCrJ3CQA==",
    "BSD-3-Clause (its bundled libraries' notices: embed-amd.js.LICENSE.txt; "
    "Font Awesome Free's fonts: SIL OFL 1.1)",
)
REQUIREJS = NpmPackage(
    "requirejs",
    "2.3.8",
    "sha512-7/cTSLOdYkNBNJcDMWf+luFvMriVm7eYxp4BcFCsAX0wF421Vyce5SXP17c+Jd5otXKGNehIonFlyQXSowL6Mw==",
    "MIT",
)
# The ipywidgets major release whose widget state this HTML manager draws.
IPYWIDGETS_MAJOR = 8


def cache_dir() -> Path:
    """Where checked tarballs are kept between builds."""
    if os.environ.get("TINAX_DOCS_CACHE"):
        return Path(os.environ["TINAX_DOCS_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "tinax" / "docs"


def _digest(data: bytes) -> str:
    return "sha512-" + base64.b64encode(hashlib.sha512(data).digest()).decode()


def tarball(package: NpmPackage, cache: Path, registry: str = REGISTRY) -> bytes:
    """The package's tarball, checked against its pinned digest: from the cache, else
    downloaded (then cached).

    Raises:
      ValueError: The downloaded tarball's digest is not the pinned one (nothing is
        cached then).
      OSError: The tarball is not cached and cannot be downloaded.
    """
    kept = cache / package.tarball
    if kept.is_file():
        data = kept.read_bytes()
        if _digest(data) == package.integrity:
            return data
        kept.unlink()  # damaged or tampered with: fetched again below
    url = package.url(registry)
    try:
        with urllib.request.urlopen(url, timeout=120) as response:
            data = response.read()
    except OSError as error:
        raise OSError(
            f"cannot download {package.name} {package.version} from {url} ({error}); "
            f"the site serves it to draw the tutorials' widgets. Put the tarball "
            f"at {kept}, or name a mirror of the registry in TINAX_NPM_REGISTRY"
        ) from error
    found = _digest(data)
    if found != package.integrity:
        raise ValueError(
            f"{url} is not the pinned {package.name} {package.version}: its digest is "
            f"{found}, the pin is {package.integrity}"
        )
    cache.mkdir(parents=True, exist_ok=True)
    partial = kept.with_name(f"{kept.name}.{os.getpid()}.partial")
    partial.write_bytes(data)
    os.replace(partial, kept)  # whole or not at all, whoever else builds at once
    return data


def _members(data: bytes) -> dict[str, bytes]:
    """The regular files of an npm tarball, by their path under ``package/``."""
    files = {}
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as archive:
        for member in archive.getmembers():
            if member.isfile() and member.name.startswith("package/"):
                extracted = archive.extractfile(member)
                assert extracted is not None
                files[member.name.removeprefix("package/")] = extracted.read()
    return files


def html_manager_files(data: bytes) -> dict[str, bytes]:
    """``embed-amd.js``, its bundled libraries' notices, and every file it names
    beside it (the icon fonts its stylesheet loads)."""
    dist = {
        name.removeprefix("dist/"): content
        for name, content in _members(data).items()
        if name.startswith("dist/") and "/" not in name.removeprefix("dist/")
    }
    bundle = dist["embed-amd.js"]
    named = set(re.findall(rb'"([0-9a-f]{20}\.(?:woff2|woff|ttf|eot|svg))"', bundle))
    files = {name.decode(): dist[name.decode()] for name in named}
    files["embed-amd.js"] = bundle
    files["embed-amd.js.LICENSE.txt"] = dist["embed.js.LICENSE.txt"]
    return files


def anywidget_files() -> tuple[str, dict[str, bytes]]:
    """anywidget's version and its front end as a RequireJS module, with its licence,
    from the installed package."""
    distribution = importlib.metadata.distribution("anywidget")
    front_end = distribution.locate_file("anywidget/nbextension/index.js")
    licence = next(
        (f for f in distribution.files or () if f.name == "LICENSE" and "licenses" in f.parts),
        None,
    )
    files = {"anywidget.js": Path(str(front_end)).read_bytes()}
    if licence is not None:
        files["anywidget.LICENSE.txt"] = Path(str(distribution.locate_file(licence))).read_bytes()
    return distribution.version, files


def write_assets(folder: Path, cache: Path, registry: str = REGISTRY) -> list[str]:
    """Writes every file the widgets' pages load into ``folder``; returns their names."""
    ipywidgets = importlib.metadata.version("ipywidgets")
    if int(ipywidgets.split(".")[0]) != IPYWIDGETS_MAJOR:
        raise ValueError(
            f"ipywidgets {ipywidgets} is installed; the site's HTML manager "
            f"({HTML_MANAGER.name} {HTML_MANAGER.version}) draws ipywidgets "
            f"{IPYWIDGETS_MAJOR}'s widgets: pin the manager of its release in "
            f"docs/_ext/widget_assets.py"
        )
    files = html_manager_files(tarball(HTML_MANAGER, cache, registry))
    files["require.js"] = _members(tarball(REQUIREJS, cache, registry))["require.js"]
    anywidget_version, anywidget = anywidget_files()
    files.update(anywidget)
    files["NOTICE.txt"] = "\n".join(
        [
            "The scripts that draw the tutorials' widgets from the state saved with them,",
            "served by the site itself (docs/_ext/widget_assets.py):",
            "",
            f"require.js: {REQUIREJS.name} {REQUIREJS.version} (npm), {REQUIREJS.licence}",
            f"embed-amd.js and the fonts: {HTML_MANAGER.name} {HTML_MANAGER.version} (npm), "
            f"{HTML_MANAGER.licence}",
            f"anywidget.js: anywidget {anywidget_version} (its Python package's "
            "nbextension/index.js), MIT (anywidget.LICENSE.txt)",
            "",
        ]
    ).encode()
    folder.mkdir(parents=True, exist_ok=True)
    for stale in folder.iterdir():
        if stale.name not in files:  # a file of an earlier pin
            stale.unlink()
    for name, content in files.items():
        target = folder / name
        if not target.is_file() or target.read_bytes() != content:
            target.write_bytes(content)
    return sorted(files)


def _staging(app: Sphinx) -> Path:
    """A folder of the build's own, beside the site (as myst-nb's executed notebooks
    are), that Sphinx copies into the site's _static/ (a static folder inside the
    site's own is refused)."""
    return Path(app.outdir).parent / "widget-assets"


def _add_static_path(app: Sphinx, config: Any) -> None:
    # Made now: Sphinx drops a static path that does not exist when it checks the
    # settings, before any builder starts; it is filled when the builder starts.
    (_staging(app) / FOLDER).mkdir(parents=True, exist_ok=True)
    config.html_static_path = [*config.html_static_path, str(_staging(app))]


def _write(app: Sphinx) -> None:
    if app.builder.format != "html":
        return
    registry = os.environ.get("TINAX_NPM_REGISTRY") or REGISTRY
    names = write_assets(_staging(app) / FOLDER, cache_dir(), registry)
    logger.info("the widgets' scripts, served from _static/%s: %s", FOLDER, ", ".join(names))


def setup(app: Sphinx) -> dict[str, Any]:
    # Fetched when the build starts, before the notebooks run for minutes: a missing
    # network fails the build at once.
    app.connect("config-inited", _add_static_path)
    app.connect("builder-inited", _write)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
