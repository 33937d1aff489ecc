"""A throw-away JupyterLab server for browser tests: isolated config, free port, clean exit."""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
# The server settings that ship for the notebooks (make demo, Binder).
SERVER_CONFIG = REPO / "demo" / "jupyter_server_config.py"
JUPYTER = Path(sys.executable).with_name("jupyter")
CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]

# Quiet JupyterLab: no news or update checks, no toasts over the page.
_SETTINGS = {
    "@jupyterlab/apputils-extension/notification.jupyterlab-settings": {
        "fetchNews": "false",
        "checkForUpdates": False,
        "doNotDisturbMode": True,
    },
    # Every cell drawn, not only those scrolled into view: tests read every output.
    "@jupyterlab/notebook-extension/tracker.jupyterlab-settings": {"windowingMode": "none"},
}


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Lab:
    """A running JupyterLab: its URL, token and log file."""

    def __init__(self, url: str, token: str, log: Path, process: subprocess.Popen[bytes]) -> None:
        self.url = url
        self.token = token
        self.log = log
        self.process = process

    def page_url(self, notebook: str) -> str:
        """URL that opens ``notebook`` (relative to the root dir) in JupyterLab."""
        return f"{self.url}/lab/tree/{notebook}?token={self.token}"

    def log_tail(self, lines: int = 60) -> str:
        """The end of the server's log, for failure messages."""
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError as e:
            return f"(no log: {e})"

    def _request(self, method: str, path: str, timeout: float = 5) -> int:
        request = urllib.request.Request(
            f"{self.url}{path}",
            method=method,
            headers={"Authorization": f"token {self.token}"},
        )
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return int(response.status)

    def wait_ready(self, timeout: float) -> None:
        """Waits until the server answers, or raises with its log."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"JupyterLab exited early:\n{self.log_tail()}")
            with contextlib.suppress(OSError, urllib.error.URLError):
                if self._request("GET", "/api/status") == 200:
                    return
            time.sleep(0.25)
        raise TimeoutError(f"JupyterLab did not answer within {timeout} s:\n{self.log_tail()}")

    def stop(self) -> None:
        """Shuts the server and its kernels down, forcefully if it does not comply."""
        if self.process.poll() is None:
            with contextlib.suppress(OSError, urllib.error.URLError):
                self._request("POST", "/api/shutdown", timeout=10)
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.process.pid, signal.SIGTERM)
                try:
                    self.process.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(self.process.pid, signal.SIGKILL)
                    self.process.wait(timeout=10)


@contextlib.contextmanager
def running_lab(
    root_dir: Path, work: Path, *, timeout: float = 120, env: dict[str, str] | None = None
) -> Iterator[Lab]:
    """Starts JupyterLab on a free local port serving ``root_dir``; always stops it.

    Its configuration, data, runtime, settings and workspace directories live
    under ``work``; the server runs with the repository's ``SERVER_CONFIG``, as
    ``make demo`` and Binder do; kernels run this interpreter, with the repository
    importable. ``env`` is added to the environment of the server and its kernels
    (a storage emulator's endpoint, say).
    """
    extra_env = dict(env or {})
    for sub in ("config", "data", "runtime", "settings", "workspaces", "ipython"):
        (work / sub).mkdir(parents=True, exist_ok=True)
    shutil.copyfile(SERVER_CONFIG, work / "config" / "jupyter_server_config.py")
    for name, values in _SETTINGS.items():
        file = work / "settings" / name
        file.parent.mkdir(parents=True, exist_ok=True)
        file.write_text(json.dumps(values))
    token = secrets.token_hex(16)
    port = free_port()
    env = dict(os.environ)
    env.update(extra_env)
    env.update(
        JUPYTER_CONFIG_DIR=str(work / "config"),
        JUPYTER_DATA_DIR=str(work / "data"),
        JUPYTER_RUNTIME_DIR=str(work / "runtime"),
        JUPYTER_PLATFORM_DIRS="1",
        IPYTHONDIR=str(work / "ipython"),
        JAX_PLATFORMS="cpu",
        PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")])),
    )
    log = work / "jupyterlab.log"
    command = [
        str(JUPYTER),
        "lab",
        "--no-browser",
        "--ip=127.0.0.1",
        f"--port={port}",
        "--port-retries=0",
        f"--ServerApp.token={token}",
        "--ServerApp.password=",
        f"--ServerApp.root_dir={root_dir}",
        f"--LabApp.user_settings_dir={work / 'settings'}",
        f"--LabApp.workspaces_dir={work / 'workspaces'}",
        "--LabApp.news_url=",
        "--LabApp.expose_app_in_browser=True",
        "--LabApp.extension_manager=readonly",
    ]
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        command.append("--allow-root")  # CI containers often run as root
    with open(log, "wb") as out:
        process = subprocess.Popen(
            command,
            cwd=root_dir,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    lab = Lab(f"http://127.0.0.1:{port}", token, log, process)
    try:
        lab.wait_ready(timeout)
        yield lab
    finally:
        lab.stop()


# How long a page, a kernel or a widget may take to appear on a shared 2-core machine.
TIMEOUT_MS = 120_000


def wait_for_kernel(page: Any) -> None:
    """Waits for the open notebook's kernel to be idle, so that no kernel dialog appears."""
    page.wait_for_function(
        "() => window.jupyterapp && window.jupyterapp.shell.currentWidget"
        " && window.jupyterapp.shell.currentWidget.sessionContext",
        timeout=TIMEOUT_MS,
    )
    page.evaluate(
        "async () => { await window.jupyterapp.shell.currentWidget.sessionContext.ready; }"
    )
    page.wait_for_function(
        "() => { const s = window.jupyterapp.shell.currentWidget.sessionContext;"
        " return s.session && s.session.kernel && s.session.kernel.status === 'idle'; }",
        timeout=TIMEOUT_MS,
    )


def run_all_cells(page: Any) -> None:
    """Runs every cell of the open notebook once its kernel is ready."""
    wait_for_kernel(page)
    page.evaluate("() => window.jupyterapp.commands.execute('notebook:run-all-cells')")


def set_width(page: Any, width: int, height: int, *, settle_ms: int = 500) -> None:
    """Resizes ``page`` to ``width`` x ``height``: at 1,280 px (a laptop) the file browser
    is open beside the notebook, at other widths it is folded; then waits ``settle_ms``
    for JupyterLab to lay its panels out again."""
    page.set_viewport_size({"width": width, "height": height})
    if width == 1280:
        page.evaluate(
            "async () => { if (window.jupyterapp.shell.leftCollapsed)"
            " await window.jupyterapp.commands.execute('filebrowser:activate'); }"
        )
        page.wait_for_function("() => !window.jupyterapp.shell.leftCollapsed")
    else:
        page.evaluate("() => window.jupyterapp.shell.collapseLeft()")
        page.wait_for_function("() => window.jupyterapp.shell.leftCollapsed")
    page.wait_for_timeout(settle_ms)


def python_notebook() -> Any:
    """An empty notebook (``nbformat``) for the ``python3`` kernel, whose cells a test fills."""
    import nbformat

    notebook = nbformat.v4.new_notebook()
    notebook.metadata["kernelspec"] = {
        "name": "python3",
        "display_name": "Python 3",
        "language": "python",
    }
    return notebook
