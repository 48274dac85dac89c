"""``megacache tokenize``: text to Megatron ``.bin/.idx``, every rank tokenizing its share.

1. Rank 0 expands the inputs and cuts them into work units by the data (line-aligned byte ranges,
   parquet row groups, whole compressed files), then broadcasts the plan. Units are numbered in
   input order; each rank owns a contiguous run of units of about equal bytes.
2. Each rank tokenizes its units into per-unit part files in the work directory
   (``.<prefix>.megacache-work/``), each published by rename and followed by a ``.done`` record of
   its counts. A rerun with the same arguments finds those records and skips finished units.
3. Assembly (``assemble.py``): prefix sums of every unit's counts give every unit its offsets in
   the final files, which are preallocated and filled in place by the units' owners, then renamed
   into place. Document order is input order whatever the rank count, so the bytes are too.
4. Rank 0 records what each dataset was made from (``publish.write_record``): the inputs' paths,
   sizes and modification times (an object's URL, size, ETag and modification time, from the
   listing), and the settings that change its bytes.

A dataset already at the output is never replaced silently: one whose record says it was made from
these inputs and settings is kept as it is (nothing is written), any other (other inputs or
settings, or no record: another tool's) is refused unless ``--overwrite`` is given. Rank 0 decides,
for every rank; a work directory of this very run (an interrupted one) is resumed whatever is there,
its run having been allowed to write the outputs.

An output prefix in a bucket (``s3://``, ``msc://``; docs/object-storage.md) takes the same steps
with objects: the units are uploaded to a work prefix beside the output, the ``.bin`` is assembled
as one multipart upload by the ranks (``assemble.assemble_object``), the ``.idx`` and the record
follow it. A bucket has no lock: nothing keeps two jobs from writing one prefix at once.

``--output-format pbin`` writes Modalities' ``.pbin`` instead (docs/modalities.md): the same units
and assembly, tokens in its token size, and every document ending with EOD as its packer ends them.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field

import numpy as np

from ..text.backends import DEFAULT_VERIFY_FRACTION, Disagreement, SampleCheck, select_backend
from ..runtime import object_storage
from ..runtime.comm import Comm, get_comm
from ..errors import MegacacheError
from ..runtime.log import LOG
from ..runtime.environment import usable_cores
from ..formats.indexed import optimal_dtype
from ..formats.pbin import SUFFIX as PBIN_SUFFIX, TOKEN_DTYPES, token_size
from ..runtime.fsio import (gone, make_directories, publish, read_json, remove_quietly, remove_tree, tmp_path,
                            WORK_MARK, write_json_atomic, writing)
from ..text.inputs import BadRecords, Source, WorkUnit, expand_inputs, plan_units, read_unit
from ..runtime.coordination import Guard
from ..runtime.progress import BYTES, Progress
from ..text.tokenization import Tokenizer, load_tokenizer, require_tokenizer
from .assemble import (Part, PartCounts, assemble, assemble_object, assemble_pbin, dataset_files, discard,
                       guarded_output, tidy_output)
from .publish import read_record, size_and_time, write_record
from .scheduling import contiguous_shares

FORMAT_VERSION = 3
#: megatron: ``.bin/.idx`` as Megatron's preprocess_data.py; pbin: Modalities' packed file
OUTPUT_FORMATS = ("megatron", "pbin")
DEFAULT_UNIT_BYTES = 64 << 20
#: input bytes per encode call: large enough that a call's fixed costs (gigatoken's result arrays,
#: the thread pool's start) vanish, small enough to keep memory per rank in megabytes
BATCH_BYTES = 4 << 20
MAX_BAD_LOCATIONS = 10
#: where a unit's time goes: reading and decoding input, encoding, the guard's re-encoding, writing
STAGES = ("read", "encode", "guard", "write")


@dataclass
class TokenizeConfig:
    inputs: list[str]
    output_prefix: str
    json_keys: list[str] = field(default_factory=lambda: ["text"])
    append_eod: bool = False
    tokenizer: str | None = None
    tokenizer_type: str | None = None
    tokenizer_model: str | None = None
    vocab_file: str | None = None
    merge_file: str | None = None
    vocab_size: int | None = None
    special_tokens: list[str] | None = None
    tiktoken_pattern: str | None = None
    tiktoken_num_special_tokens: int = 1000
    eod_id: int | None = None
    skip_bad: bool = False
    unit_bytes: int = DEFAULT_UNIT_BYTES
    #: tokenizer threads per rank; default: the node's cores divided among its ranks
    threads: int | None = None
    progress_interval_s: float | None = None
    #: auto | gigatoken | hf (backends.py); the bytes written are the same with each
    backend: str = "auto"
    #: fraction of documents a fast backend's guard encodes again with the reference
    verify_fraction: float = DEFAULT_VERIFY_FRACTION
    #: stop, rather than redo the unit with the reference, when the fast backend disagrees
    strict_backend: bool = False
    output_format: str = "megatron"
    #: replace datasets at the output that were not made from these inputs and settings
    overwrite: bool = False

    @property
    def pbin(self) -> bool:
        return self.output_format == "pbin"

    def output_path(self, key: str) -> str:
        """Megatron's naming: ``{prefix}_{key}_document`` (preprocess_data.py, no sentence split),
        with ``.pbin`` after it for Modalities' format."""
        return f"{self.output_prefix}_{key}_document" + (PBIN_SUFFIX if self.pbin else "")

    @property
    def in_bucket(self) -> bool:
        """Whether the output is objects (``s3://``, ``msc://``), its work units too."""
        return object_storage.is_object_storage(self.output_prefix)

    @property
    def work_dir(self) -> str:
        """Hidden, so that an input directory holding the output never lists its files as input; for
        a bucket output, a prefix beside it in the bucket."""
        head, tail = os.path.split(self.output_prefix)
        return os.path.join(head, f".{tail}{WORK_MARK}")


@dataclass(repr=False)
class TokenizeResult:
    outputs: dict[str, str]          # key -> dataset prefix
    documents: int                   # per key (identical for every key)
    tokens: dict[str, int]
    units: int
    units_reused: int
    bad_count: int
    bad_first: list[str]
    seconds: float
    ranks: int
    dtype: str
    output_format: str
    empty: dict[str, int]            # per key: documents with no tokens (.pbin: written as one EOD)
    backend: str                     # which backend encoded, and why
    checked_documents: int           # documents the guard encoded again with the reference
    disagreements: list[str]         # units the fast backend got wrong (redone with the reference)
    stage_seconds: dict[str, float]  # STAGES summed over the units tokenized now
    already_there: bool = False      # the outputs were there, made from these inputs and settings

    def __repr__(self) -> str:
        work = ("already there" if self.already_there else
                f"{self.units} units ({self.units_reused} reused), {self.bad_count} bad records skipped")
        return (f"TokenizeResult({', '.join(self.outputs.values())}: {self.documents:,} documents, "
                f"{sum(self.tokens.values()):,} tokens, {work}, in {self.seconds:.1f} s on {self.ranks} rank(s))")


def _load_tokenizer(cfg: TokenizeConfig, threads: int) -> Tokenizer:
    return load_tokenizer(cfg.tokenizer, tokenizer_type=cfg.tokenizer_type,
                          tokenizer_model=cfg.tokenizer_model, vocab_file=cfg.vocab_file,
                          merge_file=cfg.merge_file, eod_id=cfg.eod_id, threads=threads,
                          vocab_size=cfg.vocab_size, special_tokens=cfg.special_tokens,
                          tiktoken_pattern=cfg.tiktoken_pattern,
                          tiktoken_num_special_tokens=cfg.tiktoken_num_special_tokens)


def _default_threads(comm: Comm) -> int:
    return max(1, usable_cores() // max(1, comm.local_size))


#: the settings a dataset's bytes depend on (beside its inputs), as the user names them
SETTINGS = {"json_keys": "--json-keys", "append_eod": "--append-eod", "tokenizer": "tokenizer",
            "vocab_size": "vocabulary size", "eod": "EOD id", "special_tokens": "--tokenizer-special-tokens",
            "dtype": "token dtype", "skip_bad": "--skip-bad", "output_format": "--output-format"}
#: input changes and datasets named in a refusal
SHOWN = 5


def _made_from(cfg: TokenizeConfig, sources: list[Source], tok: Tokenizer, dtype: np.dtype) -> dict:
    """What the outputs' bytes depend on: the inputs (by path, size and mtime; an object's ETag and
    modification time in place of the mtime) as listed, and ``SETTINGS``."""
    inputs = [[s.path, s.size, s.stamp] for s in sources]
    settings = {"json_keys": cfg.json_keys, "append_eod": cfg.append_eod, "tokenizer": tok.name,
                "vocab_size": tok.vocab_size, "eod": tok.eod, "special_tokens": cfg.special_tokens,
                "dtype": dtype.name, "skip_bad": cfg.skip_bad, "output_format": cfg.output_format}
    return {"inputs": inputs, **settings}


def _fingerprint(cfg: TokenizeConfig, made: dict) -> str:
    """What must not change for finished units to be reused: what the outputs are made from, and the
    unit size."""
    desc = {"version": FORMAT_VERSION, "unit_bytes": cfg.unit_bytes, **made}
    return hashlib.sha256(json.dumps(desc, sort_keys=True).encode()).hexdigest()


def _changes(then: dict, now: dict) -> list[str]:
    """How what a dataset was made from (``then``, its record's) differs from ``now``."""
    before = {p: (size, mtime) for p, size, mtime in then.get("inputs", [])}
    inputs = []
    for p, size, mtime in now["inputs"]:
        if p not in before:
            inputs.append(f"input {p} is new")
        elif before[p][0] != size:
            inputs.append(f"input {p}: {before[p][0]:,} bytes then, {size:,} now")
        elif before[p][1] != mtime:
            inputs.append(f"input {p}: modified since")
    current = {p for p, _, _ in now["inputs"]}
    inputs += [f"input {p} is not among the inputs now" for p in before if p not in current]
    if len(inputs) > SHOWN:
        inputs[SHOWN:] = [f"{len(inputs) - SHOWN} more input(s) changed"]

    def said(value) -> str:
        return ("given" if value else "not given") if isinstance(value, bool) else repr(value)

    return inputs + [f"{name}: {said(then.get(key))} then, {said(now[key])} now"
                     for key, name in SETTINGS.items() if then.get(key) != now[key]]


def _stat(path: str) -> list[int] | None:
    try:
        return size_and_time(path)
    except FileNotFoundError:
        return None


@dataclass
class _Existing:
    """The outputs there already (rank 0 looks, under the lock or before it)."""

    records: dict[str, dict]  # key -> record, of the outputs there as made from these inputs and settings
    problems: list[str]       # the others there: their first file and how they differ


def _existing(cfg: TokenizeConfig, made: dict) -> _Existing:
    records, problems = {}, []
    for key in cfg.json_keys:
        out = cfg.output_path(key)
        files = {os.path.basename(f): _stat(f) for f in dataset_files(out)}
        there = sorted(os.path.join(os.path.dirname(out), n) for n, st in files.items() if st is not None)
        if not there:
            continue
        record = read_record(out)
        if record is None:
            problems.append(f"{there[0]}: no record of megacache tokenize writing it (another tool's output?)")
            continue
        why = _changes(record.get("made_from", {}), made)
        why += [f"{name} {'missing' if st is None else 'changed'} since megacache tokenize wrote it"
                for name, st in files.items() if st != record.get("files", {}).get(name)]
        if why:
            problems.append(f"{there[0]}: " + "; ".join(why))
        else:
            records[key] = record
    return _Existing(records, problems)


def _refusal(problems: list[str]) -> MegacacheError:
    shown = "\n".join(f"  {p}" for p in problems[:SHOWN])
    more = f"\n  ... and {len(problems) - SHOWN} more" if len(problems) > SHOWN else ""
    return MegacacheError(f"the output is there already, not made from these inputs and settings:\n{shown}{more}\n"
                          f"Nothing was written. Pass --overwrite to replace it, or give another --output-prefix")


def _unit_name(work_dir: str, index: int, suffix: str) -> str:
    return os.path.join(work_dir, f"unit_{index:07d}.{suffix}")


def _finished_units(work_dir: str, fingerprint: str) -> list[int] | None:
    """The indices of the units an identical earlier run finished, from its work directory; None
    when there is none (none, another run's, torn, or removed by another node since). The directory
    is read, not tested first: one that another node removed can still look present to this node's
    client for a moment."""
    try:
        if object_storage.is_object_storage(work_dir):
            if json.loads(object_storage.read(os.path.join(work_dir, "fingerprint.json"))).get("fingerprint") \
                    == fingerprint:
                return sorted(int(o.url[-12:-5]) for o in object_storage.listing(work_dir) if o.url.endswith(".done"))
        elif read_json(os.path.join(work_dir, "fingerprint.json")).get("fingerprint") == fingerprint:
            return sorted(int(n[5:12]) for n in os.listdir(work_dir) if n.endswith(".done"))
    except (OSError, ValueError, AttributeError, object_storage.ObjectMissing):
        pass
    return None


def _remove_work_dir(work_dir: str, tag: str) -> None:
    if object_storage.is_object_storage(work_dir):
        object_storage.delete([o.url for o in object_storage.listing(work_dir)])
        return
    try:
        remove_tree(work_dir, tag)
    except OSError as exc:
        if not gone(exc):
            raise


def _start_work_dir(work_dir: str, fingerprint: str) -> None:
    """The work directory made afresh for this run (another run's removed)."""
    _remove_work_dir(work_dir, "stale")
    if object_storage.is_object_storage(work_dir):
        object_storage.upload_bytes(json.dumps({"fingerprint": fingerprint}).encode(),
                                    os.path.join(work_dir, "fingerprint.json"))
        return
    make_directories(work_dir)
    write_json_atomic(os.path.join(work_dir, "fingerprint.json"), {"fingerprint": fingerprint})


def _with_eod(ids: np.ndarray, lengths: np.ndarray, eod: int, pbin: bool) -> tuple[np.ndarray, np.ndarray]:
    """EOD after documents: Megatron's rule, after every non-empty document; or (``pbin``) Modalities'
    packer's, after every document whose last token is not EOD already, so a document with no
    tokens becomes one EOD (its packer would drop it and the rest of its file)."""
    ends = np.cumsum(lengths)
    nonempty = lengths > 0
    if pbin:
        last = np.full(len(lengths), -1, dtype=np.int64)
        last[nonempty] = ids[ends[nonempty] - 1]
        needs = last != eod
    else:
        needs = nonempty
    return np.insert(ids, ends[needs], eod), lengths + needs


def _check_range(ids: np.ndarray, dtype: np.dtype, unit: WorkUnit, tok: Tokenizer) -> None:
    if ids.size == 0:
        return
    info = np.iinfo(dtype)
    lo, hi = int(ids.min()), int(ids.max())
    if lo < info.min or hi > info.max:
        bad = hi if hi > info.max else lo
        raise MegacacheError(
            f"{unit.path}: token id {bad} does not fit the output dtype {dtype.name} chosen from the "
            f"vocabulary size {tok.vocab_size} of {tok.name}; Megatron would silently wrap it. "
            f"Fix the tokenizer's vocabulary size."
        )


def _tokenize_unit(cfg: TokenizeConfig, unit: WorkUnit, tok: Tokenizer, dtype: np.dtype,
                   progress: Progress, tag: str, place: str) -> dict:
    """Tokenize one unit into its temporary part files in the directory ``place``; the unit's record
    for ``_publish_unit``.
    Where the guard finds the fast backend disagreeing with its reference, the unit is redone with
    the reference."""
    record = {"backend": tok.backend, "disagreement": None}
    try:
        record.update(_write_unit(cfg, unit, tok, dtype, progress, tag, place))
    except Disagreement as d:
        where = f"document {d.document + 1} of {unit.describe()}"
        if cfg.strict_backend:
            raise MegacacheError(
                f"--strict-backend: {tok.backend} disagrees with {tok.reference.backend} on {where}; "
                "nothing was written. Rerun with --tokenizer-backend hf (and please report the document)"
            ) from None
        LOG.warning(f"megacache tokenize: warning: {tok.backend} disagrees with {tok.reference.backend} on "
                    f"{where}; that unit is tokenized again with {tok.reference.backend}")
        record = {"backend": tok.reference.backend, "disagreement": where}
        record.update(_write_unit(cfg, unit, tok.reference, dtype, progress, tag, place))
    return record


def _publish_unit(cfg: TokenizeConfig, unit: WorkUnit, tag: str, place: str, record: dict) -> None:
    """Publish a tokenized unit's part files (from ``place``), then its ``.done`` record: renamed in
    the work directory, or uploaded to the work prefix of a bucket output. Mostly fsync or upload
    waits: it runs on a thread, beside the encoding of the next unit."""
    for key in cfg.json_keys:
        for kind in ("bin", "doclen"):
            final = _unit_name(cfg.work_dir, unit.index, f"{key}.{kind}")
            written = tmp_path(_unit_name(place, unit.index, f"{key}.{kind}"), tag)
            if cfg.in_bucket:
                try:
                    object_storage.upload_file(written, final)
                finally:
                    remove_quietly(written)
            else:
                publish(written, final)
    done = {"unit": asdict(unit), **record}
    if cfg.in_bucket:
        object_storage.upload_bytes(json.dumps(done).encode(), _unit_name(cfg.work_dir, unit.index, "done"))
    else:
        write_json_atomic(_unit_name(cfg.work_dir, unit.index, "done"), done)


def _read_done(cfg: TokenizeConfig, index: int) -> dict:
    path = _unit_name(cfg.work_dir, index, "done")
    return json.loads(object_storage.read(path)) if cfg.in_bucket else read_json(path)


def _write_unit(cfg: TokenizeConfig, unit: WorkUnit, tok: Tokenizer, dtype: np.dtype,
                progress: Progress, tag: str, place: str) -> dict:
    """Encode one unit into its temporary part files in ``place``: its counts, bad records and guard
    tally.
    Raises Disagreement (the part files removed, its progress taken back) when the guard catches
    ``tok`` disagreeing with its reference."""
    bad = BadRecords()
    parts = {k: (tmp_path(_unit_name(place, unit.index, f"{k}.bin"), tag),
                 tmp_path(_unit_name(place, unit.index, f"{k}.doclen"), tag)) for k in cfg.json_keys}
    counts = {k: [0, 0, 0] for k in cfg.json_keys}
    empty = dict.fromkeys(cfg.json_keys, 0)
    reported = {"done": 0, "docs": 0, "tokens": 0}
    documents = 0
    guards = {k: SampleCheck(tok, cfg.verify_fraction, unit.index) for k in cfg.json_keys} if tok.reference else None
    seconds = dict.fromkeys(STAGES, 0.0)
    clock = time.perf_counter
    opened = []

    def create(path: str):
        with writing(path):
            opened.append(open(path, "wb"))
        return opened[-1]

    try:
        files = {k: (create(b), create(d)) for k, (b, d) in parts.items()}
        t = clock()
        for batch in read_unit(unit, cfg.json_keys, cfg.skip_bad, bad, batch_bytes=BATCH_BYTES):
            seconds["read"] += clock() - t
            batch_tokens = 0
            batch_docs = len(batch.texts[cfg.json_keys[0]])
            for key in cfg.json_keys:
                texts = batch.texts[key]
                t = clock()
                ids, lengths = tok.encode_batch(texts)
                seconds["encode"] += clock() - t
                if guards:
                    t = clock()
                    guards[key].add(documents, texts, ids, lengths)
                    seconds["guard"] += clock() - t
                t = clock()
                if cfg.pbin:
                    empty[key] += int(np.count_nonzero(lengths == 0))
                if cfg.pbin or cfg.append_eod:
                    ids, lengths = _with_eod(ids, lengths, tok.eod, cfg.pbin)
                _check_range(ids, dtype, unit, tok)
                fb, fd = files[key]
                with writing(fb.name):
                    fb.write(memoryview(ids.astype(dtype, copy=False)))
                with writing(fd.name):
                    fd.write(memoryview(lengths.astype(np.int32, copy=False)))
                c = counts[key]
                c[0] += len(lengths)
                c[1] += int(np.count_nonzero(lengths))
                c[2] += int(ids.size)
                batch_tokens += int(ids.size)
                seconds["write"] += clock() - t
            step = {"done": batch.bytes_done - reported["done"], "docs": batch_docs, "tokens": batch_tokens}
            progress.add("tokenizing", **step)
            for k, v in step.items():
                reported[k] += v
            documents += batch_docs
            t = clock()
        if guards:
            t = clock()
            for g in guards.values():
                g.finish()
            seconds["guard"] += clock() - t
    except BaseException:
        for f in opened:
            f.close()
        opened.clear()
        for b, d in parts.values():  # a rerun starts the unit afresh
            remove_quietly(b)
            remove_quietly(d)
        progress.add("tokenizing", **{k: -v for k, v in reported.items()})
        raise
    finally:
        for f in opened:
            f.close()
    checked = sum(g.checked for g in guards.values()) if guards else 0
    return {"counts": counts, "empty": empty, "bad_count": bad.count, "bad_first": bad.first,
            "checked": checked, "seconds": seconds}


def _load_part(cfg: TokenizeConfig, key: str, index: int) -> Part:
    """A finished unit's index, its tokens left where they are (a file, or an object)."""
    doclen_path = _unit_name(cfg.work_dir, index, f"{key}.doclen")
    doclen = (np.frombuffer(object_storage.read(doclen_path), dtype=np.int32) if cfg.in_bucket
              else np.fromfile(doclen_path, dtype=np.int32))
    nonempty = doclen > 0
    return Part(sequence_lengths=doclen[nonempty], document_ends=np.cumsum(nonempty, dtype=np.int64),
                token_file=_unit_name(cfg.work_dir, index, f"{key}.bin"))


def tokenize(cfg: TokenizeConfig, comm: Comm | None = None) -> TokenizeResult:
    comm = comm or get_comm()
    t0 = time.monotonic()
    if not cfg.json_keys:
        raise MegacacheError("--json-keys: give at least one key")
    if cfg.unit_bytes < 1:
        raise MegacacheError(f"--unit-bytes must be positive, got {cfg.unit_bytes}")
    if not 0 <= cfg.verify_fraction <= 1:
        raise MegacacheError(f"--verify-fraction must be between 0 and 1, got {cfg.verify_fraction}")
    if cfg.output_format not in OUTPUT_FORMATS:
        raise MegacacheError(f"--output-format {cfg.output_format!r}: expected one of {', '.join(OUTPUT_FORMATS)}")
    require_tokenizer(cfg.tokenizer, cfg.tokenizer_type, cfg.tokenizer_model, cfg.vocab_file, cfg.merge_file)
    if cfg.in_bucket:
        where = object_storage.ObjectPath.parse(cfg.output_prefix)
        if not where.key or where.key.endswith("/"):
            raise MegacacheError(f"--output-prefix {cfg.output_prefix}: name the datasets' prefix after the "
                                 f"{'bucket' if where.scheme == object_storage.S3 else 'profile'} and folder "
                                 f"(s3://BUCKET/DIR/NAME writes s3://BUCKET/DIR/NAME_text_document.bin/.idx)")
        if cfg.pbin:
            raise MegacacheError("--output-format pbin: a .pbin is written to a local --output-prefix only; "
                                 "write it locally and upload it")

    def plan():
        sources = expand_inputs(cfg.inputs)
        return sources, plan_units(sources, cfg.unit_bytes)

    sources, units = comm.on_root(plan, "planning the inputs")

    with comm.agreed("loading the tokenizer"):
        threads = cfg.threads or _default_threads(comm)
        reference = _load_tokenizer(cfg, threads)
        if (cfg.append_eod or cfg.pbin) and reference.eod is None:
            flag = "--output-format pbin (every document ends with EOD)" if cfg.pbin else "--append-eod"
            raise MegacacheError(f"{flag}: {reference.name} has no end-of-document token; pass --eod-id")
        tok, backend = select_backend(reference, cfg.backend, threads, cfg.strict_backend)
    dtype = TOKEN_DTYPES[token_size(tok.vocab_size)] if cfg.pbin else optimal_dtype(tok.vocab_size)
    made = _made_from(cfg, sources, tok, dtype)

    outputs = [cfg.output_path(k) for k in cfg.json_keys]
    # Looked at first without the lock (a directory that is read-only too), then again holding it.
    records, _ = comm.on_root(lambda: _begin(cfg, made, None), "looking at the outputs there")
    if records is None:
        with _output_guard(cfg, comm, outputs) as guard:
            guard.enter("looking at the outputs there")
            records, finished = comm.on_root(lambda: _begin(cfg, made, guard.job), "looking at the outputs there")
            if records is None:
                reused = set(finished)
                ordered, tokens, documents = _tokenize_locked(cfg, comm, sources, units, reused, tok, dtype,
                                                              made, guard)
    if records is not None:
        return TokenizeResult(
            outputs=dict(zip(cfg.json_keys, outputs)), documents=records[cfg.json_keys[0]]["documents"],
            tokens={k: records[k]["tokens"] for k in cfg.json_keys}, units=len(units), units_reused=0,
            bad_count=0, bad_first=[], seconds=time.monotonic() - t0, ranks=comm.size, dtype=dtype.name,
            output_format=cfg.output_format, empty=dict.fromkeys(cfg.json_keys, 0), backend=backend,
            checked_documents=0, disagreements=[], stage_seconds=dict.fromkeys(STAGES, 0.0), already_there=True)
    bad_first = [loc for r in ordered for loc in r["bad_first"]][:MAX_BAD_LOCATIONS]
    return TokenizeResult(
        outputs={k: cfg.output_path(k) for k in cfg.json_keys}, documents=documents, tokens=tokens,
        units=len(units), units_reused=len(reused), bad_count=sum(r["bad_count"] for r in ordered),
        bad_first=bad_first, seconds=time.monotonic() - t0, ranks=comm.size, dtype=dtype.name,
        output_format=cfg.output_format,
        empty={k: sum(r["empty"][k] for r in ordered) for k in cfg.json_keys}, backend=backend, checked_documents=sum(r["checked"] for r in ordered),
        disagreements=[r["disagreement"] for r in ordered if r["disagreement"]],
        stage_seconds={k: sum(ordered[u.index]["seconds"][k] for u in units if u.index not in reused)
                       for k in STAGES},
    )


@dataclass
class _Unguarded:
    """A bucket output's stand-in for the lock on a local output: S3 has no lock, so nothing keeps a
    second job from writing the same prefix at once (docs/object-storage.md); the job's tag only."""

    job: str
    directory: None = None

    def enter(self, phase: str) -> None:
        """No monitor follows the phases: the launcher stops the job where a rank fails."""


def _output_guard(cfg: TokenizeConfig, comm: Comm, outputs: list[str]):
    if cfg.in_bucket:
        return _unguarded(cfg, comm)
    return guarded_output(comm, cfg.output_prefix, outputs, f"megacache tokenize into {cfg.output_prefix}",
                          work_dirs=[cfg.work_dir])


@contextmanager
def _unguarded(cfg: TokenizeConfig, comm: Comm):
    """A bucket output's job: on a failure, rank 0 notes on the error what it leaves in the bucket."""
    try:
        yield _Unguarded(comm.bcast(uuid.uuid4().hex[:12] if comm.rank == 0 else None))
    except Exception as exc:
        if comm.rank == 0:
            try:
                left = object_storage.listing(cfg.work_dir)
            except MegacacheError:  # the store is gone: the error says so
                left = []
            if left:
                exc.add_note(f"It leaves {len(left)} object(s) of its finished units under {cfg.work_dir}/: a rerun "
                             f"of the same command resumes from them and removes them")
        raise


def _work_there(cfg: TokenizeConfig) -> bool:
    if cfg.in_bucket:
        return bool(object_storage.listing(cfg.work_dir))
    return os.path.lexists(cfg.work_dir)


def _begin(cfg: TokenizeConfig, made: dict, tag: str | None) -> tuple[dict[str, dict] | None, list[int]]:
    """What this run does (rank 0, for every rank): the outputs' records when every one is there as
    made from ``made`` (nothing to write); else the units that an interrupted run with these inputs
    and settings finished (its work directory resumed, whatever is published); else none, in a work
    directory made afresh, after refusing outputs there not made from ``made`` (unless
    ``--overwrite``). ``tag`` None: before the lock, writing nothing; the work directory is then
    left to the job holding it (the records returned only where there is none)."""
    existing = _Existing({}, []) if cfg.overwrite else _existing(cfg, made)
    if len(existing.records) == len(cfg.json_keys):
        if tag is not None:
            _remove_work_dir(cfg.work_dir, tag)  # of a run stopped after its records
        elif _work_there(cfg):
            return None, []
        elif not cfg.in_bucket:
            tidy_output(cfg.output_prefix, [cfg.output_path(k) for k in cfg.json_keys], [cfg.work_dir])
        return existing.records, []
    fingerprint = _fingerprint(cfg, made)
    finished = _finished_units(cfg.work_dir, fingerprint)
    if finished is not None:
        return None, finished
    if existing.problems:
        raise _refusal(existing.problems)
    if tag is not None:
        _start_work_dir(cfg.work_dir, fingerprint)
    return None, []


def _tokenize_locked(cfg: TokenizeConfig, comm: Comm, sources: list[Source], units: list[WorkUnit],
                     reused: set[int], tok: Tokenizer, dtype: np.dtype, made: dict,
                     guard: Guard | _Unguarded) -> tuple[list[dict], dict[str, int], int]:
    """Tokenize, holding the output prefix's lock (a local one), the units ``reused`` finished
    already: every unit's record, tokens per key, documents."""
    owner = contiguous_shares([u.size for u in units], comm.size)
    mine = [u for u in units if owner[u.index] == comm.rank]
    if comm.rank == 0 and reused:
        LOG.info(f"megacache tokenize: resuming: {len(reused)} of {len(units)} units already done")

    # A bucket output's units are written in a local scratch directory of each rank, then uploaded.
    place = tempfile.mkdtemp(prefix="megacache-tokenize-") if cfg.in_bucket else cfg.work_dir
    try:
        return _tokenize_into(cfg, comm, sources, units, reused, tok, dtype, made, guard, mine, place)
    finally:
        if cfg.in_bucket:
            shutil.rmtree(place, ignore_errors=True)


def _tokenize_into(cfg: TokenizeConfig, comm: Comm, sources: list[Source], units: list[WorkUnit],
                   reused: set[int], tok: Tokenizer, dtype: np.dtype, made: dict, guard: Guard | _Unguarded,
                   mine: list[WorkUnit], place: str) -> tuple[list[dict], dict[str, int], int]:
    """``_tokenize_locked``'s work, this rank's units ``mine`` written in the directory ``place``."""
    tag = guard.job
    with Progress(comm, guard.directory, "tokenize", cfg.progress_interval_s) as progress:
        progress.phase("tokenizing", sum(u.size for u in units if u.index not in reused), BYTES, ("docs", "tokens"))
        guard.enter("tokenizing")
        with comm.agreed("tokenizing"), ThreadPoolExecutor(1) as publisher:
            published = [publisher.submit(_publish_unit, cfg, unit, tag, place,
                                          _tokenize_unit(cfg, unit, tok, dtype, progress, tag, place))
                         for unit in mine if unit.index not in reused]
            for done in published:
                done.result()

        # Every unit's counts, in input order, on every rank; each rank reads only its own records.
        records = {u.index: _read_done(cfg, u.index) for u in mine}
        gathered: dict[int, dict] = {}
        for from_rank in comm.allgather(records):
            gathered.update(from_rank)
        ordered = [gathered[u.index] for u in units]
        documents = sum(r["counts"][cfg.json_keys[0]][0] for r in ordered)
        if documents == 0:
            skipped = sum(r["bad_count"] for r in ordered)
            why = (f": all {skipped} record(s) were bad and skipped (--skip-bad), the first: "
                   + "; ".join(loc for r in ordered for loc in r["bad_first"][:MAX_BAD_LOCATIONS])
                   if skipped else " (the inputs hold no records)")
            raise MegacacheError(f"no documents were read from {len(sources)} input file(s){why}; nothing was written")

        tokens = {}
        progress.phase("writing", sum(r["counts"][key][2] for r in ordered for key in cfg.json_keys), "tokens")
        written = progress.counter("writing")
        for key in cfg.json_keys:
            guard.enter(f"writing {cfg.output_path(key)}")
            counts = [PartCounts(*r["counts"][key]) for r in ordered]
            out = cfg.output_path(key)
            load = lambda i, key=key: _load_part(cfg, key, i)  # noqa: E731
            if cfg.in_bucket:
                assemble_object(comm, out, dtype, counts, lambda i, key=key: _unit_name(cfg.work_dir, i, f"{key}.bin"),
                                load, place, written)
                tokens[key] = sum(c.tokens for c in counts)
                continue
            try:
                if cfg.pbin:
                    assemble_pbin(comm, out, dtype.itemsize, counts, [u.index for u in mine], load, tag, written)
                else:
                    assemble(comm, out, dtype, counts, [u.index for u in mine], load, tag, written)
            finally:
                discard(out, tag)
            tokens[key] = sum(c.tokens for c in counts)

    def record() -> None:
        for key in cfg.json_keys:
            out = cfg.output_path(key)
            write_record(out, {"made_from": made, "documents": documents, "tokens": tokens[key],
                               "files": {os.path.basename(f): size_and_time(f) for f in dataset_files(out)}})
        # After the records: a job stopped before them is resumed, and writes them.
        _remove_work_dir(cfg.work_dir, tag)  # never done records whose parts are gone

    guard.enter("recording the outputs")
    comm.on_root(record, "recording the outputs")
    return ordered, tokens, documents


def summary(result: TokenizeResult) -> str:
    if result.already_there:
        files = "" if result.output_format == "pbin" else ".bin/.idx"
        return "\n".join([f"megacache tokenize: already there, made from these inputs with these settings: nothing "
                          f"written ({result.seconds:.1f} s on {result.ranks} rank(s)); --overwrite rebuilds"]
                         + [f"  {path}{files}: {result.documents:,} documents, {result.tokens[key]:,} tokens"
                            for key, path in result.outputs.items()])
    lines = [f"megacache tokenize: done in {result.seconds:.1f} s on {result.ranks} rank(s)",
             f"  units: {result.units} ({result.units_reused} reused from an earlier run, "
             f"{result.units - result.units_reused} tokenized now)"]
    for key, path in result.outputs.items():
        if result.output_format == "pbin":
            lines.append(f"  {path}: {result.documents:,} documents, {result.tokens[key]:,} tokens "
                         f"({np.dtype(result.dtype).itemsize}-byte tokens), every document ending with EOD")
            if result.empty[key]:
                lines.append(f"  {result.empty[key]:,} document(s) of '{key}' had no tokens: each is one EOD token "
                             "in the .pbin")
        else:
            lines.append(f"  {path}.bin/.idx: {result.documents:,} documents, {result.tokens[key]:,} tokens "
                         f"({result.dtype})")
    total = sum(result.tokens.values())
    rate = total / max(result.seconds, 1e-9)
    lines.append(f"  throughput: {rate:,.0f} tokens/s total, {rate / result.ranks:,.0f} tokens/s per rank")
    lines.append(f"  tokenizer backend: {result.backend}")
    lines.append("  seconds per stage, all ranks: " + ", ".join(f"{k} {v:.2f}" for k, v in result.stage_seconds.items()))
    if result.checked_documents or result.disagreements:
        lines.append(f"  exactness guard: {result.checked_documents:,} documents encoded again by the reference: "
                     + (f"{len(result.disagreements)} unit(s) disagreed and were tokenized again by it: "
                        + "; ".join(result.disagreements[:MAX_BAD_LOCATIONS])
                        if result.disagreements else "all equal"))
    if result.bad_count:
        lines.append(f"  skipped {result.bad_count} bad record(s); first: " + "; ".join(result.bad_first))
    return "\n".join(lines)
