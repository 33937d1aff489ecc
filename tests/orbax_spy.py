"""The ``orbax_loads`` fixture: which checkpointables each load in a test hands to
Orbax's load (tinax's engine loaded the others). A test module imports it::

    import orbax_spy

    orbax_loads = orbax_spy.orbax_loads  # the fixture
"""

from __future__ import annotations

from typing import Any

import pytest
from orbax.checkpoint import v1 as ocp

from tinax.checkpointing import _checkpointables


@pytest.fixture
def orbax_loads(monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    """The checkpointables each load handed to Orbax (the engine loaded the others)."""
    calls: list[list[str]] = []
    real = ocp.load_checkpointables

    def spy(path: Any, abstract: Any, *args: Any, **kwargs: Any) -> Any:
        calls.append(sorted(abstract))
        return real(path, abstract, *args, **kwargs)

    monkeypatch.setattr(_checkpointables.ocp, "load_checkpointables", spy)
    return calls
