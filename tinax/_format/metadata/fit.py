"""Whether restore targets fit a checkpoint, leaf by leaf, from metadata alone.

The one judgement behind ``tinax.explore.compare_table``, the restore widget, and
the check ``load_checkpointables`` and ``load_training_checkpoint`` make before
Orbax reads a byte. Leaves are described at the level Orbax stores them (a PRNG
key as its key data), so a stored leaf and a target leaf compare like for like.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import ml_dtypes

from tinax._format.metadata import jsonitems, layout, pytree
from tinax._format.naming import names, words
from tinax._format.naming.keys import ROOT, KeyPath, format_key
from tinax._format.storage import files

# A target leaf that asks for nothing to be restored (Orbax's placeholder ``...``).
PLACEHOLDER = "placeholder"
# At most this many mismatched leaves are spelled out in a refusal.
MAX_LINES = 10


@dataclasses.dataclass(frozen=True)
class Spec:
    """What one leaf is, as Orbax stores it.

    Attributes:
      kind: A ``words`` kind (``jax.Array``, ``scalar``, ``empty``, …), Orbax's own
        type name for other stored values, or ``placeholder`` for a target leaf
        that is not to be restored.
      shape: The stored shape, for arrays and scalars.
      dtype: The stored dtype's name, for arrays and scalars.
      key: For an array: the PRNG implementation of a typed key (stored as its key
        data, so ``shape`` and ``dtype`` are the key data's), ``""`` for any other
        array, ``None`` where unknown.
    """

    kind: str
    shape: tuple[int, ...] | None = None
    dtype: str | None = None
    key: str | None = None

    def describe(self) -> str:
        """``(16, 256) float32`` for an array; the kind for anything else."""
        if self.shape is None or self.dtype is None:
            return self.kind
        dims = ", ".join(str(d) for d in self.shape) + ("," if len(self.shape) == 1 else "")
        typed = f" (a typed PRNG key, {self.key})" if self.key else ""
        return f"({dims}) {self.dtype}{typed}"


@dataclasses.dataclass(frozen=True)
class LeafVerdict:
    """One leaf of a checkpoint against its restore target.

    Attributes:
      checkpointable: The checkpointable's name.
      path: The leaf's key path.
      status: A ``words`` compare status.
      stored: The stored leaf, or ``None`` if the checkpoint lacks it.
      target: The target leaf, or ``None`` if the target lacks it.
      lossy: For a ``dtype cast``, whether some stored values would not survive it.
    """

    checkpointable: str
    path: KeyPath
    status: str
    stored: Spec | None
    target: Spec | None
    lossy: bool | None = None

    @property
    def key(self) -> str:
        """The leaf's key, as tables write it."""
        return format_key(self.path)

    def line(self) -> str:
        """The leaf in one line: ``model['w']: stored (16, 256) float32, target (16, 512) float32``."""
        where = f"{self.checkpointable}{self.key}"
        if self.stored is None:
            assert self.target is not None
            return f"{where}: not stored, target {self.target.describe()}"
        if self.target is None:
            return f"{where}: stored {self.stored.describe()}, not in the target"
        text = f"{where}: stored {self.stored.describe()}, target {self.target.describe()}"
        crossing = self.stored.kind != self.target.kind
        if self.status == words.DTYPE_CAST and self.lossy:
            into = f" of a {self.stored.kind} into a {_kind_name(self.target.kind)}"
            text += f" (a lossy cast{into if crossing else ''})"
        elif self.status == words.KIND_DIFFERS:
            text += f" ({self.stored.kind} and {self.target.kind})"
            if self.stored.kind == words.SCALAR and self.target.kind == words.JAX_ARRAY:
                text += (
                    "; a Python number is stored: restore it into a Python number or a "
                    "0-d NumPy array, and make it a JAX array after"
                )
        elif _typed_and_raw(self.stored, self.target):
            text += (
                " (a typed key against raw key data: build the target from "
                + (
                    "jax.random.key(…), or load key data and wrap it with jax.random.wrap_key_data"
                    if self.stored.key
                    else "jax.random.key_data(key)"
                )
                + ")"
            )
        return text


# -- dtypes -----------------------------------------------------------------------------


def _dtype(name: str) -> np.dtype | None:
    try:
        return np.dtype(name)
    except TypeError:
        import ml_dtypes  # imported when a cast is judged, not with the module

        found = getattr(ml_dtypes, name, None)
        return None if found is None else np.dtype(found)


def _float_info(dtype: np.dtype) -> ml_dtypes.finfo | None:
    import ml_dtypes

    try:
        return ml_dtypes.finfo(dtype)
    except (ValueError, TypeError):
        return None


def _int_info(dtype: np.dtype) -> ml_dtypes.iinfo | None:
    import ml_dtypes

    try:
        return ml_dtypes.iinfo(dtype)
    except (ValueError, TypeError):
        return None


def _is_complex(dtype: np.dtype) -> bool:
    return dtype.kind == "c"


def cast_is_lossless(stored: str, target: str) -> bool | None:
    """Whether every value of dtype ``stored`` survives a cast to ``target`` exactly.

    ``None`` when the two are not both numbers (no cast is possible).
    """
    src, dst = _dtype(stored), _dtype(target)
    if src is None or dst is None:
        return None
    if src == dst:
        return True
    numeric = [
        d.kind == "b" or _is_complex(d) or _float_info(d) or _int_info(d) for d in (src, dst)
    ]
    if not all(numeric):
        return None
    if src.kind == "b":
        return True
    if dst.kind == "b" or (_is_complex(src) and not _is_complex(dst)):
        return False
    if _is_complex(src) and _is_complex(dst):
        return bool(np.can_cast(src, dst, "safe"))
    if _is_complex(dst):
        real = np.dtype(np.float32 if dst.itemsize <= 8 else np.float64)
        return cast_is_lossless(src.name, real.name)
    src_int, dst_int = _int_info(src), _int_info(dst)
    src_float, dst_float = _float_info(src), _float_info(dst)
    if src_int is not None and dst_int is not None:
        return bool(dst_int.min <= src_int.min and src_int.max <= dst_int.max)
    if src_int is not None and dst_float is not None:
        # Every integer up to 2**(nmant + 1) is exact in a float with nmant mantissa bits.
        magnitude = max(abs(int(src_int.min)), int(src_int.max))
        return magnitude <= 2 ** (dst_float.nmant + 1) and magnitude <= float(dst_float.max)
    if src_float is not None and dst_float is not None:
        return bool(
            dst_float.nmant >= src_float.nmant
            and dst_float.maxexp >= src_float.maxexp
            and dst_float.minexp <= src_float.minexp
        )
    return False  # a float into an integer


# -- judging ------------------------------------------------------------------------------


def _kind_name(kind: str) -> str:
    return "Python number" if kind == words.SCALAR else kind


def _family(kind: str) -> str:
    # Orbax restores a stored array as whichever array the target asks for.
    return "array" if kind in words.ARRAY_KINDS else kind


def _typed_and_raw(stored: Spec, target: Spec) -> bool:
    """Whether one of the two is a typed PRNG key and the other raw key data."""
    if stored.key is None or target.key is None:
        return False
    return bool(stored.key) != bool(target.key)


def _number_and_array(stored: Spec, target: Spec) -> bool:
    """Whether one side is a Python number and the other a 0-d array that Orbax
    converts into it: a stored 0-d array (``jnp.float32(…)``, ``np.float32(…)``,
    ``bfloat16``) restored into a Python number, or a stored Python number into a 0-d
    NumPy target. (Orbax cannot restore a stored Python number as a JAX array.)"""
    if stored.shape != () or target.shape != () or stored.key or target.key:
        return False
    if stored.kind in words.ARRAY_KINDS and target.kind == words.SCALAR:
        return True
    return stored.kind == words.SCALAR and target.kind == words.NUMPY_ARRAY


def judge_leaf(stored: Spec, target: Spec) -> tuple[str, bool | None]:
    """The status of one stored leaf against its target, and for a cast whether it is lossy.

    A 0-d array and a Python number fit each other as their dtypes do
    (``_number_and_array``): a ``float32`` metric restores into ``0.0`` (a float64:
    ``dtype cast``, not lossy), into ``0`` only as a lossy cast.
    """
    if target.kind == PLACEHOLDER:
        return words.LEFT_OUT, None
    if _family(stored.kind) != _family(target.kind) and not _number_and_array(stored, target):
        return words.KIND_DIFFERS, None
    if stored.shape is not None and target.shape is not None and stored.shape != target.shape:
        return words.SHAPE_DIFFERS, None
    if _typed_and_raw(stored, target):
        return words.DTYPE_DIFFERS, None
    if stored.dtype is not None and target.dtype is not None and stored.dtype != target.dtype:
        lossless = cast_is_lossless(stored.dtype, target.dtype)
        if lossless is None:
            return words.DTYPE_DIFFERS, None
        return words.DTYPE_CAST, not lossless
    return words.OK, None


Leaves = Sequence[tuple[KeyPath, Spec]]


def judge(stored: Mapping[str, Leaves], targets: Mapping[str, Leaves]) -> list[LeafVerdict]:
    """Every leaf of ``stored`` and ``targets``, joined on checkpointable and key path.

    Rows follow the checkpoint's order, with target leaves the checkpoint lacks
    after their checkpointable's stored leaves, and checkpointables only in the
    targets last.
    """
    out = []
    for name in dict.fromkeys([*stored, *targets]):
        wanted = dict(targets.get(name, ()))
        for path, spec in stored.get(name, ()):
            target = wanted.pop(path, None)
            if target is None:
                out.append(LeafVerdict(name, path, words.NOT_IN_TARGET, spec, None))
            else:
                status, lossy = judge_leaf(spec, target)
                out.append(LeafVerdict(name, path, status, spec, target, lossy))
        for path, target in wanted.items():
            out.append(LeafVerdict(name, path, words.MISSING_FROM_CHECKPOINT, None, target))
    return out


def refusals(verdicts: Iterable[LeafVerdict], *, allow_lossy: bool) -> list[LeafVerdict]:
    """The leaves that make a restore impossible, or lose values the caller did not allow."""
    return [
        v
        for v in verdicts
        if v.status in words.REFUSED_STATUSES
        or (v.status == words.DTYPE_CAST and v.lossy and not allow_lossy)
    ]


# How a checkpointable's summary line counts each refused status.
_SUMMARY = (
    (words.NOT_IN_TARGET, "stored only"),
    (words.MISSING_FROM_CHECKPOINT, "target only"),
    (words.SHAPE_DIFFERS, "shape differs"),
    (words.DTYPE_DIFFERS, "dtype differs"),
    (words.DTYPE_CAST, "lossy cast"),
    (words.KIND_DIFFERS, "kind differs"),
)


def _summary(name: str, refused: Sequence[LeafVerdict]) -> str:
    counts = {status: 0 for status, _ in _SUMMARY}
    for v in refused:
        counts[v.status] = counts.get(v.status, 0) + 1
    parts = [f"{counts[status]} {label}" for status, label in _SUMMARY if counts[status]]
    text = f"{name}: " + ", ".join(parts)
    if counts[words.NOT_IN_TARGET] and counts[words.MISSING_FROM_CHECKPOINT]:
        text += (
            " (the target's structure is not the stored one: a target from another model "
            "or optimizer, or another version of it?)"
        )
    return text


def _shown(refused: Sequence[LeafVerdict]) -> list[LeafVerdict]:
    """At most ``MAX_LINES`` refused leaves, taken in turn from each checkpointable and
    status, so that a long run of one kind (leaves stored only) hides none of the others."""
    groups: dict[tuple[str, str], list[LeafVerdict]] = {}
    for v in refused:
        groups.setdefault((v.checkpointable, v.status), []).append(v)
    chosen: set[int] = set()
    queues = [iter(group) for group in groups.values()]
    while len(chosen) < min(MAX_LINES, len(refused)):
        for queue in queues:
            taken = next(queue, None)
            if taken is not None and len(chosen) < MAX_LINES:
                chosen.add(id(taken))
    return [v for v in refused if id(v) in chosen]


def refusal_message(path: str, refused: Sequence[LeafVerdict]) -> str:
    """The checkpoint; one summary line per checkpointable (counts by status); then one
    line per refused leaf (at most ``MAX_LINES``, from every checkpointable and status);
    and, for a lossy cast, how to allow it."""
    by_name: dict[str, list[LeafVerdict]] = {}
    for v in refused:
        by_name.setdefault(v.checkpointable, []).append(v)
    lines = [_summary(name, group) for name, group in by_name.items()]
    lines += [v.line() for v in _shown(refused)]
    if len(refused) > MAX_LINES:
        lines.append(f"… and {len(refused) - MAX_LINES} more")
    if any(v.status == words.DTYPE_CAST for v in refused):
        lines.append(
            "a lossy cast loses stored values; to load anyway, run the load inside "
            "`with tinax.checkpointing.allow_lossy_casts():`, or give those leaves "
            "targets of the stored dtype"
        )
    count = f"{len(refused)} lea{'f' if len(refused) == 1 else 'ves'}"
    return f"checkpoint {path!r} does not fit the restore targets ({count}):\n  " + "\n  ".join(
        lines
    )


# -- what is stored -------------------------------------------------------------------------


# Orbax stores a typed PRNG key as its key data, of one of these dtypes.
_KEY_DATA_DTYPES = frozenset({"uint32", "uint8", "uint16", "uint64"})


def key_impls(item: layout.StoredCheckpointable) -> dict[str, str] | None:
    """Orbax V1's record of which arrays of a pytree checkpointable are typed PRNG keys:
    param name to the key's implementation (``""`` for an array that is not a key);
    ``None`` if not recorded."""
    folder = item.directory / names.ARRAY_METADATAS
    if names.ARRAY_METADATAS not in item.entries():
        return None
    out: dict[str, str] = {}
    for name in sorted(item.checkpoint.entries(folder)):
        record = item.checkpoint.read_json_object(
            folder / name,
            what="Orbax's record of the arrays a process wrote",
            max_bytes=files.MAX_METADATA_BYTES,
            max_depth=None,
        )
        entries = record.get("array_metadatas")
        for entry in entries if isinstance(entries, list) else ():
            meta = entry.get("array_metadata") if isinstance(entry, dict) else None
            if not isinstance(meta, dict) or not isinstance(meta.get("param_name"), str):
                continue
            ext = meta.get("ext_metadata")
            impl = ext.get("random_key_impl") if isinstance(ext, dict) else None
            out[meta["param_name"]] = impl if isinstance(impl, str) and impl else ""
    return out


def _pytree_specs(item: layout.StoredCheckpointable) -> list[tuple[KeyPath, Spec]]:
    tree = pytree.read_layout(item)
    infos = pytree.leaf_infos(tree, tree.context())
    # Only arrays of key data's dtypes can be keys: most checkpoints need no more reading.
    impls = (
        key_impls(item)
        if any(info is not None and info.dtype in _KEY_DATA_DTYPES for _, info in infos)
        else None
    )
    out = []
    for leaf, info in infos:
        if info is None:
            out.append((leaf.path, Spec(leaf.kind)))
            continue
        key = None
        if impls is not None and leaf.kind in words.ARRAY_KINDS:
            key = impls.get(leaf.param) if info.dtype in _KEY_DATA_DTYPES else ""
        out.append((leaf.path, Spec(leaf.kind, shape=info.shape, dtype=info.dtype, key=key)))
    return out


def stored_specs(
    checkpoint: layout.Checkpoint, names: Iterable[str] | None = None
) -> dict[str, list[tuple[KeyPath, Spec]]]:
    """Every stored leaf of the checkpointables ``names`` (all by default), from metadata.

    Raises:
      ValueError: If a checkpointable is missing or its metadata is unreadable.
    """
    wanted = [item.name for item in checkpoint.checkpointables] if names is None else names
    out: dict[str, list[tuple[KeyPath, Spec]]] = {}
    for name in wanted:
        item = checkpoint.get(name)
        if item.layout == layout.PYTREE:
            out[name] = _pytree_specs(item)
        elif item.layout == layout.ITERATOR:
            jsonitems.iterator_files(item)
            out[name] = [(ROOT, Spec(words.ITERATOR))]
        elif item.layout == layout.JSON:
            out[name] = [(ROOT, Spec(words.JSON))]
        elif item.layout == layout.EMPTY:
            jsonitems.read_empty_record(item)
            out[name] = [(ROOT, Spec(words.EMPTY))]
        else:
            out[name] = [(ROOT, Spec(words.UNKNOWN))]
    return out
