"""``verify``'s checks of a checkpoint's structure: commit state, safety, the load's
preflight, the checkpointables present, and Grain iterator files."""

from __future__ import annotations

from collections.abc import Iterable

from tinax._format.integrity import iterstate, preflight
from tinax._format.metadata import arrays, commit_record, jsonitems, layout
from tinax._format.metadata.layout import Checkpoint, StoredCheckpointable
from tinax._format.naming import names, words
from tinax._format.records import runrecord
from tinax._format.storage import files
from tinax._format.storage.location import DIRECTORY, FILE, LINK, Entry, Location
from tinax.explore._verify.checks import Check, Finding, PyTreeState, VerifyTarget


class CommitCheck(Check):
    """The checkpoint committed: not a temporary directory, recorded, marked, not being deleted."""

    def structure(self, target: VerifyTarget) -> Iterable[Finding]:
        path = target.path
        top = target.entries(path)
        if names.is_temporary_name(path.name):
            yield Finding(
                "",
                words.ERROR,
                "an Orbax temporary directory: a save that has not committed (still in "
                "progress, or interrupted); it is not a checkpoint",
            )
        if names.DELETION_MARKER in top:
            yield Finding(names.DELETION_MARKER, words.ERROR, "the checkpoint is being deleted")
        found = runrecord.found_corrupt(path, top)
        if found is not None:
            yield Finding(
                names.CORRUPT_RECORD,
                words.ERROR,
                f"{words.FOUND_CORRUPT}: a training run's restore could not load it ({found}) "
                "and set it aside; loads refuse it",
            )
        if names.CHECKPOINT_METADATA not in top:
            inside = _checkpoints_inside(target)
            if inside:
                shown = ", ".join(inside[:3]) + (
                    f" and {len(inside) - 3} more" if len(inside) > 3 else ""
                )
                yield Finding(
                    "",
                    words.ERROR,
                    f"a run of {len(inside)} checkpoints ({shown}), not a checkpoint: "
                    "verify each of them (list_checkpoints shows which are complete)",
                )
            else:
                yield Finding(
                    names.CHECKPOINT_METADATA,
                    words.ERROR,
                    "missing: Orbax writes it when a save finishes, so this save never did",
                )
        else:
            try:
                if target.record is None:  # else read when verify was given it opened
                    target.record = commit_record.read_checkpoint_record(path)
            except ValueError as e:
                yield Finding(names.CHECKPOINT_METADATA, words.ERROR, str(e))
            else:
                if target.record.committed_nsecs is None:
                    yield Finding(
                        names.CHECKPOINT_METADATA, words.WARNING, "records no commit time"
                    )
        marker = top.get(names.COMMIT_SUCCESS)
        if marker is None:
            if path.storage.commits_by_rename:
                yield Finding(
                    names.COMMIT_SUCCESS,
                    words.INFO,
                    "absent; on a local disk the final rename is what commits a save",
                )
            else:
                yield Finding(
                    names.COMMIT_SUCCESS,
                    words.ERROR,
                    "missing: on an object store a save commits by writing it last",
                )
        elif marker.kind != FILE:
            yield Finding(names.COMMIT_SUCCESS, words.ERROR, "is not a regular file")


def _checkpoints_inside(target: VerifyTarget) -> list[str]:
    """Names of the directories directly under the path verified that are checkpoints
    (a run's)."""
    path, found = target.path, []
    for name, entry in sorted(target.entries(path).items()):
        if entry.kind == DIRECTORY and (
            names.CHECKPOINT_METADATA in target.entries(path / name)
            or names.is_temporary_name(name)
        ):
            found.append(name)
    return found


class SafetyCheck(Check):
    """Nothing under the checkpoint leads out of it: no outward link, no FIFO or device."""

    def structure(self, target: VerifyTarget) -> Iterable[Finding]:
        storage = target.path.storage
        for directory, entries in sorted(target.listing.items()):
            for entry in sorted(entries.values(), key=lambda e: e.name):
                yield from self._entry(target, Location(storage, directory) / entry.name, entry)
        if not target.safe:
            yield Finding(
                "", words.INFO, "array stores not read: the checkpoint is not safe to read"
            )

    @staticmethod
    def _entry(target: VerifyTarget, where: Location, entry: Entry) -> Iterable[Finding]:
        if entry.kind == LINK:
            if not target.path.storage.inside(entry.link_target or "", target.path.path):
                target.safe = False
                yield Finding(
                    target.relative(where),
                    words.ERROR,
                    f"a symbolic link to {entry.link_target!r}, outside the checkpoint",
                )
        elif entry.kind not in (FILE, DIRECTORY):
            target.safe = False
            yield Finding(
                target.relative(where),
                words.ERROR,
                "neither a regular file nor a directory; a checkpoint holds nothing else",
            )


class PreflightCheck(Check):
    """Every file passes the check every load passes first (``tinax._format.integrity.preflight``).

    A checkpoint a load refuses is never sound: the same parse of every metadata
    file, the same size caps, the same refusals, in the same words. The other
    checks still run to say more (the array store's bookkeeping is size-checked
    again before tensorstore reads it); the refusal itself is reported when no
    other check found what is wrong.
    """

    def structure(self, target: VerifyTarget) -> Iterable[Finding]:
        if not target.safe or names.is_temporary_name(target.path.name):
            return ()
        if target.checkpoint is not None:
            return ()  # verify was given it opened: it passed this check then
        if names.CHECKPOINT_METADATA not in target.entries(target.path):
            return ()  # reported by CommitCheck; nothing else can be opened
        try:
            # The listing walked and the record read once for every check; the opened
            # checkpoint keeps what the check reads, for every check after it.
            scan = target.scan or files.scan(target.path, listed=target.listing)
            target.checkpoint = preflight.check(target.path, scan, target.record)
        except (ValueError, OSError) as e:
            target.refused = str(e)
        else:
            target.ctx = arrays.context_of(target.checkpoint)
        return ()


class CheckpointablesCheck(Check):
    """The checkpointables recorded are the ones present, and each is in a known layout."""

    def structure(self, target: VerifyTarget) -> Iterable[Finding]:
        reported = False
        for finding in self._listed(target):
            reported = reported or finding.severity == words.ERROR
            yield finding
        if not target.safe:
            return
        path = target.path
        try:
            if target.checkpoint is None:  # the preflight refused it (or did not run)
                scan = target.scan or files.scan(path, listed=target.listing)
                target.checkpoint = layout.identify(path, scan, target.record)
        except (ValueError, OSError) as e:
            # An unreadable record, a temporary name or a missing directory is reported already.
            unreadable_record = (
                target.record is None and names.CHECKPOINT_METADATA in target.entries(path)
            )
            if not (reported or unreadable_record or names.is_temporary_name(path.name)):
                yield Finding("", words.ERROR, f"cannot be opened: {e}")
            target.checkpoint = self._present(target)
            if target.checkpoint is None:
                return
        for item in target.checkpoint.checkpointables:
            if item.layout == layout.PYTREE:
                target.trees[item.name] = PyTreeState(item)
            elif item.layout == layout.UNKNOWN:
                yield Finding(
                    item.name or ".",
                    words.WARNING,
                    "stored in a layout tinax does not know; its contents are not checked",
                )

    @staticmethod
    def _present(target: VerifyTarget) -> Checkpoint | None:
        """The recorded checkpointables that are there, so that they are still checked."""
        record = target.record
        if record is None or not isinstance(record.item_handlers, dict):
            return None
        top = target.entries(target.path)
        items = tuple(
            StoredCheckpointable(
                name,
                target.path / name,
                layout.classify(target.path / name, target.entries(target.path / name))
                or layout.UNKNOWN,
            )
            for name in record.item_handlers
            if name in top and top[name].kind == DIRECTORY
        )
        try:
            scan = target.scan or files.scan(target.path, listed=target.listing)
        except ValueError:
            return None
        return Checkpoint(
            target.path, items, record.committed_nsecs, scan, record.checksummed, record=record
        )

    @staticmethod
    def _listed(target: VerifyTarget) -> Iterable[Finding]:
        path = target.path
        top = target.entries(path)
        recorded = target.record.item_handlers if target.record is not None else None
        present = {
            name
            for name, entry in top.items()
            if entry.kind == DIRECTORY
            and layout.classify(path / name, target.entries(path / name)) is not None
        }
        if isinstance(recorded, dict):
            for name in recorded:
                if name not in top or top[name].kind != DIRECTORY:
                    yield Finding(
                        name,
                        words.ERROR,
                        f"listed in {names.CHECKPOINT_METADATA} but has no directory",
                    )
            for name in sorted(present - set(recorded)):
                yield Finding(
                    name,
                    words.WARNING,
                    f"a checkpointable directory not listed in {names.CHECKPOINT_METADATA}; "
                    "a load does not see it",
                )


class IteratorCheck(Check):
    """Every process's iterator state file is there, for the process count recorded, and reads."""

    def structure(self, target: VerifyTarget) -> Iterable[Finding]:
        if target.checkpoint is None:
            return
        for item in target.checkpoint.checkpointables:
            if item.layout == layout.ITERATOR:
                yield from self._iterator(target, item)
            elif item.layout == layout.JSON:
                try:
                    jsonitems.read_json_item(item)
                except ValueError as e:
                    yield Finding(target.relative(item.directory), words.ERROR, str(e))
            elif item.layout == layout.EMPTY:
                try:
                    jsonitems.read_empty_record(item)
                except ValueError as e:
                    yield Finding(
                        f"{target.relative(item.directory)}/{names.EMPTY_PYTREE}".lstrip("/"),
                        words.ERROR,
                        str(e),
                    )

    @staticmethod
    def _iterator(target: VerifyTarget, item: StoredCheckpointable) -> Iterable[Finding]:
        where = target.relative(item.directory)
        found = jsonitems.iterator_files(item)
        counts = sorted({count for _, count, _ in found})
        if len(counts) > 1:
            yield Finding(
                where,
                words.ERROR,
                f"iterator files disagree on the process count: {', '.join(map(str, counts))}",
            )
        for count in counts:
            present = {index for index, n, _ in found if n == count}
            for index in range(count):
                if index not in present:
                    name = names.iterator_file_name(index, count)
                    yield Finding(
                        f"{where}/{name}".lstrip("/"),
                        words.ERROR,
                        f"missing: the state of process {index} of {count}",
                    )
            for index in sorted(present - set(range(count))):
                yield Finding(
                    f"{where}/{names.iterator_file_name(index, count)}".lstrip("/"),
                    words.ERROR,
                    f"names process {index} of only {count}",
                )
        for _, _, name in found:
            try:
                state = item.checkpoint.read_json(
                    item.directory / name, what="Grain iterator state"
                )
            except ValueError as e:
                yield Finding(f"{where}/{name}".lstrip("/"), words.ERROR, str(e))
                continue
            # The rules the load checks before Grain reads the state.
            problems = iterstate.state_problems(state)
            if problems:
                yield Finding(
                    f"{where}/{name}".lstrip("/"),
                    words.ERROR,
                    "not a Grain iterator state a load can resume from: " + "; ".join(problems),
                )
