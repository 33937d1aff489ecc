"""The checkpoints of a run directory: which are complete, and crash-safe removal.

A run's checkpoints are named ``step_<step>`` (``names.run_checkpoint_name``). A
training run (``TrainingRun``) keeps them in one directory, or in two (a local tier and
a durable one); this module does what each directory needs, whichever tier it is.

Removal is crash-safe. A checkpoint is removed by first writing the deletion marker
(``names.DELETION_MARKER``) into it, then its commit records, then everything else,
the marker last. From the marker's first byte on, listings show it as
``being removed`` and no load accepts it; a kill at any instant leaves either a
complete checkpoint or one marked as being removed, never a half-removed one that
looks complete. The next run finishes what a killed one left.

A checkpoint that a restore skips because its data does not load is set aside once
an older one has loaded: the record ``names.CORRUPT_RECORD`` (why, and when) is written
into it, then it is renamed ``<name>.tinax-corrupt`` (``names.corrupt_name``), kept for
inspection. (On object stores, which cannot rename, it stays marked in place, and the
save of its step removes it first.)
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import time
from collections.abc import Iterator

from tinax import _claims
from tinax._format.naming import names
from tinax._format.storage import removal
from tinax._format.storage.location import FILE, Location

_log = logging.getLogger("tinax.checkpointing")


def check_writable(root: Location, step: int, what: str) -> None:
    """Refuses a save of ``step`` into the run directory ``root`` (the run's ``what``)
    that this process cannot write, before anything is written; object stores are not
    asked (a refused write there says so itself).

    Raises:
      PermissionError: A paragraph naming the directory, why, and what still works.
    """
    if root.storage.implicit_directories:
        return  # an object store: no directory to ask
    if os.path.isdir(root.path) and os.access(root.path, os.W_OK | os.X_OK):
        return
    try:
        read_only = bool(os.statvfs(root.path).f_flag & os.ST_RDONLY)
    except OSError:
        read_only = False
    why = "is on a read-only file system" if read_only else "is not writable by this process"
    raise PermissionError(
        f"cannot save step {step}: {what} {str(root)!r} {why}. A training run writes each "
        f"checkpoint and its record ({names.RUN_RECORD}) there: give TrainingRun a "
        "directory this process can write. Its checkpoints can still be restored "
        "(run.restore) and read (tinax.explore, the tinax command). Nothing was written",
    )


def complete_checkpoints(root: Location) -> dict[int, Location]:
    """The committed checkpoints of the run directory ``root`` by step: named as a run
    names them, not being removed or set aside, and with a commit record."""
    found: dict[int, Location] = {}
    listed = root.snapshot()
    for name, entry in listed.entries().items():
        match = names.RUN_CHECKPOINT.match(name)
        if match is None or entry.kind == FILE:
            continue
        inside = (listed / name).entries()
        if (
            names.DELETION_MARKER in inside
            or names.CORRUPT_RECORD in inside
            or names.ABANDONED_RECORD in inside
            or names.CHECKPOINT_METADATA not in inside
        ):
            continue
        found[int(match.group(1))] = root / name
    return found


@contextlib.contextmanager
def _claimed(where: Location, refused: str) -> Iterator[bool]:
    """Holds the claim on ``where`` for the block: ``True`` if taken, ``False`` if a live
    save holds it, logged as ``refused % (where, why)``; then the block does nothing."""
    try:
        held = _claims.claim(where)
    except FileExistsError as e:
        _log.warning(refused, where, e)
        yield False
        return
    try:
        yield True
    finally:
        if held is not None:
            held.release()


def remove_checkpoint(where: Location) -> None:
    """Removes one checkpoint, marker first and last (see the module docstring)."""
    with _claimed(where, "not removing %s: %s") as claimed:
        if claimed:
            removal.mark_for_removal(where)
            _log.info("removing %s (the run keeps it no longer)", where)
            removal.finish_removal(where)


def set_aside(where: Location, reason: str) -> None:
    """Marks a checkpoint a restore refused, then moves it out of its step's way."""
    with _claimed(where, "not setting %s aside: %s") as claimed:
        if claimed:
            _set_aside(where, reason)


def _set_aside(where: Location, reason: str) -> None:
    try:
        record = {
            "format": names.CORRUPT_RECORD_FORMAT,
            "name": where.name,
            "reason": reason,
            "found_ns": time.time_ns(),
        }
        removal.replace_file(
            where / names.CORRUPT_RECORD, json.dumps(record, indent=1).encode("utf-8")
        )
        if not where.storage.commits_by_rename:
            _log.warning(
                "checkpoint %s does not load (%s): marked corrupt in place; the save "
                "of its step removes it",
                where,
                reason,
            )
            return
        for attempt in range(1, 1000):
            aside = where.parent / names.corrupt_name(where.name, attempt)
            if aside.exists():
                continue
            os.rename(where.path, aside.path)
            _log.warning(
                "checkpoint %s does not load (%s): moved aside to %s, kept for "
                "inspection; the resumed job saves its step again",
                where,
                reason,
                aside.name,
            )
            return
    except OSError as e:
        _log.warning("could not set %s aside: %s", where, e)


def set_aside_abandoned(where: Location, from_step: int | None, reason: str) -> str | None:
    """Moves a checkpoint a run leaves behind out of its step's way, marked so: one of
    the branch it left when it went on from the earlier ``from_step``, or one set aside
    for ``reason`` (it diverged). Renamed ``<name>.tinax-abandoned``, or marked in place
    on an object store. Returns the name it now has (``None`` if a live save holds it,
    or the move failed: logged)."""
    with _claimed(where, "not setting %s aside: %s") as claimed:
        if not claimed:
            return None
        try:
            record = {
                "format": names.ABANDONED_RECORD_FORMAT,
                "name": where.name,
                "went_on_from": from_step,
                "reason": reason,
                "set_aside_ns": time.time_ns(),
            }
            removal.replace_file(
                where / names.ABANDONED_RECORD, json.dumps(record, indent=1).encode("utf-8")
            )
            if not where.storage.commits_by_rename:
                return where.name  # marked in place: the save of its step removes it
            for attempt in range(1, 1000):
                aside = where.parent / names.abandoned_name(where.name, attempt)
                if not aside.exists():
                    os.rename(where.path, aside.path)
                    return aside.name
        except OSError as e:
            _log.warning("could not set %s aside: %s", where, e)
        return None


def clear_marked(root: Location, step: int) -> None:
    """Removes a checkpoint of ``step`` marked in place (object stores) as corrupt, or
    as of a branch the run left, so that its step can be saved again."""
    where = root / names.run_checkpoint_name(step)
    for record, why in (
        (names.CORRUPT_RECORD, "marked corrupt by a restore"),
        (names.ABANDONED_RECORD, "of a branch the run left"),
    ):
        if (where / record).exists():
            _log.warning("removing %s, %s, to save its step again", where, why)
            remove_checkpoint(where)
            return


def clean_up(root: Location, newest: int | None, *, every_unfinished: bool = False) -> None:
    """Finishes removals a killed run left, and removes interrupted saves.

    Args:
      root: The run directory.
      newest: Its newest complete step; interrupted saves older than it are removed.
      every_unfinished: Remove every save that has not committed, whatever its step,
        and on object stores whatever its activity, and finish the commit of one whose
        marker alone is missing: the caller is the directory's only writer (the
        durable tier of a two-tier run, written by promotions alone, each of which
        writes its commit record after every other file).
    """
    removal.remove_stale_temporaries(root / names.RUN_RECORD)
    listed = root.snapshot()
    for name, entry in sorted(listed.entries().items()):
        if entry.kind == FILE:
            continue
        final = names.final_name(name)
        match = names.RUN_CHECKPOINT.match(final)
        if match is None:
            continue
        where = root / name
        if final == name and (listed / name / names.DELETION_MARKER).exists():
            held = None
            try:
                held = _claims.claim(where)
                _log.info("finishing the removal of %s", where)
                removal.finish_removal(where)
            except FileExistsError as e:
                _log.warning("not removing %s: %s", where, e)
            finally:
                if held is not None:
                    held.release()
            continue
        older = newest is not None and int(match.group(1)) < newest
        if not (older or every_unfinished):
            continue
        if final == name and _claims.uncommitted_status(listed / name) is None:
            inside = (listed / name).entries()
            if (
                every_unfinished
                and names.COMMIT_SUCCESS not in inside
                and (not where.storage.commits_by_rename and names.CHECKPOINT_METADATA in inside)
            ):
                # A promotion killed between its last two writes: every file is in,
                # the commit record too; its marker completes the commit as Orbax's.
                _log.warning("finishing the commit of %s, left by an interrupted promotion", where)
                (where / names.COMMIT_SUCCESS).write_new(names.commit_success_text(str(where)))
            continue  # committed
        if every_unfinished and final == name:
            # In place on an object store: a promotion killed before its commit.
            _log.warning("removing %s, left by an interrupted promotion", where)
            where.remove_tree()
            continue
        try:
            _claims.remove_interrupted(where)
            _log.info("removed %s, left by an interrupted save", where)
        except (FileExistsError, ValueError, FileNotFoundError):
            pass  # A save still runs there, or it has gone meanwhile.
