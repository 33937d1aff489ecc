"""The README, the repository's front page: it opens with the two commands, its script
runs, it stays short, and its links into the documentation resolve.

The examples that were the README's before the documentation site are the guides'
(tests/test_guides.py runs them)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from urllib.parse import parse_qs, urlparse

import grain
import numpy as np

REPO = Path(__file__).resolve().parents[1]
README = (REPO / "README.md").read_text(encoding="utf-8")


def _fenced(language: str) -> list[str]:
    return re.findall(rf"^```{language}\n(.*?)^```$", README, flags=re.M | re.S)


def test_readme_opens_with_what_tinax_is_and_the_two_commands() -> None:
    lines = README.splitlines()
    assert lines[0] == "# tinax"
    first = "\n".join(lines[:15])
    assert "JAX training checkpoints" in first
    block = _fenced("bash")[0]
    assert f"```bash\n{block}```" in first, "the two commands must be in the README's first lines"
    commands = [line.split("#")[0].strip() for line in block.splitlines()]
    assert commands == ["make demo", "make test"]


def test_readme_script_saves_and_loads_a_checkpoint(tmp_path: Path) -> None:
    scripts = _fenced("python")
    assert len(scripts) == 1
    script = scripts[0]
    code_lines = [line for line in script.splitlines() if line.strip()]
    assert len(code_lines) <= 10, f"the example has {len(code_lines)} lines"
    assert "TrainingRun(" in script and "run.restore(" in script
    (tmp_path / "example.py").write_text(script)
    done = subprocess.run(
        [sys.executable, "example.py"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    # Three saves, the newest two kept.
    assert sorted(p.name for p in (tmp_path / "run").iterdir() if p.is_dir()) == [
        "step_000002",
        "step_000003",
    ]
    assert (tmp_path / "run" / "step_000003" / "commit_success.txt").is_file()
    # The restored iterator continues with the fourth batch of the same pipeline.
    fourth = list(grain.MapDataset.range(1_000).shuffle(seed=0).batch(32))[3][:4]
    assert done.stdout.strip() == f"[2, 3] 3 {{'loss': {1 / 3}}} {np.array2string(fourth)}"


def test_readme_links_to_files_that_exist() -> None:
    targets = re.findall(r"\]\(((?!https?://)[^)#\s]+)\)", README)
    assert "docs/explorer.png" in targets
    notebooks = {t for t in targets if t.endswith(".ipynb")}
    assert notebooks == {
        "notebooks/01_quickstart.ipynb",
        "notebooks/02_explore_a_run.ipynb",
        "notebooks/03_restore_targets.ipynb",
        "notebooks/04_legacy_v0.ipynb",
        "notebooks/05_safetensors.ipynb",
        "notebooks/06_run_timeline.ipynb",
    }
    # docs/explorer.png is made by `make screenshot` (demo/screenshot.py), kept in git.
    for target in targets:
        assert (REPO / target).exists(), target
    # It links every guide of the site.
    guides = {p.relative_to(REPO).as_posix() for p in (REPO / "docs" / "guides").glob("*.md")}
    assert guides - {"docs/guides/index.md"} <= set(targets)


def test_readme_is_a_front_page() -> None:
    assert len(README.splitlines()) <= 200


def test_readme_binder_link_opens_an_existing_notebook() -> None:
    links = re.findall(r"\((https://mybinder\.org/v2/[^)\s]+)\)", README)
    assert links, "no Binder link"
    for link in links:
        urlpath = parse_qs(urlparse(link).query)["urlpath"][0]
        assert urlpath.startswith("lab/tree/")
        assert (REPO / urlpath.removeprefix("lab/tree/")).is_file(), urlpath
    assert "https://mybinder.org/badge_logo.svg" in README


def test_the_readme_picture_is_made_by_make_screenshot_and_never_by_the_tests() -> None:
    makefile = (REPO / "Makefile").read_text()
    rule = re.search(r"^screenshot: (.*)\n\t(.*)$", makefile, re.MULTILINE)
    assert rule, "no `make screenshot` target"
    assert "demo-data" in rule.group(1).split()
    assert "demo/screenshot.py" in rule.group(2) and "docs/explorer.png" in rule.group(2)
    # The tests keep their pictures in test-artifacts/ (ignored by git), never in docs/:
    # no line of a test that writes a picture names docs/ (the documentation's tests read
    # docs/ and build into docs/_build, and take their pictures of the site elsewhere).
    picture = re.compile(r"screenshot\(|savefig\(|\.png")
    docs = re.compile(r"[\"'/]docs[\"'/]")
    writers = [
        f"{p.name}:{n}"
        for p in (REPO / "tests").rglob("*.py")
        if p.name != Path(__file__).name
        for n, line in enumerate(p.read_text().splitlines(), 1)
        if picture.search(line) and docs.search(line)
    ]
    assert writers == []
    assert "test-artifacts/" in (REPO / ".gitignore").read_text().split()
