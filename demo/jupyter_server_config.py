"""Jupyter server settings for the tinax notebooks (``make demo``, Binder, the browser tests).

Opening a notebook must not change it on disk. When a kernel starts, JupyterLab
copies the kernel's ``language_info`` (Python's exact version, the lexer, the
file extension...) into the notebook's metadata and marks it modified, and the
next autosave would write it: one machine's details in a file kept in git. The
hook below keeps only the language's name before each save, and drops saved
widget state (stale, machine-specific output), so the notebooks' bytes stay as
committed until their cells or outputs really change.
"""

from __future__ import annotations

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
