"""``verify``'s findings for a terminal: grouped, keys readable, at any width.

A checkpoint whose state went NaN has one warning per leaf, and a run of sixty such
checkpoints thousands: the terminal shows one line per kind of finding in each
checkpointable (``model: 512 leaves hold NaN or Inf: blocks.0.attn.q, …``), and
checkpoints in a row whose findings are the same leaves said once. Keys are shown
dotted, as everywhere (``display.readable_key``), and wrapped whole, never cut.
"""

from __future__ import annotations

import dataclasses
import re
import textwrap
from collections.abc import Sequence
from pathlib import Path
from typing import TextIO

import pandas as pd

from tinax._format.naming import words
from tinax.explore import display
from tinax.explore._verify.verification import Verification

# The severity column is this wide (``warning``), then a gap.
_SEVERITY = 9
# A group names at most this many of its leaves' keys before "… and N more".
_KEYS_SHOWN = 8
# A finding's count of NaN and Inf ("holds 1,024 NaN and 0 Inf").
_NONFINITE = re.compile(r"^holds [\d,]+ NaN and [\d,]+ Inf$")
_NUMBER = re.compile(r"\d[\d,]*")
# What NaN and Inf findings say, grouped: their counts are in the verdict (and JSON).
_HOLD_NONFINITE = "hold NaN or Inf"


@dataclasses.dataclass(frozen=True)
class Group:
    """Findings of one severity and kind in one checkpointable.

    Attributes:
      severity: ``error``, ``warning`` or ``info``.
      checkpointable: The part's checkpointable (``""`` for the whole checkpoint).
      what: What the findings say, numbers left out when there are several.
      keys: The leaves' keys (``keystr``), in order; empty for findings of no leaf.
      messages: The findings' own messages, for a group of one.
    """

    severity: str
    checkpointable: str
    what: str
    keys: tuple[str, ...]
    messages: tuple[str, ...]

    def line(self) -> str:
        """The group in words, keys dotted."""
        where = f"{self.checkpointable}: " if self.checkpointable else ""
        if len(self.messages) == 1 and self.what != _HOLD_NONFINITE:
            key = f"{display.readable_key(self.keys[0])}: " if self.keys else ""
            return f"{where}{key}{self.messages[0]}"
        shown = [display.readable_key(k) for k in self.keys[:_KEYS_SHOWN]]
        more = len(self.keys) - len(shown)
        tail = f", … and {more} more" if more > 0 else ""
        count = len(self.messages)
        leaves = f"{count} lea{'f' if count == 1 else 'ves'}" if self.keys else f"{count}×"
        what = "holds NaN or Inf" if self.what == _HOLD_NONFINITE and count == 1 else self.what
        listed = f": {', '.join(shown)}{tail}" if shown else ""
        if self.what != _HOLD_NONFINITE:
            # Findings alike but for their numbers: the first one said in full.
            return f"{where}{leaves} ({self.messages[0]}){listed}"
        return f"{where}{leaves} {what}{listed}"


def _split_part(part: str) -> tuple[str, str | None]:
    """``"model ['w']"`` as ``("model", "['w']")``; a part without a key as ``(part, None)``."""
    name, _, key = part.partition(" ")
    return (name, key) if key.startswith("[") else (part, None)


def groups(findings: pd.DataFrame) -> list[Group]:
    """The findings grouped by severity, checkpointable and kind, errors first."""
    found: dict[tuple[str, str, str], list[tuple[str | None, str]]] = {}
    for severity, part, message in zip(
        findings["severity"], findings["part"], findings["message"], strict=True
    ):
        name, key = _split_part(str(part) if not pd.isna(part) else "")
        text = str(message)
        what = _HOLD_NONFINITE if _NONFINITE.match(text) else _NUMBER.sub("N", text)
        found.setdefault((str(severity), name, what), []).append((key, text))
    order = {words.ERROR: 0, words.WARNING: 1, words.INFO: 2}
    out = [
        Group(
            severity,
            name,
            what,
            tuple(k for k, _ in items if k is not None),
            tuple(m for _, m in items),
        )
        for (severity, name, what), items in found.items()
    ]
    return sorted(out, key=lambda g: order.get(g.severity, 3))


def _signature(result: Verification) -> tuple[tuple[str, str, str, tuple[str, ...]], ...]:
    """What a checkpoint's findings are, numbers aside: checkpoints in a row with the
    same are said once."""
    return tuple((g.severity, g.checkpointable, g.what, g.keys) for g in groups(result.findings))


def print_groups(found: Sequence[Group], out: TextIO, total: int, indent: str = "") -> None:
    """One wrapped line per group: its severity, then its words; keys never cut."""
    for group in found:
        first = f"{indent}{group.severity:<{_SEVERITY}}"
        rest = " " * len(first)
        lines = textwrap.wrap(
            group.line(),
            max(20, total),
            initial_indent=first,
            subsequent_indent=rest,
            break_on_hyphens=False,
            break_long_words=False,
        )
        for line in lines:
            print(line, file=out)


def print_run_findings(
    checked: Sequence[tuple[str, Verification]], out: TextIO, total: int
) -> None:
    """The findings of a run's checkpoints: those in a row with the same findings once,
    under their names (``step_000245 … step_000300, 12 checkpoints (diverged):``)."""
    runs: list[list[tuple[str, Verification]]] = []
    for path, result in checked:
        if runs and _signature(runs[-1][-1][1]) == _signature(result):
            runs[-1].append((path, result))
        else:
            runs.append([(path, result)])
    for together in runs:
        first, last = Path(together[0][0]).name, Path(together[-1][0]).name
        statuses = ", ".join(dict.fromkeys(r.status for _, r in together))
        if len(together) == 1:
            title = f"{first} ({statuses}):"
        else:
            title = f"{first} … {last}, {len(together)} checkpoints ({statuses}), each:"
        print(file=out)
        for line in textwrap.wrap(title, total, break_on_hyphens=False) or [""]:
            print(line, file=out)
        print_groups(groups(together[0][1].findings), out, total, indent="  ")
