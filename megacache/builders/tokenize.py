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

``--output-format pbin`` writes Modalities' ``.pbin`` instead (docs/modalities.md): the same units
and assembly, tokens in its token size, and every document ending with EOD as its packer ends them.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field

import numpy as np

from ..text.backends import DEFAULT_VERIFY_FRACTION, Disagreement, SampleCheck, select_backend
from ..runtime.comm import Comm, get_comm
from ..errors import MegacacheError
from ..runtime.log import LOG
from ..formats.indexed import optimal_dtype
from ..formats.pbin import SUFFIX as PBIN_SUFFIX, TOKEN_DTYPES, token_size
from ..runtime.fsio import (gone, make_directories, publish, read_json, remove_quietly, remove_tree, tmp_path,
                            write_json_atomic, writing)
from ..text.inputs import BadRecords, WorkUnit, expand_inputs, plan_units, read_unit
from ..runtime.coordination import Guard
from ..runtime.progress import BYTES, Progress
from ..text.tokenization import Tokenizer, load_tokenizer
from .assemble import Part, PartCounts, assemble, assemble_pbin, discard, guarded_output
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

    @property
    def pbin(self) -> bool:
        return self.output_format == "pbin"

    def output_path(self, key: str) -> str:
        """Megatron's naming: ``{prefix}_{key}_document`` (preprocess_data.py, no sentence split),
        with ``.pbin`` after it for Modalities' format."""
        return f"{self.output_prefix}_{key}_document" + (PBIN_SUFFIX if self.pbin else "")

    @property
    def work_dir(self) -> str:
        """Hidden, so that an input directory holding the output never lists its files as input."""
        head, tail = os.path.split(self.output_prefix)
        return os.path.join(head, f".{tail}.megacache-work")


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

    def __repr__(self) -> str:
        return (f"TokenizeResult({', '.join(self.outputs.values())}: {self.documents:,} documents, "
                f"{sum(self.tokens.values()):,} tokens, {self.units} units ({self.units_reused} reused), "
                f"{self.bad_count} bad records skipped, in {self.seconds:.1f} s on {self.ranks} rank(s))")


def _load_tokenizer(cfg: TokenizeConfig, threads: int) -> Tokenizer:
    return load_tokenizer(cfg.tokenizer, tokenizer_type=cfg.tokenizer_type,
                          tokenizer_model=cfg.tokenizer_model, vocab_file=cfg.vocab_file,
                          merge_file=cfg.merge_file, eod_id=cfg.eod_id, threads=threads,
                          vocab_size=cfg.vocab_size, special_tokens=cfg.special_tokens,
                          tiktoken_pattern=cfg.tiktoken_pattern,
                          tiktoken_num_special_tokens=cfg.tiktoken_num_special_tokens)


def _default_threads(comm: Comm) -> int:
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, cores // max(1, comm.local_size))


def _fingerprint(cfg: TokenizeConfig, paths: list[str], tok: Tokenizer, dtype: np.dtype) -> str:
    """What must not change for finished units to be reused: inputs (by size and mtime), keys,
    EOD handling, tokenizer, dtype, unit size."""
    files = []
    for p in paths:
        st = os.stat(p)
        files.append([p, st.st_size, st.st_mtime_ns])
    desc = {
        "version": FORMAT_VERSION, "files": files, "keys": cfg.json_keys, "append_eod": cfg.append_eod,
        "tokenizer": tok.name, "vocab_size": tok.vocab_size, "eod": tok.eod, "dtype": dtype.name,
        "unit_bytes": cfg.unit_bytes, "skip_bad": cfg.skip_bad, "special_tokens": cfg.special_tokens,
        "output_format": cfg.output_format,
    }
    return hashlib.sha256(json.dumps(desc, sort_keys=True).encode()).hexdigest()


def _unit_name(work_dir: str, index: int, suffix: str) -> str:
    return os.path.join(work_dir, f"unit_{index:07d}.{suffix}")


def _prepare_work_dir(work_dir: str, fingerprint: str) -> list[int]:
    """Reuse a work directory left by an identical earlier run, else start it afresh.
    Returns the indices of units already finished. The directory is read, not tested first: one
    that another node removed can still look present to this node's client for a moment."""
    record = os.path.join(work_dir, "fingerprint.json")
    try:
        if read_json(record).get("fingerprint") == fingerprint:
            return sorted(int(n[5:12]) for n in os.listdir(work_dir) if n.endswith(".done"))
    except (OSError, ValueError, AttributeError):
        pass  # none, another run's, torn, or removed by another node since: started afresh
    try:
        remove_tree(work_dir, "stale")
    except OSError as exc:
        if not gone(exc):
            raise
    make_directories(work_dir)
    write_json_atomic(record, {"fingerprint": fingerprint})
    return []


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
                   progress: Progress, tag: str) -> dict:
    """Tokenize one unit into its temporary part files; the unit's record for ``_publish_unit``.
    Where the guard finds the fast backend disagreeing with its reference, the unit is redone with
    the reference."""
    record = {"backend": tok.backend, "disagreement": None}
    try:
        record.update(_write_unit(cfg, unit, tok, dtype, progress, tag))
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
        record.update(_write_unit(cfg, unit, tok.reference, dtype, progress, tag))
    return record


def _publish_unit(cfg: TokenizeConfig, unit: WorkUnit, tag: str, record: dict) -> None:
    """Publish a tokenized unit's part files, then its ``.done`` record. Mostly fsync waits: it runs
    on a thread, beside the encoding of the next unit."""
    for key in cfg.json_keys:
        for kind in ("bin", "doclen"):
            final = _unit_name(cfg.work_dir, unit.index, f"{key}.{kind}")
            publish(tmp_path(final, tag), final)
    write_json_atomic(_unit_name(cfg.work_dir, unit.index, "done"), {"unit": asdict(unit), **record})


def _write_unit(cfg: TokenizeConfig, unit: WorkUnit, tok: Tokenizer, dtype: np.dtype,
                progress: Progress, tag: str) -> dict:
    """Encode one unit into its temporary part files: its counts, bad records and guard tally.
    Raises Disagreement (the part files removed, its progress taken back) when the guard catches
    ``tok`` disagreeing with its reference."""
    bad = BadRecords()
    parts = {k: (tmp_path(_unit_name(cfg.work_dir, unit.index, f"{k}.bin"), tag),
                 tmp_path(_unit_name(cfg.work_dir, unit.index, f"{k}.doclen"), tag)) for k in cfg.json_keys}
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
    doclen = np.fromfile(_unit_name(cfg.work_dir, index, f"{key}.doclen"), dtype=np.int32)
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

    def plan():
        paths = expand_inputs(cfg.inputs)
        return paths, plan_units(paths, cfg.unit_bytes)

    paths, units = comm.on_root(plan, "planning the inputs")

    with comm.agreed("loading the tokenizer"):
        threads = cfg.threads or _default_threads(comm)
        reference = _load_tokenizer(cfg, threads)
        if (cfg.append_eod or cfg.pbin) and reference.eod is None:
            flag = "--output-format pbin (every document ends with EOD)" if cfg.pbin else "--append-eod"
            raise MegacacheError(f"{flag}: {reference.name} has no end-of-document token; pass --eod-id")
        tok, backend = select_backend(reference, cfg.backend, threads, cfg.strict_backend)
    dtype = TOKEN_DTYPES[token_size(tok.vocab_size)] if cfg.pbin else optimal_dtype(tok.vocab_size)

    outputs = [cfg.output_path(k) for k in cfg.json_keys]
    with guarded_output(comm, cfg.output_prefix, outputs, f"megacache tokenize into {cfg.output_prefix}",
                        work_dirs=[cfg.work_dir]) as guard:
        ordered, tokens, documents, reused = _tokenize_locked(cfg, comm, paths, units, tok, dtype, guard)
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


def _tokenize_locked(cfg: TokenizeConfig, comm: Comm, paths: list[str], units: list[WorkUnit], tok: Tokenizer,
                     dtype: np.dtype, guard: Guard) -> tuple[list[dict], dict[str, int], int, set[int]]:
    """Tokenize, holding the output prefix's lock: every unit's record, tokens per key, documents,
    the units reused from an earlier run."""
    fingerprint = _fingerprint(cfg, paths, tok, dtype) if comm.rank == 0 else None
    guard.enter("preparing the work directory")
    reused = set(comm.on_root(lambda: _prepare_work_dir(cfg.work_dir, fingerprint), "preparing the work directory"))
    tag = guard.job

    owner = contiguous_shares([u.size for u in units], comm.size)
    mine = [u for u in units if owner[u.index] == comm.rank]
    if comm.rank == 0 and reused:
        LOG.info(f"megacache tokenize: resuming: {len(reused)} of {len(units)} units already done")

    with Progress(comm, guard.directory, "tokenize", cfg.progress_interval_s) as progress:
        progress.phase("tokenizing", sum(u.size for u in units if u.index not in reused), BYTES, ("docs", "tokens"))
        guard.enter("tokenizing")
        with comm.agreed("tokenizing"), ThreadPoolExecutor(1) as publisher:
            published = [publisher.submit(_publish_unit, cfg, unit, tag,
                                          _tokenize_unit(cfg, unit, tok, dtype, progress, tag))
                         for unit in mine if unit.index not in reused]
            for done in published:
                done.result()

        # Every unit's counts, in input order, on every rank; each rank reads only its own records.
        records = {u.index: read_json(_unit_name(cfg.work_dir, u.index, "done")) for u in mine}
        gathered: dict[int, dict] = {}
        for part in comm.allgather(records):
            gathered.update(part)
        ordered = [gathered[u.index] for u in units]
        documents = sum(r["counts"][cfg.json_keys[0]][0] for r in ordered)
        if documents == 0:
            skipped = sum(r["bad_count"] for r in ordered)
            why = (f": all {skipped} record(s) were bad and skipped (--skip-bad), the first: "
                   + "; ".join(loc for r in ordered for loc in r["bad_first"][:MAX_BAD_LOCATIONS])
                   if skipped else " (the inputs hold no records)")
            raise MegacacheError(f"no documents were read from {len(paths)} input file(s){why}; nothing was written")

        tokens = {}
        progress.phase("writing", sum(r["counts"][key][2] for r in ordered for key in cfg.json_keys), "tokens")
        written = progress.counter("writing")
        for key in cfg.json_keys:
            guard.enter(f"writing {cfg.output_path(key)}")
            counts = [PartCounts(*r["counts"][key]) for r in ordered]
            out = cfg.output_path(key)
            load = lambda i, key=key: _load_part(cfg, key, i)  # noqa: E731
            try:
                if cfg.pbin:
                    assemble_pbin(comm, out, dtype.itemsize, counts, [u.index for u in mine], load, tag, written)
                else:
                    assemble(comm, out, dtype, counts, [u.index for u in mine], load, tag, written)
            finally:
                discard(out, tag)
            tokens[key] = sum(c.tokens for c in counts)

    comm.barrier()
    if comm.rank == 0:
        remove_tree(cfg.work_dir, tag)  # never done records whose parts are gone
    return ordered, tokens, documents, reused


def summary(result: TokenizeResult) -> str:
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
