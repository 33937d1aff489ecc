"""``verify``'s check of each pytree checkpointable: its metadata against its array store."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from tinax._format.arraydata import chunks
from tinax._format.integrity import preflight
from tinax._format.metadata import arrays, pytree, written
from tinax._format.metadata.layout import StoredCheckpointable
from tinax._format.naming import names, words
from tinax.explore._verify.checks import (
    Check,
    Finding,
    PyTreeState,
    StoredArray,
    VerifyTarget,
)


def _message(error: BaseException) -> str:
    return arrays.message(error) if isinstance(error, ValueError) else f"{error}"


class PyTreeCheck(Check):
    """Each pytree's metadata reads, and agrees with its array store, whose data files are whole."""

    def structure(self, target: VerifyTarget) -> Iterable[Finding]:
        for state in target.trees.values():
            yield from self._check(target, state)

    def _check(self, target: VerifyTarget, state: PyTreeState) -> Iterable[Finding]:
        directory = state.item.directory
        where = target.relative(directory)
        try:
            tree = state.tree = pytree.read_layout(state.item)
        except ValueError as e:
            yield Finding(f"{where}/{names.PYTREE_METADATA}".lstrip("/"), words.ERROR, str(e))
            return
        in_store = [
            leaf for leaf in tree.leaves if leaf.stored and leaf.kind in words.STORED_ARRAY_KINDS
        ]
        yield from self._strings_and_shardings(target, tree)
        written = yield from self._written(target, state.item)
        if not in_store:
            state.readable = True
            return
        try:
            preflight.check_store_files(state.item)
        except ValueError as e:
            yield Finding(where, words.ERROR, str(e))
            return
        if tree.ocdbt:
            paths = [pytree.storage_path(leaf.param) for leaf in in_store]
            try:
                state.contents = chunks.store_contents(tree, paths, ctx=target.ctx)
            except (ValueError, KeyError, TypeError) as e:
                # Without its index nothing in the store can be found: one finding says it.
                yield Finding(
                    f"{where}/{names.OCDBT_MANIFEST}".lstrip("/"),
                    words.ERROR,
                    f"the array store's manifest or index cannot be read: {_message(e)}",
                )
                return
        try:
            infos = pytree.array_infos(tree, in_store, target.ctx)
        except ValueError as e:
            # The bulk read stops at the first bad array; name every one.
            infos, bad = {}, []
            for leaf in in_store:
                try:
                    infos.update(pytree.array_infos(tree, [leaf], target.ctx))
                except ValueError as e2:
                    bad.append(Finding(f"{state.item.name} {leaf.key}", words.ERROR, _message(e2)))
            yield from bad or [Finding(where, words.ERROR, _message(e))]
        for leaf in in_store:
            info = infos.get(leaf.param)
            if info is None:
                continue
            array = StoredArray(state.item.name, leaf.key, leaf.param, info)
            yield from self._array(array, leaf, info, written)
            state.arrays.append(array)
        if state.contents is not None:
            yield from self._store(target, state, state.contents)
        else:
            state.readable = True

    @staticmethod
    def _strings_and_shardings(
        target: VerifyTarget, tree: pytree.PyTreeLayout
    ) -> Iterable[Finding]:
        where = target.relative(tree.directory)
        strings = [leaf.param for leaf in tree.leaves if leaf.kind == words.STRING]
        if strings:
            try:
                pytree.read_strings(tree, strings)
            except ValueError as e:
                yield Finding(f"{where}/{names.STRINGS}", words.ERROR, str(e))
        try:
            pytree.read_shardings(tree, [leaf.param for leaf in tree.leaves])
        except ValueError as e:
            yield Finding(f"{where}/{names.SHARDINGS}", words.ERROR, str(e))

    @staticmethod
    def _written(target: VerifyTarget, item: StoredCheckpointable) -> Any:
        try:
            return written.read_written_arrays(item)
        except ValueError as e:
            yield Finding(
                f"{target.relative(item.directory)}/{names.ARRAY_METADATAS}", words.ERROR, str(e)
            )
            return {}

    @staticmethod
    def _array(
        array: StoredArray,
        leaf: pytree.StoredLeaf,
        info: arrays.ArrayInfo,
        written: dict[str, list[written.WrittenArray]],
    ) -> Iterable[Finding]:
        if info.itemsize is None:
            yield Finding(array.part, words.ERROR, f"stored with dtype {info.dtype!r}, unknown")
        if leaf.kind == words.SCALAR and info.shape != ():
            yield Finding(
                array.part,
                words.ERROR,
                f"a scalar in the metadata, but stored with shape {info.shape}",
            )
        for process, records in written.items():
            for record in records:
                if record.param != leaf.param or record.write_shape is None:
                    continue
                shape = record.write_shape
                if len(shape) != len(info.shape) or any(
                    w > s for w, s in zip(shape, info.shape, strict=False)
                ):
                    yield Finding(
                        array.part,
                        words.ERROR,
                        f"{process} recorded writing a {shape} part of it, but the array "
                        f"store holds shape {info.shape}",
                    )

    @staticmethod
    def _store(
        target: VerifyTarget, state: PyTreeState, contents: chunks.StoreContents
    ) -> Iterable[Finding]:
        tree = state.tree
        assert tree is not None
        where = target.relative(tree.directory)
        paths = {pytree.storage_path(a.param): a for a in state.arrays}
        refs: dict[str, list[StoredArray]] = {}
        all_refs = []
        for path, stored in contents.chunks.items():
            if path not in paths:
                continue
            for value in stored.values():
                if isinstance(value, arrays.ValueRef):
                    all_refs.append(value)
                    refs.setdefault(value.file, []).append(paths[path])
        broken = chunks.missing_data(tree, all_refs)
        for file, problem in broken.items():
            state.damaged.update(a.key for a in refs.get(file, []))
            owners = sorted({a.part for a in refs.get(file, [])})
            shown = ", ".join(owners[:3]) + (
                f" and {len(owners) - 3} more" if len(owners) > 3 else ""
            )
            yield Finding(
                f"{where}/{file}".lstrip("/"),
                words.ERROR,
                f"a data file of the array store {problem}; it holds chunks of {shown}",
            )
        for path, array in paths.items():
            expected = chunks.expected_chunk_count(array.info.shape, array.info.grid_shape)
            found = len(contents.chunks.get(path, {}))
            if found < expected and tree.all_chunks_stored:
                yield Finding(
                    array.part,
                    words.ERROR,
                    f"{expected - found} of its {expected} chunks are missing from the array store",
                )
            elif found > expected:
                yield Finding(
                    array.part,
                    words.WARNING,
                    f"the array store holds {found} chunks for it; its shape needs {expected}",
                )
        state.readable = True
