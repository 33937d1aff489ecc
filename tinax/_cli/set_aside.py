"""``tinax set-aside``: a run's diverged checkpoints set aside or removed
(``tinax.checkpointing.set_aside_diverged``)."""

from __future__ import annotations

import argparse
import dataclasses
from typing import TextIO

from tinax._cli import terminal as term
from tinax._cli.output import _dump, _say


def set_aside_command(args: argparse.Namespace, out: TextIO) -> int:
    """Sets aside (or removes) the diverged checkpoints of ``args.root``; 0 whatever it
    found (errors are raised)."""
    # tinax.checkpointing brings JAX and Orbax: imported by the commands that write only.
    from tinax.checkpointing import set_aside_diverged

    done = set_aside_diverged(args.root, remove=args.remove, data=args.data, dry_run=args.dry_run)
    if args.json:
        _dump(
            {
                "root": args.root,
                "dry_run": args.dry_run,
                "removed": args.remove,
                "checkpoints": [dataclasses.asdict(d) for d in done],
            },
            out,
        )
        return 0
    total = term.width()
    if not done:
        unread = "" if args.data else " (--data reads those whose health is not yet known)"
        _say(f"{args.root}: no checkpoint known to have diverged{unread}", out, total)
        return 0
    verb = "removed" if args.remove else "set aside"
    if args.dry_run:
        verb = f"would be {verb}"
    count = f"{len(done)} diverged checkpoint{'s' * (len(done) != 1)}"
    said = f"{args.root}: {count} {verb}"
    if not args.remove:
        said += " (renamed <name>.tinax-abandoned, kept for inspection, never resumed from)"
    _say(said + ":", out, total)
    for found in done:
        tier = f" ({found.tier})" if found.tier else ""
        kept = "" if found.now is not None or args.remove or args.dry_run else " (left: in use)"
        _say(f"  step {found.step}{tier}: {found.reason}{kept}", out, total)
    return 0
