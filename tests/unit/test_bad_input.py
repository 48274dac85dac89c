"""Bad input to every megacache command, end to end through the command line.

Every case feeds one bad input to a real command and requires what a user at the terminal needs:
exit code 2, a message naming what is wrong and where (file, line, field or element), no Python
traceback, and nothing left behind: no file written or changed anywhere under the case's directory
(output or temporary), except in a failed tokenize's work directory, which a rerun resumes from.
The units behind these messages have their own tests (test_inputs, test_indexed_format,
test_verify, test_blends, test_build, test_merge); this is the command-line view of them.

Cases run in-process through ``megacache.interfaces.cli.main``; those that need a file-size limit run as a
subprocess with ``RLIMIT_FSIZE`` (Python ignores SIGXFSZ, so a write past the limit fails with EFBIG,
as on a full disk, and works for root too). ``xfail(strict=True)`` cases document gaps whose fix
lies in a module this file's author could not change; each reason names the place.
"""

from __future__ import annotations

import os
import re
import resource
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import pytest

from megacache.interfaces.cli import main
from megacache.formats.indexed import read_layout, write_dataset
from megacache.runtime.fsio import TMP_MARK
from support.inputs.indexed import write_lengths

REPO = Path(__file__).resolve().parents[2]
VOCAB = 500
DOCUMENTS = 600  # enough that Megatron's default split '969, 30, 1' gives the test split a sequence
GOOD_RECORDS = 30  # a bad record in a .jsonl input is line 31
#: a tokenize run that fails keeps this directory so that a rerun resumes its finished units
WORK_DIR = re.compile(r"(^|/)\.[^/]*\.megacache-work(/|$)")


class Work:
    """One case's directory: a sound dataset (``good``) to damage or feed, input files under
    ``in/``, and the output directory ``out/``."""

    def __init__(self, root: Path):
        self.t = str(root)
        self.out = f"{self.t}/out"
        os.makedirs(self.out)
        os.makedirs(f"{self.t}/in")
        self.good = self.dataset("good", np.uint16)
        self.layout = read_layout(self.good + ".idx")

    def dataset(self, name: str, dtype, high: int = VOCAB) -> str:
        rng = np.random.default_rng(1)
        prefix = f"{self.t}/{name}"
        write_dataset(prefix, [rng.integers(0, high, rng.integers(1, 30)) for _ in range(DOCUMENTS)], dtype)
        return prefix

    def damaged(self, suffix: str, offset: int = 0, value: bytes = b"", cut: int = 0) -> str:
        """``d``: a copy of the good dataset with ``value`` written at ``offset`` of its ``suffix``
        file (".idx" or ".bin"), then ``cut`` bytes cut off that file's end."""
        prefix = f"{self.t}/d"
        for s in (".idx", ".bin"):
            shutil.copyfile(self.good + s, prefix + s)
        with open(prefix + suffix, "r+b") as f:
            f.seek(offset)
            f.write(value)
            f.truncate(f.seek(0, os.SEEK_END) - cut)
        return prefix

    def without_bin(self) -> str:
        prefix = self.damaged(".idx")
        os.remove(prefix + ".bin")
        return prefix

    def file(self, name: str, content: str | bytes) -> str:
        path = f"{self.t}/{name}"
        with open(path, "wb") as f:
            f.write(content.encode() if isinstance(content, str) else content)
        return path

    def jsonl(self, bad_line: str, name: str = "bad.jsonl") -> str:
        """``GOOD_RECORDS`` sound records, ``bad_line``, then a few more sound ones."""
        good = '{"id": 1, "text": "a sound document"}\n'
        return self.file(f"in/{name}", good * GOOD_RECORDS + bad_line + "\n" + good * 5)

    def sound_jsonl(self) -> str:
        return self.jsonl('{"text": "fine"}', name="sound.jsonl")

    def read_only_dir(self) -> str:
        os.makedirs(f"{self.t}/ro", 0o500)
        return f"{self.t}/ro"

    def big(self) -> str:
        """A dataset whose build and merge outputs are hundreds of KB (lengths only: a sparse .bin)."""
        write_lengths(f"{self.t}/big", np.full(4000, 50))
        return f"{self.t}/big"

    def big_jsonl(self) -> str:
        """About 400 KB of text: ~800 KB of uint16 tokens from the byte tokenizer."""
        return self.file("in/big.jsonl", "".join(f'{{"text": "{"word " * 200}{i}"}}\n' for i in range(400)))

    def tokenize(self, *inputs: str) -> list[str]:
        return ["tokenize", "--input", *inputs, "--output-prefix", f"{self.out}/o", "--tokenizer", "byte", "--append-eod"]

    def build(self, *data: str) -> list[str]:
        """A sound build command for ``data`` (flags after it override these: argparse keeps the last)."""
        return ["build", "--seq-length", "8", "--train-samples", "200", "--global-batch-size", "4",
                "--eval-iters", "2", "--eval-interval", "100", "--tokenizer-type", "NullTokenizer",
                "--vocab-size", str(VOCAB), "--data-cache-path", f"{self.out}/cache", *data]

    def merge(self, *prefixes: str) -> list[str]:
        return ["merge", *prefixes, "--output-prefix", f"{self.out}/m"]

    def ds(self, width: int = 2, ends=(3, 5, 9), tokens=None, index: bytes | None = None, data: bytes | None = None,
           metadata: int | None = None, loss: bytes | None = None) -> str:
        """``d.ds``, datatrove's tokenized file: 9 tokens of ``width`` bytes (or ``data``), the
        document ``ends`` (or the raw ``index``), a ``.metadata`` naming ``metadata`` as the width,
        and a ``.loss`` of ``loss``."""
        path = f"{self.t}/d.ds"
        ids = np.arange(9) if tokens is None else np.asarray(tokens)
        self.file("d.ds", ids.astype(f"<u{width}").tobytes() if data is None else data)
        self.file("d.ds.index", np.asarray(ends, dtype="<u8").tobytes() if index is None else index)
        if metadata is not None:
            self.file("d.ds.metadata", f"gpt2|{metadata}\n9\n9 T")
        if loss is not None:
            self.file("d.ds.loss", loss)
        return path

    def olmo(self, ids=(5, 6, 9, 7, 9), dtype: str = "<u2", data: bytes | None = None) -> str:
        """``d.npy``, an OLMo token file: ``ids`` (two documents, each ending with EOS 9) as ``dtype``,
        or the bytes ``data``."""
        return self.file("d.npy", np.asarray(ids, dtype=dtype).tobytes() if data is None else data)

    def terminated(self, name: str, dtype, high: int, eos: int) -> str:
        """A Megatron dataset whose documents each end with ``eos`` (tokenize --append-eod)."""
        rng = np.random.default_rng(1)
        write_dataset(f"{self.t}/{name}", [np.append(rng.integers(0, high, 5), eos) for _ in range(20)], dtype)
        return f"{self.t}/{name}"

    def on(self, verb: str, path: str) -> list[str]:
        """``verb`` (convert, verify) on the dataset ``path``."""
        return [verb, path, f"{self.out}/m"] if verb == "convert" else [verb, path]


@dataclass(frozen=True)
class Case:
    argv: Callable[[Work], list[str]]  # makes the bad input, returns the command line
    expect: tuple[str, ...]            # in the message; "{t}" stands for the case's directory
    report_on_stdout: bool = False     # verify reports each dataset on stdout, and a verdict on stderr
    fsize_limit: int | None = None     # run as a subprocess under this RLIMIT_FSIZE (bytes)
    permissions: bool = False          # run as a subprocess that file permissions bind, root's too


def case(name: str, argv, *expect: str, marks=(), **options):
    return pytest.param(Case(argv, expect, **options), id=name, marks=marks)


def gap(reason: str):
    return pytest.mark.xfail(strict=True, reason=reason)


def u64(v: int) -> bytes:
    return np.uint64(v).tobytes()


def i64(v: int) -> bytes:
    return np.int64(v).tobytes()


CASES = [
    # --- damaged datasets -------------------------------------------------------------------
    case("verify-truncated-idx", lambda w: ["verify", w.damaged(".idx", cut=w.layout.idx_size - 60)],
         "{t}/d.idx: truncated: 60 bytes, but S=600 sequences and C=601 document entries need",
         report_on_stdout=True),
    case("verify-truncated-idx-header", lambda w: ["verify", w.damaged(".idx", cut=w.layout.idx_size - 20)],
         "{t}/d.idx: truncated header (20 of 34 bytes)", report_on_stdout=True),
    case("verify-bin-shorter-than-index", lambda w: ["verify", w.damaged(".bin", cut=10)],
         "{t}/d.bin: ", "bytes, but the index covers", "the file is truncated", report_on_stdout=True),
    case("verify-bin-missing", lambda w: ["verify", w.without_bin()],
         "{t}/d.bin: token file not found (its index {t}/d.idx exists)", report_on_stdout=True),
    case("verify-wrong-magic", lambda w: ["verify", w.damaged(".idx", 0, b"XXIDIDX\0\0")],
         "{t}/d.idx: bad magic", "not a Megatron .idx file", report_on_stdout=True),
    case("verify-wrong-version", lambda w: ["verify", w.damaged(".idx", 9, u64(2))],
         "{t}/d.idx: unsupported version 2, expected 1", report_on_stdout=True),
    case("verify-bad-dtype-code", lambda w: ["verify", w.damaged(".idx", 17, bytes([9]))],
         "{t}/d.idx: unknown dtype code 9, expected one of", report_on_stdout=True),
    case("verify-non-monotone-documents",
         lambda w: ["verify", w.damaged(".idx", w.layout.documents_offset + 8 * 10, i64(0))],
         "{t}/d.idx: document_indices not monotone at entry 10: 9 then 0", report_on_stdout=True),
    case("verify-pointer-disagrees-with-lengths",
         lambda w: ["verify", w.damaged(".idx", w.layout.pointers_offset + 8 * 3, i64(999))],
         "{t}/d.idx: pointer of sequence 3 is 999, but the lengths before it put it at byte",
         report_on_stdout=True),
    case("verify-token-id-out-of-vocabulary",
         lambda w: ["verify", w.damaged(".bin", 2 * 7, np.uint16(4000).tobytes()), "--vocab-size", str(VOCAB)],
         "{t}/d.bin: token 7 has id 4000, outside the vocabulary of size 500", report_on_stdout=True),
    case("verify-verdict-names-the-dataset-on-stderr",
         lambda w: ["verify", w.damaged(".idx", w.layout.pointers_offset + 8 * 3, i64(999))], "{t}/d"),
    case("inspect-wrong-version", lambda w: ["inspect", w.damaged(".idx", 9, u64(2))],
         "{t}/d.idx: unsupported version 2, expected 1"),
    case("inspect-missing-path", lambda w: ["inspect", f"{w.t}/nope"],
         "{t}/nope: not a dataset prefix (no {t}/nope.idx) nor a cache directory"),
    case("merge-truncated-idx", lambda w: w.merge(w.damaged(".idx", cut=w.layout.idx_size - 60)),
         "{t}/d.idx: truncated: 60 bytes"),
    case("merge-bin-shorter-than-index", lambda w: w.merge(w.damaged(".bin", cut=10)),
         "{t}/d.bin: truncated: ", "bytes, but its index {t}/d.idx puts the last sequence's tokens up to byte",
         "megacache verify {t}/d"),
    case("merge-last-pointer-disagrees-with-lengths",
         lambda w: w.merge(w.damaged(".idx", w.layout.pointers_offset + 8 * 599, i64(2))),
         "{t}/d.idx: the pointers of sequences 0..600 disagree with their lengths; run megacache verify"),
    case("merge-non-monotone-documents",
         lambda w: w.merge(w.damaged(".idx", w.layout.documents_offset + 8 * 10, i64(0))),
         "{t}/d.idx", "document_indices"),
    case("merge-mixed-token-dtypes", lambda w: w.merge(w.good, w.dataset("wide", np.int32)),
         "merge: {t}/wide holds int32 tokens but {t}/good holds uint16; give --dtype to write every token in one "
         "width"),
    case("merge-dtype-narrower-than-an-id", lambda w: [*w.merge(w.dataset("wide", np.int32, high=70000)), "--dtype",
                                                        "uint16"],
         "{t}/wide.bin: byte ", "does not fit {t}/out/m's 2-byte tokens"),
    case("merge-dtype-the-format-does-not-hold", lambda w: ["merge", w.ds(), "--output-prefix", f"{w.out}/m.ds",
                                                             "--dtype", "uint8"],
         "merge: --dtype uint8: a .ds file holds tokens of uint16, uint32"),
    case("merge-glob-matching-nothing", lambda w: w.merge(f"{w.t}/none_*"), "{t}/none_*: the pattern matches no dataset"),
    case("merge-input-list-missing", lambda w: ["merge", "--input-list", f"{w.t}/list.txt", "--output-prefix",
                                                f"{w.out}/m"],
         "--input-list {t}/list.txt: cannot read it: No such file or directory"),
    case("convert-pattern-without-per-file", lambda w: ["convert", w.ds(), f"{w.out}/*"],
         "convert: --per-file takes an output pattern whose * stands for each input's name (such as out/*.pbin), "
         "and only it does; '{t}/out/*' has one"),
    case("convert-per-file-without-a-pattern", lambda w: ["convert", "--per-file", w.ds(), f"{w.out}/m"],
         "'{t}/out/m' has no *"),
    case("convert-per-file-same-name-twice",
         lambda w: (os.makedirs(f"{w.t}/a"), os.makedirs(f"{w.t}/b"),
                    ["convert", "--per-file", w.dataset("a/x", np.uint16), w.dataset("b/x", np.uint16),
                     f"{w.out}/*.pbin"])[-1],
         "convert: --per-file: {t}/a/x and {t}/b/x would both be written to {t}/out/x.pbin"),
    case("merge-no-inputs", lambda w: ["merge", "--output-prefix", f"{w.out}/m"],
         "merge: give the datasets to merge, or --input-list FILE"),
    case("merge-max-size-part-named-like-an-input",
         lambda w: [*w.merge(w.dataset("out/m-00000-of-00001", np.uint16)), "--max-size", "1G"],
         "merge: the output {t}/out/m-00000-of-00001 is also an input"),
    case("merge-duplicate-prefix", lambda w: w.merge(w.good, w.good),
         "merge: input given more than once: {t}/good"),
    case("merge-mixed-formats", lambda w: ["merge", w.good, f"{w.t}/x.pbin", "--output-prefix", f"{w.out}/m"],
         "merge: the inputs and the output must all be .pbin files, all .ds files or all Megatron prefixes; "
         "megacache convert"),
    case("convert-same-format", lambda w: ["convert", w.good, f"{w.out}/copy"],
         "convert: {t}/good and", "are in one format (Megatron prefix); give the output in another: a "
         "path ending in .pbin (Modalities), in .ds (datatrove)"),
    case("convert-missing-pbin", lambda w: ["convert", f"{w.t}/none.pbin", f"{w.out}/back"],
         "{t}/none.pbin: no such .pbin file"),
    case("merge-missing-prefix", lambda w: w.merge(w.good, f"{w.t}/nope"), "{t}/nope.idx: index file not found"),
    # --- datatrove .ds ----------------------------------------------------------------------------
    *(case(f"{verb}-ds-truncated-index", lambda w, v=verb: w.on(v, w.ds(index=u64(3) + u64(5)[:5])),
           "{t}/d.ds.index: 13 bytes, not a multiple of 8 (uint64 document ends): the file is truncated at byte 8",
           report_on_stdout=verb == "verify")
      for verb in ("convert", "verify")),
    *(case(f"{verb}-ds-non-monotone-ends", lambda w, v=verb: w.on(v, w.ds(ends=(3, 7, 5, 9))),
           "{t}/d.ds.index: document 2 ends at token 5, before the end of document 1 (7): the ends must not "
           "decrease", report_on_stdout=verb == "verify")
      for verb in ("convert", "verify")),
    case("convert-ds-end-past-the-data", lambda w: w.on("convert", w.ds(ends=(3, 12, 9))),
         "{t}/d.ds.index: document 1 ends at token 12, past the 9 tokens of {t}/d.ds"),
    case("convert-ds-index-past-the-data", lambda w: w.on("convert", w.ds(ends=(3, 5, 11))),
         "{t}/d.ds.index: document 2 ends at token 11, past the 9 tokens of {t}/d.ds (truncated data?)"),
    case("convert-ds-index-short-of-the-data", lambda w: w.on("convert", w.ds(ends=(3, 5))),
         "{t}/d.ds.index: the documents cover 5 of the 9 tokens of {t}/d.ds"),
    case("convert-ds-wrong-width", lambda w: w.on("convert", w.ds(metadata=4)),
         "{t}/d.ds.metadata: says 4-byte tokens, but {t}/d.ds holds 18 bytes for the 9 tokens its index covers: "
         "2-byte tokens"),
    case("verify-ds-data-not-a-multiple-of-the-width", lambda w: ["verify", w.ds(data=bytes(19))],
         "{t}/d.ds: 19 bytes, not a multiple of the token width 2: the file is truncated at byte 18",
         report_on_stdout=True),
    case("convert-ds-id-too-wide", lambda w: ["convert", w.ds(4, tokens=[1, 2, 70_000] + [0] * 6), f"{w.out}/m",
                                             "--vocab-size", "1000"],
         "{t}/d.ds: byte 8: token 70000 does not fit {t}/out/m's 2-byte tokens; give a larger --vocab-size"),
    case("convert-ds-no-index", lambda w: ["convert", w.file("x.ds", bytes(4)), f"{w.out}/m"],
         "{t}/x.ds.index: not found; megacache needs the document ends"),
    case("convert-ds-masked-loss", lambda w: ["convert", w.ds(loss=bytes([1] * 6 + [0] * 3)), f"{w.out}/m"],
         "{t}/d.ds.loss: token 6 (document 2) is masked from the loss", "--drop-loss-mask"),
    case("verify-ds-loss-not-a-mask", lambda w: ["verify", w.ds(loss=bytes([1, 1, 7] + [1] * 6))],
         "{t}/d.ds.loss: byte 2 is 7; a loss mask holds 0 (masked) or 1", report_on_stdout=True),
    case("convert-ds-short-loss", lambda w: ["convert", w.ds(loss=bytes([1] * 5)), f"{w.out}/m"],
         "{t}/d.ds.loss: 5 bytes, but {t}/d.ds holds 9 tokens"),
    case("convert-folder-without-datasets", lambda w: ["convert", f"{w.t}/in", f"{w.out}/m.ds"],
         "{t}/in: a folder of no datasets (.ds files, .pbin files, OLMo .npy files, Megatron .idx/.bin prefixes)"),
    case("convert-mixed-formats", lambda w: ["convert", w.ds(), w.good, f"{w.out}/m.pbin"],
         "convert: the inputs must all be of one format", "{t}/d.ds and {t}/good are not"),
    case("merge-ds-mixed-widths", lambda w: (w.file("w.ds.index", u64(2)),  # two 4-byte tokens
                                             ["merge", w.ds(), w.file("w.ds", bytes(8)), "--output-prefix",
                                              f"{w.out}/m.ds"])[1],
         "merge: {t}/w.ds holds uint32 tokens but {t}/d.ds holds uint16; give --dtype"),
    # --- OLMo token files -------------------------------------------------------------------------
    case("convert-olmo-eos-id-out-of-range", lambda w: ["convert", w.olmo(), f"{w.out}/m", "--eos-id", "70000",
                                                        "--dtype", "uint16"],
         "{t}/d.npy: --eos-id 70000 does not fit its 2-byte tokens (0..65535)"),
    case("convert-olmo-size-not-a-multiple-of-the-width",
         lambda w: ["convert", w.olmo(data=bytes(19)), f"{w.out}/m", "--eos-id", "9", "--dtype", "uint16"],
         "{t}/d.npy: 19 bytes, not a multiple of the 2-byte tokens of --dtype uint16: truncated at byte 18"),
    # five 2-byte ids read as 4-byte ones: the one mismatch of widths that the size shows
    case("convert-olmo-wrong-width", lambda w: ["convert", w.olmo(), f"{w.out}/m", "--eos-id", "9",
                                                "--dtype", "uint32"],
         "{t}/d.npy: 10 bytes, not a multiple of the 4-byte tokens of --dtype uint32"),
    case("convert-olmo-numpy-header", lambda w: (np.save(f"{w.t}/d.npy", np.arange(9, dtype=np.uint16)),
                                                 ["convert", f"{w.t}/d.npy", f"{w.out}/m", "--eos-id", "8",
                                                  "--dtype", "uint16"])[1],
         "{t}/d.npy: a numpy array with a header (numpy.save's .npy), not an OLMo token file"),
    case("convert-olmo-empty", lambda w: ["convert", w.olmo(data=b""), f"{w.out}/m.ds", "--eos-id", "9",
                                          "--dtype", "uint16"],
         "{t}/d.npy: empty, no documents"),
    case("verify-olmo-id-outside-the-vocabulary",
         lambda w: ["verify", w.olmo(), "--eos-id", "9", "--dtype", "uint16", "--vocab-size", "7"],
         "{t}/d.npy: token 2 has id 9, outside the vocabulary of size 7", report_on_stdout=True),
    case("verify-olmo-size-not-a-multiple-of-the-width",
         lambda w: ["verify", w.olmo(data=bytes(7)), "--eos-id", "9", "--vocab-size", "50304"],
         "{t}/d.npy: 7 bytes, not a multiple of the 2-byte tokens of --dtype uint16", report_on_stdout=True),
    case("convert-olmo-no-width", lambda w: ["convert", w.olmo(), f"{w.out}/m", "--eos-id", "9"],
         "convert: {t}/d.npy records no token width; give --dtype uint16|uint32"),
    case("convert-olmo-no-eos-id", lambda w: ["convert", w.olmo(), f"{w.out}/m", "--dtype", "uint16"],
         "convert: an OLMo token file's documents are delimited by the EOS id alone: give --eos-id"),
    case("convert-to-olmo-id-too-wide",
         lambda w: ["convert", w.terminated("wide", np.int32, 70_000, 3), f"{w.out}/m.npy", "--eos-id", "3",
                    "--dtype", "uint16"],
         "{t}/wide.bin: byte ", "does not fit {t}/out/m.npy's 2-byte tokens"),
    case("convert-to-olmo-eos-id-out-of-range",
         lambda w: ["convert", w.good, f"{w.out}/m.npy", "--eos-id", "70000", "--dtype", "uint16"],
         "{t}/out/m.npy: --eos-id 70000 does not fit its 2-byte tokens"),
    case("convert-to-olmo-documents-without-eos", lambda w: ["convert", w.good, f"{w.out}/m.npy", "--eos-id", "499"],
         "{t}/good: document 0 ends with token ", "not with --eos-id 499", "--append-eod"),
    case("convert-eos-id-without-olmo", lambda w: ["convert", w.good, f"{w.out}/m.ds", "--eos-id", "3"],
         "convert: --eos-id and --dtype are for OLMo token files (.npy)"),
    case("merge-olmo", lambda w: ["merge", w.olmo(), "--output-prefix", f"{w.out}/m.npy"],
         "merge: OLMo token files are not merged"),
    case("build-truncated-idx", lambda w: w.build("--data-path", w.damaged(".idx", cut=w.layout.idx_size - 60)),
         "{t}/d.idx: truncated: 60 bytes"),
    case("build-bin-shorter-than-index", lambda w: w.build("--data-path", w.damaged(".bin", cut=10)),
         "{t}/d.bin: truncated: ", "megacache verify {t}/d"),
    # the plan takes a split's tokens from its pointers; reading the lengths catches the disagreement
    case("build-split-pointers-disagree-with-lengths",
         lambda w: w.build("--data-path", w.damaged(".idx", w.layout.pointers_offset + 8 * 580, i64(2))),
         "{t}/d.idx: the lengths of sequences [0, 581) sum to", "but their pointers span",
         "megacache verify {t}/d"),
    # --- blends and data flags ------------------------------------------------------------------
    *(case(f"build-weight-{name}", lambda w, v=v: w.build("--data-path", v, w.good, "1", w.dataset("b", np.uint16)),
           f"--data-path: the weight of '{{t}}/good' is {shown}; weights must be positive and finite")
      for name, v, shown in (("zero", "0", "0.0"), ("negative", "-1", "-1.0"), ("nan", "nan", "nan"),
                             ("inf", "inf", "inf"))),
    case("build-odd-word-count", lambda w: w.build("--data-path", "0.3", w.good, "0.7"),
         "--data-path: 3 words, some of them numbers", "weighted blends are WEIGHT PREFIX pairs"),
    case("build-duplicate-prefix", lambda w: w.build("--data-path", "1", w.good, "2", w.good),
         "--data-path: prefix '{t}/good' is given twice (datasets 0 and 1)"),
    case("build-missing-prefix", lambda w: w.build("--data-path", "1", w.good, "1", f"{w.t}/nope"),
         "{t}/nope.idx: index file not found"),
    # the most basic problem first, before the flags that size the splits
    *(case(f"build-missing-prefix-before-{name}",
           lambda w, flags=flags: ["build", "--data-path", f"{w.t}/nope", "--seq-length", "8", "--train-samples", "10",
                                   *flags, "--tokenizer-type", "NullTokenizer", "--vocab-size", "100",
                                   "--data-cache-path", f"{w.out}/cache"],
           "{t}/nope.idx: index file not found")
      for name, flags in (("batch-size", ["--eval-iters", "0"]), ("eval-flags", []))),
    case("build-mixed-token-dtypes", lambda w: w.build("--data-path", w.good, w.dataset("wide", np.int32)),
         "different token dtypes ({t}/good holds uint16, {t}/wide holds int32)", "tokenize them with one tokenizer"),
    case("build-data-args-path-missing", lambda w: w.build("--data-args-path", f"{w.t}/nope.txt"),
         "--data-args-path {t}/nope.txt: cannot read it (No such file or directory)"),
    case("build-per-split-malformed-json",
         lambda w: w.build("--per-split-data-args-path", w.file("split.json", '{"train": ["%s"],\n "valid": }' % w.good)),
         "{t}/split.json: line 2: not valid JSON"),
    case("build-per-split-missing-key",
         lambda w: w.build("--per-split-data-args-path", w.file("split.json", '{"train": ["%s"], "valid": null}' % w.good)),
         "{t}/split.json: key 'test' is missing", "use null for a split without data"),
    case("build-per-split-wrong-value-type",
         lambda w: w.build("--per-split-data-args-path", w.file("split.json", '{"train": 5, "valid": null, "test": null}')),
         "{t}/split.json: 'train' must be a list of strings or one string, got 5"),
    # --- Megatron versions ----------------------------------------------------------------------
    case("build-unknown-megatron-version", lambda w: w.build("--data-path", w.good, "--megatron-version", "0.15"),
         "--megatron-version 0.15: megacache reproduces megatron-core 0.16, 0.17, 0.18, 0.19, 0.20 (Megatron-LM "
         "main, package 0.20.0, not yet released); patch versions accepted, e.g. 0.19.2"),
    case("build-megatron-version-not-a-version", lambda w: w.build("--data-path", w.good, "--megatron-version", "latest"),
         "--megatron-version latest: megacache reproduces megatron-core 0.16, 0.17, 0.18, 0.19"),
    case("build-flag-newer-than-version",
         lambda w: w.build("--data-path", w.good, "--megatron-version", "0.17", "--null-tokenizer-pad-id", "3"),
         "--null-tokenizer-pad-id does not exist in Megatron-LM 0.17 (it exists in 0.18 to 0.20)",
         "--megatron-version to match it"),
    case("build-flag-removed-in-version",
         lambda w: w.build("--data-path", w.good, "--megatron-version", "0.19.2", "--tokenizer-type",
                           "HuggingFaceTokenizer", "--tokenizer-model", "hf", "--tokenizer-hf-use-fast"),
         "--tokenizer-hf-use-fast does not exist in Megatron-LM 0.19 (it exists in 0.16 and 0.17)"),
    case("build-legacy-tokenizer-after-016",
         lambda w: w.build("--data-path", w.good, "--megatron-version", "0.18", "--legacy-tokenizer"),
         "--legacy-tokenizer does not exist in Megatron-LM 0.18 (it exists in 0.16)"),
    case("build-flag-checked-with-given-identity",
         lambda w: w.build("--data-path", w.good, "--megatron-version", "0.16", "--chat-template", "x",
                           "--tokenizer-identifiers", w.file("ids.json", '{"class": "X"}')),
         "--chat-template does not exist in Megatron-LM 0.16 (it exists in 0.18 to 0.20)"),
    case("build-fast-cache-load-with-data-path",
         lambda w: w.build("--data-path", w.good, "--dataloader-fast-cache-load"),
         "--dataloader-fast-cache-load and --data-path cannot be used together (megatron-core asserts)"),
    case("verify-unknown-megatron-version", lambda w: ["verify", w.good, "--megatron-version", "1.0"],
         "--megatron-version 1.0: megacache reproduces megatron-core 0.16, 0.17, 0.18, 0.19"),
    case("inspect-unknown-megatron-version", lambda w: ["inspect", w.good, "--megatron-version", "0.21"],
         "--megatron-version 0.21: megacache reproduces megatron-core"),
    case("build-flag-of-megatron-main-only",
         lambda w: w.build("--data-path", w.good, "--megatron-version", "0.19", "--tokenizer-type",
                           "HuggingFaceTokenizer", "--tokenizer-model", "hf", "--use-gigatoken"),
         "--use-gigatoken does not exist in Megatron-LM 0.19 (it exists in 0.20)"),
    # --- sizes and split ------------------------------------------------------------------------
    case("build-seq-length-zero", lambda w: w.build("--data-path", w.good, "--seq-length", "0"),
         "--seq-length must be a positive integer, got 0"),
    case("build-seq-length-negative", lambda w: w.build("--data-path", w.good, "--seq-length", "-3"),
         "--seq-length must be a positive integer, got -3"),
    case("build-negative-train-samples", lambda w: w.build("--data-path", w.good, "--train-samples", "-1"),
         "--train-samples must not be negative, got -1"),
    case("build-negative-global-batch-size", lambda w: w.build("--data-path", w.good, "--global-batch-size", "-4"),
         "--global-batch-size"),
    case("build-split-four-weights", lambda w: w.build("--data-path", w.good, "--split", "1,2,3,4"),
         "split '1,2,3,4' has 4 weights; give at most 3 (train, valid, test)"),
    case("build-split-all-zero", lambda w: w.build("--data-path", w.good, "--split", "0,0,0"),
         "split '0,0,0': the weights sum to 0; at least one must be positive"),
    case("build-split-not-a-number", lambda w: w.build("--data-path", w.good, "--split", "1..2,3"),
         "split '1..2,3': '1..2' is not a number"),
    # --- output locations -----------------------------------------------------------------------
    case("build-cache-dir-is-a-file", lambda w: w.build("--data-path", w.good, "--data-cache-path", w.file("afile", "x")),
         "--data-cache-path", "{t}/afile"),
    case("build-file-size-limit", lambda w: w.build("--data-path", w.big(), "--train-samples", "100000"),
         "{t}/out/cache/", "File too large", fsize_limit=64 << 10),
    case("merge-file-size-limit", lambda w: w.merge(w.big()),
         "{t}/out/.m.idx", "cannot write (File too large)", fsize_limit=64 << 10),
    case("merge-output-under-a-file", lambda w: ["merge", w.good, "--output-prefix", w.file("afile", "x") + "/m"],
         "{t}/afile", "Not a directory"),
    case("tokenize-output-under-a-file",
         lambda w: ["tokenize", "--input", w.sound_jsonl(), "--output-prefix", w.file("afile", "x") + "/o",
                    "--tokenizer", "byte"],
         "{t}/afile"),
    case("tokenize-output-directory-not-writable",
         lambda w: ["tokenize", "--input", w.sound_jsonl(), "--output-prefix", w.read_only_dir() + "/o",
                    "--tokenizer", "byte"],
         "{t}/ro", permissions=True),
    case("tokenize-output-file-size-limit",  # parts fit, the assembled .bin does not
         lambda w: [*w.tokenize(w.big_jsonl()), "--unit-bytes", "64K"],
         "{t}/out/.o_text_document.bin", "cannot write (File too large)", fsize_limit=300 << 10),
    case("tokenize-part-file-size-limit",  # one unit, whose part file is already too large
         lambda w: w.tokenize(w.big_jsonl()), "{t}/out/", "File too large", fsize_limit=300 << 10),
    # --- tokenize inputs ------------------------------------------------------------------------
    case("tokenize-no-tokenizer",  # as Megatron's preprocess_data.py: raw bytes are no silent default
         lambda w: ["tokenize", "--input", w.sound_jsonl(), "--output-prefix", f"{w.out}/o"],
         "no tokenizer given: pass --tokenizer SPEC", "or --tokenizer-type TYPE with its files",
         "--tokenizer byte picks the raw UTF-8 byte tokenizer (ids 0..255, EOD 256) explicitly"),
    case("tokenize-invalid-json", lambda w: w.tokenize(w.jsonl('{"text": "unterminated')),
         "{t}/in/bad.jsonl:line 31: invalid JSON: Unterminated string starting at column 10"),
    case("tokenize-line-not-an-object", lambda w: w.tokenize(w.jsonl('["text"]')),
         "{t}/in/bad.jsonl:line 31: expected a JSON object, got list"),
    case("tokenize-missing-key", lambda w: w.tokenize(w.jsonl('{"body": "x", "id": 3}')),
         "{t}/in/bad.jsonl:line 31: missing key 'text' (keys present: body, id)"),
    case("tokenize-wrong-value-type", lambda w: w.tokenize(w.jsonl('{"text": 42}')),
         "{t}/in/bad.jsonl:line 31: value of 'text' is int, expected a string"),
    case("tokenize-invalid-utf8", lambda w: w.tokenize(w.file("in/u.jsonl", b'{"text": "ok"}\n{"text": "\xff"}\n')),
         "{t}/in/u.jsonl:line 2: invalid UTF-8 at byte 11 of the line"),
    case("tokenize-empty-file", lambda w: w.tokenize(w.file("in/empty.jsonl", "")),
         "{t}/in/empty.jsonl:line 1: empty file"),
    case("tokenize-no-documents", lambda w: [*w.tokenize(w.file("in/allbad.jsonl", "[1]\n[2]\n")), "--skip-bad"],
         "no documents were read", "{t}/in/allbad.jsonl:line 1"),
    case("tokenize-input-missing", lambda w: w.tokenize(f"{w.t}/in/missing.jsonl"),
         "{t}/in/missing.jsonl: no such file or directory"),
    case("tokenize-input-directory-without-inputs", lambda w: w.tokenize(f"{w.t}/in"),
         "{t}/in: directory has no input files; supported: .jsonl"),
    case("tokenize-unsupported-file-type", lambda w: w.tokenize(w.file("in/data.csv", "a,b\n")),
         "{t}/in/data.csv: unsupported input file type; supported: .jsonl"),
]


def files_under(root: Path) -> dict[str, tuple[int, int]]:
    return {str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns)
            for p in root.rglob("*") if p.is_file()}


#: for root, a command whose process lacks the capabilities that let root ignore file permissions
#: (util-linux's setpriv drops them from the bounding set; the program it runs starts without them)
BOUND_BY_PERMISSIONS = ["setpriv", "--bounding-set", "-dac_override,-dac_read_search"] if os.geteuid() == 0 else []


def run_cli(argv: list[str], capsys, fsize_limit: int | None = None, permissions: bool = False) -> tuple[int, str, str]:
    if fsize_limit is None and not permissions:
        try:
            code = main(argv)
        except SystemExit as exc:  # argparse's own errors
            code = exc.code
        captured = capsys.readouterr()
        return code, captured.out, captured.err

    def limit() -> None:
        if fsize_limit is not None:
            resource.setrlimit(resource.RLIMIT_FSIZE, (fsize_limit, fsize_limit))

    env = dict(os.environ, PYTHONPATH=str(REPO), PYTHONWARNINGS="ignore")
    prefix = BOUND_BY_PERMISSIONS if permissions else []
    proc = subprocess.run([*prefix, sys.executable, "-m", "megacache", *argv], capture_output=True, text=True, env=env,
                          preexec_fn=limit, timeout=300)
    return proc.returncode, proc.stdout, proc.stderr


@pytest.fixture(scope="module")
def kernels_loaded(tmp_path_factory):
    """A run under a file-size limit must not be the first to load megacache's kernels: where they
    run through numba's JIT (MEGACACHE_KERNEL_DIR=jit), numba compiles them on first use and saves
    them beside their sources, and the limit would hit those cache files instead of the output under
    test. One sound build, in process, first."""
    w = Work(tmp_path_factory.mktemp("kernels"))
    assert main(w.build("--data-path", w.big(), "--train-samples", "100000")) == 0


@pytest.mark.parametrize("c", CASES)
def test_bad_input_is_refused_clearly_and_publishes_nothing(tmp_path, capsys, kernels_loaded, c: Case):
    w = Work(tmp_path)
    argv = c.argv(w)
    before = files_under(tmp_path)
    code, out, err = run_cli(argv, capsys, c.fsize_limit, c.permissions)

    shown = f"exit {code}\n--- stdout\n{out}\n--- stderr\n{err}"
    assert code == 2, shown
    assert "Traceback" not in out + err, shown
    assert f"megacache {argv[0]}: error: " in err, shown
    report = out if c.report_on_stdout else err
    for text in c.expect:
        assert text.replace("{t}", w.t) in report, shown
    if c.report_on_stdout:
        assert "failed verification" in err, shown

    after = files_under(tmp_path)
    # Only a failed tokenize's resumable work directory may remain (tmp files in it: see below).
    left = sorted(p for p, stat in after.items() if before.get(p) != stat and not WORK_DIR.search(p))
    assert left == [], f"written or changed: {left}\n{shown}"
    assert sorted(set(before) - set(after)) == []


def test_failed_tokenize_leaves_no_temporary_files(tmp_path, capsys):
    w = Work(tmp_path)
    code, _, _ = run_cli(w.tokenize(w.jsonl("[1]")), capsys, None)
    assert code == 2
    assert [p for p in files_under(tmp_path) if TMP_MARK in p] == []


def test_the_sound_inputs_pass(tmp_path, capsys):
    """The control: the same commands on sound inputs succeed, so each case fails for its one bad input."""
    w = Work(tmp_path)
    blend = ["--data-path", "1", w.good, "1", w.dataset("b", np.uint16)]
    for argv in (["verify", w.good, "--vocab-size", str(VOCAB)], ["inspect", w.good], w.merge(w.good),
                 w.build("--data-path", w.good), w.build(*blend), w.tokenize(w.sound_jsonl())):
        code, out, err = run_cli(argv, capsys, None)
        assert code == 0, f"{argv}\n{out}\n{err}"
    names = os.listdir(w.out)
    assert {"m.bin", "m.idx", "o_text_document.bin", "o_text_document.idx", "cache"} <= set(names)
    assert not any(TMP_MARK in p for p in files_under(tmp_path))


def test_installed_megatron_newer_than_supported_needs_a_version(tmp_path):
    """A megatron-core megacache does not know, importable beside it (a Megatron-LM checkout's
    megatron/core/package_info.py first on PYTHONPATH, as in training containers): build, verify and
    inspect refuse to guess its cache names unless told the version."""
    site = tmp_path / "site"
    (site / "megatron" / "core").mkdir(parents=True)
    (site / "megatron" / "core" / "package_info.py").write_text(
        'MAJOR = 0\nMINOR = 21\nPATCH = 0\nPRE_RELEASE = ""\nVERSION = (MAJOR, MINOR, PATCH, PRE_RELEASE)\n')
    w = Work(tmp_path / "w")
    env = dict(os.environ, PYTHONPATH=str(site), PYTHONWARNINGS="ignore")
    for argv in (w.build("--data-path", w.good), ["verify", f"{w.out}/cache"], ["inspect", w.good]):
        proc = subprocess.run([sys.executable, "-m", "megacache.interfaces.cli", *argv], capture_output=True, text=True, env=env,
                              timeout=300)
        assert proc.returncode == 2, proc.stderr
        assert ("megatron-core 0.21.0 is installed, newer than the versions megacache reproduces (0.16, 0.17, 0.18, "
                "0.19, 0.20 (Megatron-LM main, package 0.20.0, not yet released)): its cache names may differ. Pass "
                "--megatron-version") in proc.stderr, proc.stderr
        assert "Traceback" not in proc.stderr
    assert not os.path.exists(f"{w.out}/cache")
    proc = subprocess.run([sys.executable, "-m", "megacache.interfaces.cli", *w.build("--data-path", w.good, "--megatron-version",
                                                                          "0.19")],
                          capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "for megatron-core 0.19 in" in proc.stdout
