"""Jupyter server settings for the tinax notebooks (``make demo``, Binder, the browser tests).

Opening a notebook must not change it on disk. When a kernel starts, JupyterLab
copies the kernel's ``language_info`` (Python's exact version, the lexer, the
file extension...) into the notebook's metadata and marks it modified, and the
next autosave would write it: one machine's details in a file kept in git. The
hook below keeps only the language's name before each save, and drops saved
widget state (stale, machine-specific output), so the notebooks' bytes stay as
committed until their cells or outputs really change.

JupyterLab's announcements are off: on a first start it asks, in a toast over the
notebook, whether to fetch Jupyter's news feed, and it checks the network for newer
versions; neither belongs over a demo (nor on a machine without a network). The toast
is asked by a setting (``fetchNews``), so its default is overridden in
``lab_settings/overrides.json`` beside this file (Binder's postBuild copies both).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from jupyter_server.services.contents.largefilemanager import AsyncLargeFileManager

c: Any = get_config()  # type: ignore[name-defined]  # noqa: F821 - provided by Jupyter


def keep_notebook_metadata_stable(model: dict[str, Any], **_kwargs: Any) -> None:
    """Strips what a kernel or a widget manager adds to a notebook's metadata."""
    if model.get("type") != "notebook" or not isinstance(model.get("content"), dict):
        return
    metadata = model["content"].get("metadata")
    if not isinstance(metadata, dict):
        return
    language = metadata.get("language_info")
    if isinstance(language, dict) and "name" in language:
        metadata["language_info"] = {"name": language["name"]}
    metadata.pop("widgets", None)


class StableNotebooksContentsManager(AsyncLargeFileManager):
    """Jupyter's default contents manager, with the hook above run before every save.

    Registered with ``register_pre_save_hook`` rather than set as the
    ``pre_save_hook`` option: Jupyter validates that option again once the config is
    applied and then warns that the hook overrides itself.
    """

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.register_pre_save_hook(keep_notebook_metadata_stable)


c.ServerApp.contents_manager_class = StableNotebooksContentsManager

# ``None`` (not an empty URL): the server fetches no news and tells the page so.
c.LabApp.news_url = None
c.LabApp.check_for_updates_class = "jupyterlab.NeverCheckForUpdate"
# JupyterLab's own settings directory for administrators' defaults (empty in a pip
# install) is replaced by ours: the question is never asked; a user may still opt in.
_LAB_SETTINGS = Path(__file__).resolve().with_name("lab_settings")
if (_LAB_SETTINGS / "overrides.json").is_file():
    c.LabApp.app_settings_dir = str(_LAB_SETTINGS)
