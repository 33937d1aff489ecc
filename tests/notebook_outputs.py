"""What the notebook tests share: which notebooks run where, and what a reader would see
in red.

Each notebook runs once in the suite: those that read what Binder's ``postBuild`` makes
(the demo runs) in Binder's own environment (``tests/test_binder.py``), the others in
the development one (``tests/test_notebooks.py``), both held to ``complaints``.
"""

from __future__ import annotations

import nbformat

# Run in Binder's environment, on the demo runs its postBuild wrote.
IN_BINDER = ("02_explore_a_run.ipynb", "06_run_timeline.ipynb")


def complaints(nb: nbformat.NotebookNode) -> list[str]:
    """What a reader would see in red or as a warning: stderr streams, errors, warnings."""
    found = []
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        for output in cell.outputs:
            if output.output_type == "stream" and output.name == "stderr":
                found.append(f"stderr after {cell.source[:60]!r}: {output.text[:500]}")
            elif output.output_type == "error":
                found.append(f"error after {cell.source[:60]!r}: {output.ename}")
            elif output.output_type == "stream" and "Warning" in output.text:
                found.append(f"warning after {cell.source[:60]!r}: {output.text[:500]}")
    return found
