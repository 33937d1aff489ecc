"""The scripts the documentation site serves to draw the tutorials' widgets
(docs/_ext/widget_assets.py): a package of the npm registry is used only when its
tarball is the pinned one, from the cache or downloaded, and nothing else is cached.

The registry here is a folder laid out as the registry's addresses are, reached by
``file:`` URLs; the site's build itself (tests/test_notebooks.py) fetches the real
pins from the real registry.
"""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import pytest
from docs_site import _docs_helper

assets = _docs_helper("widget_assets")


def _npm_tarball(files: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
        for name, content in files.items():
            info = tarfile.TarInfo(f"package/{name}")
            info.size = len(content)
            archive.addfile(info, io.BytesIO(content))
    return buffer.getvalue()


GENUINE = _npm_tarball({"index.js": b"define([], function () { return {}; });\n"})
PACKAGE = assets.NpmPackage("@scope/thing", "1.2.3", assets._digest(GENUINE), "MIT")


def _registry(root: Path, tarball: bytes) -> str:
    """A registry serving ``tarball`` as PACKAGE's; its base URL."""
    where = root / "@scope" / "thing" / "-" / PACKAGE.tarball
    where.parent.mkdir(parents=True)
    where.write_bytes(tarball)
    return root.as_uri()


def test_the_pins_are_exact_versions_with_sha512_digests() -> None:
    for package in (assets.HTML_MANAGER, assets.REQUIREJS):
        assert all(part.isdigit() for part in package.version.split(".")), package
        assert package.integrity.startswith("sha512-"), package
    assert assets.HTML_MANAGER.url(assets.REGISTRY) == (
        "https://registry.npmjs.org/@jupyter-widgets/html-manager/-/html-manager-1.0.15.tgz"
    )


def test_a_downloaded_tarball_is_checked_then_cached(tmp_path: Path) -> None:
    registry = _registry(tmp_path / "registry", GENUINE)
    cache = tmp_path / "cache"
    assert assets.tarball(PACKAGE, cache, registry) == GENUINE
    assert (cache / "thing-1.2.3.tgz").read_bytes() == GENUINE
    assert sorted(p.name for p in cache.iterdir()) == ["thing-1.2.3.tgz"]
    # Kept: a second build reads the cache, with no registry at all.
    assert assets.tarball(PACKAGE, cache, (tmp_path / "nowhere").as_uri()) == GENUINE


def test_a_damaged_cached_tarball_is_fetched_again(tmp_path: Path) -> None:
    registry = _registry(tmp_path / "registry", GENUINE)
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / "thing-1.2.3.tgz").write_bytes(GENUINE[:-10])
    assert assets.tarball(PACKAGE, cache, registry) == GENUINE
    assert (cache / "thing-1.2.3.tgz").read_bytes() == GENUINE


def test_a_tarball_that_is_not_the_pinned_one_is_refused_and_not_cached(tmp_path: Path) -> None:
    other = _npm_tarball({"index.js": b"alert('not the pinned release');\n"})
    registry = _registry(tmp_path / "registry", other)
    cache = tmp_path / "cache"
    with pytest.raises(ValueError, match=r"is not the pinned @scope/thing 1\.2\.3") as raised:
        assets.tarball(PACKAGE, cache, registry)
    assert PACKAGE.integrity in str(raised.value)
    assert assets._digest(other) in str(raised.value)
    assert not cache.exists() or list(cache.iterdir()) == []


def test_an_unreachable_registry_names_where_to_put_the_tarball(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    with pytest.raises(OSError, match="cannot download @scope/thing 1.2.3") as raised:
        assets.tarball(PACKAGE, cache, (tmp_path / "nowhere").as_uri())
    assert str(cache / "thing-1.2.3.tgz") in str(raised.value)
    assert "TINAX_NPM_REGISTRY" in str(raised.value)
