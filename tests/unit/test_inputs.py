"""megacache.text.inputs: finding input files, cutting them into work units, reading the documents."""

from __future__ import annotations

import gzip
import json
import os
import random

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard

from megacache.errors import InputError, MegacacheError
from megacache.text.inputs import BadRecords, Source, expand_inputs, plan_units, read_unit

# Characters that stress line handling: multi-byte UTF-8, astral plane, Unicode line separators
# (which must NOT split lines), tabs, quotes and backslashes (JSON escapes).
_ALPHABET = list("abcdefghij KLMNOP 0123456789 .,;!?") + ["é", "ß", "中", "文", "😀", "\u2028", "\x85",
                                                         "\t", '"', "\\", "\u00a0"]


def _doc(rng: random.Random, for_txt: bool = False) -> str:
    n = rng.choice([0, 1, 2, 5, 20, 80, 300])
    s = "".join(rng.choice(_ALPHABET) for _ in range(n))
    if not for_txt and rng.random() < 0.1:
        s += rng.choice(["\n", "\r\n", "\r", "x\ny"])  # JSON-escaped inside a jsonl line
    return s


def _docs(seed: int, n: int, for_txt: bool = False) -> list[str]:
    rng = random.Random(seed)
    return [_doc(rng, for_txt) for _ in range(n)]


def _jsonl_bytes(docs: list[str], seed: int, final_newline: bool = True) -> bytes:
    """One object per line; CRLF and LF endings mixed, ASCII and raw UTF-8 mixed, extra keys."""
    rng = random.Random(seed)
    lines = []
    for i, d in enumerate(docs):
        obj = {"id": i, "text": d} if rng.random() < 0.5 else {"text": d, "meta": {"n": [i, None]}}
        lines.append(json.dumps(obj, ensure_ascii=rng.random() < 0.3).encode())
    ends = [rng.choice([b"\n", b"\r\n"]) for _ in lines]
    if not final_newline:
        ends[-1] = b""
    return b"".join(line + end for line, end in zip(lines, ends))


def _txt_bytes(docs: list[str], seed: int, final_newline: bool = True) -> bytes:
    rng = random.Random(seed)
    ends = [rng.choice(["\n", "\r\n"]) for _ in docs]
    if not final_newline:
        ends[-1] = ""
    return "".join(d + e for d, e in zip(docs, ends)).encode()


def _write(path, data: bytes) -> str:
    path = str(path)
    if path.endswith(".gz"):
        data = gzip.compress(data)
    elif path.endswith(".zst"):
        # Two frames: a reader that stops after the first frame would lose documents.
        half = len(data) // 2
        c = zstandard.ZstdCompressor()
        data = c.compress(data[:half]) + c.compress(data[half:])
    with open(path, "wb") as f:
        f.write(data)
    return path


def _write_parquet(path, docs: list[str], row_group_size: int) -> str:
    table = pa.table({"id": list(range(len(docs))), "text": docs})
    pq.write_table(table, str(path), row_group_size=row_group_size)
    return str(path)


def _units(paths, unit_bytes):
    """``plan_units`` of local files, in the order given."""
    return plan_units([Source.of_file(str(p)) for p in paths], unit_bytes)


def _read_all(paths, unit_bytes, keys=("text",), skip_bad=False, bad=None, batch_bytes=1 << 20):
    """Documents of every unit in order, checking the batch invariants on the way."""
    bad = BadRecords() if bad is None else bad
    out = {k: [] for k in keys}
    for unit in _units(paths, unit_bytes):
        done = 0
        batches = list(read_unit(unit, list(keys), skip_bad, bad, batch_bytes))
        assert batches, unit
        for b in batches:
            assert len({len(b.texts[k]) for k in keys}) == 1
            assert done <= b.bytes_done <= unit.size
            done = b.bytes_done
            for k in keys:
                out[k] += b.texts[k]
        assert done == unit.size, unit
    return out


def _expect_error(path, unit_bytes, message, keys=("text",)):
    with pytest.raises(InputError) as ei:
        _read_all([path], unit_bytes, keys)
    assert str(ei.value) == f"{path}:{message}"


# ---------------------------------------------------------------------------------------------
# Formats


def test_all_formats_give_the_same_documents(tmp_path):
    docs = _docs(1, 400, for_txt=True)
    jsonl = _jsonl_bytes(docs, 2)
    txt = _txt_bytes(docs, 3)
    paths = [_write(tmp_path / name, data) for name, data in [
        ("a.jsonl", jsonl), ("a.json", jsonl), ("a.jsonl.gz", jsonl), ("a.jsonl.zst", jsonl),
        ("a.json.gz", jsonl), ("a.txt", txt), ("a.txt.gz", txt), ("a.txt.zst", txt)]]
    paths.append(_write_parquet(tmp_path / "a.parquet", docs, row_group_size=37))
    assert pq.ParquetFile(paths[-1]).metadata.num_row_groups == 11
    for path in paths:
        for unit_bytes in (1000, 1 << 30):
            for batch_bytes in (100, 1 << 20):
                assert _read_all([path], unit_bytes, batch_bytes=batch_bytes)["text"] == docs, path


def test_jsonl_matches_megatron_reading(tmp_path):
    """Megatron's preprocess_data.py: text-mode UTF-8 file iteration and json.loads per line."""
    docs = _docs(4, 300)
    path = _write(tmp_path / "m.jsonl", _jsonl_bytes(docs, 5, final_newline=False))
    with open(path, encoding="utf-8") as f:
        oracle = [json.loads(line)["text"] for line in f]
    assert oracle == docs
    assert _read_all([path], 777)["text"] == oracle


@pytest.mark.parametrize("seed", range(4))
def test_units_partition_lines_exactly(tmp_path, seed):
    rng = random.Random(seed)
    docs = _docs(seed, rng.randint(1, 60))
    final_newline = seed % 2 == 0
    jsonl = _write(tmp_path / "r.jsonl", _jsonl_bytes(docs, seed, final_newline))
    txt_docs = _docs(seed + 100, len(docs), for_txt=True)
    if not final_newline and not txt_docs[-1]:
        txt_docs[-1] = "last"  # an empty last line without a newline is no line at all
    txt = _write(tmp_path / "r.txt", _txt_bytes(txt_docs, seed, final_newline))
    for unit_bytes in (1, 2, 3, 7, 13, 100, 257, 4096, 1 << 20):
        for batch_bytes in (1, 50, 1 << 20):
            assert _read_all([jsonl], unit_bytes, batch_bytes=batch_bytes)["text"] == docs
            assert _read_all([txt], unit_bytes, batch_bytes=batch_bytes)["text"] == txt_docs
        units = _units([jsonl], unit_bytes)
        assert sum(u.size for u in units) == os.path.getsize(jsonl)
        assert [u.start for u in units] == list(range(0, os.path.getsize(jsonl), unit_bytes))


def test_units_are_numbered_across_files(tmp_path):
    a = _write(tmp_path / "a.jsonl", _jsonl_bytes(_docs(6, 50), 6))
    b = _write(tmp_path / "b.jsonl.gz", _jsonl_bytes(_docs(7, 50), 7))
    c = _write_parquet(tmp_path / "c.parquet", _docs(8, 50), row_group_size=10)
    units = _units([a, b, c], 1000)
    assert [u.index for u in units] == list(range(len(units)))
    assert [(u.fmt, u.compression) for u in units if u.path == b] == [("jsonl", "gz")]
    meta = pq.read_metadata(c)
    sizes = [sum(rg.column(i).total_compressed_size for i in range(rg.num_columns))
             for rg in map(meta.row_group, range(meta.num_row_groups))]
    assert [(u.start, u.stop, u.size) for u in _units([c], 1)] == [(g, g + 1, sizes[g]) for g in range(5)]
    # Consecutive row groups are gathered until they reach unit_bytes; the last unit takes the rest.
    target, runs, first, acc = sizes[0] + sizes[1], [], 0, 0
    for g, size in enumerate(sizes):
        acc += size
        if acc >= target or g == len(sizes) - 1:
            runs.append((first, g + 1))
            first, acc = g + 1, 0
    assert len(runs) in (2, 3) and runs[0] == (0, 2)
    assert [(u.start, u.stop) for u in _units([c], target)] == runs
    assert [(u.start, u.stop) for u in _units([c], 1 << 30)] == [(0, 5)]
    assert _read_all([a, b, c], 1000)["text"] == _docs(6, 50) + _docs(7, 50) + _docs(8, 50)


def test_txt_line_endings(tmp_path):
    path = _write(tmp_path / "e.txt", b"a\r\nb\rc\n\nd\r\r\n\r\ne\r")
    assert _read_all([path], 3)["text"] == ["a", "b\rc", "", "d\r", "", "e\r"]


def test_txt_gives_every_key_the_same_line(tmp_path):
    path = _write(tmp_path / "k.txt", b"one\ntwo\n")
    assert _read_all([path], 100, keys=("text", "other")) == {"text": ["one", "two"], "other": ["one", "two"]}


def test_several_json_keys(tmp_path):
    lines = [{"text": "a", "title": "A"}, {"title": "B", "text": ""}, {"text": "c", "title": "C", "x": 1}]
    path = _write(tmp_path / "k.jsonl", "".join(json.dumps(x) + "\n" for x in lines).encode())
    assert _read_all([path], 5, keys=("text", "title")) == {"text": ["a", "", "c"], "title": ["A", "B", "C"]}


def test_batches_are_bounded(tmp_path):
    docs = ["x" * 50] * 200 + ["y" * 5000] + ["z" * 10] * 100
    path = _write(tmp_path / "b.txt", _txt_bytes(docs, 9))
    unit = _units([path], 1 << 30)[0]
    batches = list(read_unit(unit, ["text"], False, BadRecords(), batch_bytes=1000))
    assert [d for b in batches for d in b.texts["text"]] == docs
    assert max(sum(len(d) + 2 for d in b.texts["text"]) for b in batches) <= 1000 + 5002


def test_compressed_progress_counts_compressed_bytes(tmp_path):
    path = _write(tmp_path / "p.jsonl.gz", _jsonl_bytes(_docs(10, 3000), 10))
    unit = _units([path], 1)[0]
    assert (unit.start, unit.stop, unit.size) == (0, os.path.getsize(path), os.path.getsize(path))
    done = [b.bytes_done for b in read_unit(unit, ["text"], False, BadRecords(), batch_bytes=4096)]
    assert done == sorted(done) and done[-1] == unit.size and len(set(done)) > 2


# ---------------------------------------------------------------------------------------------
# Finding the inputs


def test_expand_inputs_natural_order_union_and_dedup(tmp_path):
    (tmp_path / "d" / "sub").mkdir(parents=True)
    (tmp_path / "d" / ".hidden").mkdir()
    names = ["d/shard_10.jsonl", "d/shard_2.jsonl", "d/shard_1.txt.zst", "d/sub/x_3.parquet",
             "d/README.md", "d/.tmp.jsonl", "d/.hidden/a.jsonl", "top_9.jsonl.gz", "top_10.jsonl"]
    for n in names:
        (tmp_path / n).write_bytes(b"")
    got = expand_inputs([str(tmp_path / "d"), str(tmp_path / "top_*.jsonl*"),
                         str(tmp_path / "d" / "shard_2.jsonl"), str(tmp_path / "d" / ".." / "d" / "shard_10.jsonl")])
    assert [s.path for s in got] == [str(tmp_path / n) for n in
                   ["d/shard_1.txt.zst", "d/shard_2.jsonl", "d/shard_10.jsonl", "d/sub/x_3.parquet",
                    "top_9.jsonl.gz", "top_10.jsonl"]]
    assert [s.path for s in expand_inputs([str(tmp_path / "**" / "x_*.parquet")])] == \
        [str(tmp_path / "d/sub/x_3.parquet")]


def test_expand_inputs_errors(tmp_path):
    (tmp_path / "empty").mkdir()
    (tmp_path / "notes.md").write_bytes(b"")
    (tmp_path / "a.parquet.gz").write_bytes(b"")
    supported = ".jsonl, .json, .txt (each optionally compressed as .gz or .zst), .parquet"
    cases = {
        str(tmp_path / "missing.jsonl"): f"{tmp_path}/missing.jsonl: no such file or directory",
        str(tmp_path / "*.csv"): f"{tmp_path}/*.csv: the pattern matches nothing",
        str(tmp_path / "empty"): f"{tmp_path}/empty: directory has no input files; supported: {supported}",
        str(tmp_path / "notes.md"): f"{tmp_path}/notes.md: unsupported input file type; supported: {supported}",
        str(tmp_path / "a.parquet.gz"):
            f"{tmp_path}/a.parquet.gz: unsupported input file type; supported: {supported}",
        str(tmp_path / "*.md"): f"{tmp_path}/notes.md (matched by '{tmp_path}/*.md'): "
                                f"unsupported input file type; supported: {supported}",
        str(tmp_path / "empt*"): f"{tmp_path}/empt*: the pattern matches no input files; supported: {supported}",
    }
    for pattern, message in cases.items():
        with pytest.raises(MegacacheError) as ei:
            expand_inputs([pattern])
        assert str(ei.value) == message


# ---------------------------------------------------------------------------------------------
# Bad input

_GOOD = '{"text": "fine"}'
_BAD_LINES = [
    ('{"text": "a" "b"}', "invalid JSON: Expecting ',' delimiter at column 14"),
    ('{"text": "a"', "invalid JSON: Expecting ',' delimiter at column 13"),
    ('{"text": "tab\there"}', "invalid JSON: Invalid control character at column 14"),
    ("[1, 2]", "expected a JSON object, got list"),
    ('"text"', "expected a JSON object, got str"),
    ('{"id": 1, "body": "x"}', "missing key 'text' (keys present: id, body)"),
    ("{}", "missing key 'text' (keys present: none)"),
    ('{"text": 5}', "value of 'text' is int, expected a string"),
    ('{"text": null}', "value of 'text' is null, expected a string"),
    ('{"text": ["a", "b"]}', "value of 'text' is list, expected a string"),
    ("", "blank line (every line must hold one JSON object)"),
    ("  \r", "blank line (every line must hold one JSON object)"),
]


@pytest.mark.parametrize("line,reason", _BAD_LINES)
def test_bad_json_line_is_located_in_the_whole_file(tmp_path, line, reason):
    lines = [_GOOD] * 30
    lines[22] = line
    path = _write(tmp_path / "bad.jsonl", ("\n".join(lines) + "\n").encode())
    for unit_bytes in (1, 64, 1 << 20):  # the bad line in a later unit, and in the only one
        _expect_error(path, unit_bytes, f"line 23: {reason}")
    gz = _write(tmp_path / "bad.jsonl.gz", ("\n".join(lines) + "\n").encode())
    _expect_error(gz, 1, f"line 23: {reason}")


def test_invalid_utf8(tmp_path):
    raw = [_GOOD.encode()] * 5 + [b'{"text": "ab\xff"}'] + [_GOOD.encode()] * 3
    path = _write(tmp_path / "u.jsonl", b"\r\n".join(raw))
    _expect_error(path, 40, "line 6: invalid UTF-8 at byte 13 of the line")
    txt = _write(tmp_path / "u.txt", b"ok\n\xe4\xb8\nfine\n")
    _expect_error(txt, 4, "line 2: invalid UTF-8 at byte 1 of the line")
    bad = BadRecords()
    assert _read_all([txt], 1, skip_bad=True, bad=bad)["text"] == ["ok", "fine"]
    assert bad.first == [f"{txt}:line 2: invalid UTF-8 at byte 1 of the line"]


def test_dot_json_hint(tmp_path):
    path = _write(tmp_path / "array.json", b'[\n{"text": "a"},\n{"text": "b"}\n]\n')
    _expect_error(path, 1 << 20, "line 1: invalid JSON: Expecting value at column 2 (a .json input is read "
                                 "as JSON lines, one object per line, as Megatron does)")


def test_empty_files(tmp_path):
    for name in ("e.jsonl", "e.txt", "e.jsonl.gz", "e.txt.zst"):
        path = _write(tmp_path / name, b"")
        _expect_error(path, 10, "line 1: empty file")
        bad = BadRecords()
        assert _read_all([path], 10, skip_bad=True, bad=bad)["text"] == []
        assert (bad.count, bad.first) == (1, [f"{path}:line 1: empty file"])
    path = str(tmp_path / "e.parquet")
    pq.write_table(pa.table({"text": pa.array([], pa.string())}), path)
    _expect_error(path, 10, "row 1: empty file")


def test_skip_bad_counts_and_keeps_first_locations(tmp_path):
    rng = random.Random(11)
    lines, expected, bad_at = [], [], []
    for i in range(400):
        if rng.random() < 0.08:
            line, reason = rng.choice(_BAD_LINES)
            bad_at.append(f"line {i + 1}: {reason}")
        else:
            line = json.dumps({"text": f"doc {i} é"})
            expected.append(f"doc {i} é")
        lines.append(line)
    path = _write(tmp_path / "s.jsonl", "\n".join(lines).encode())
    assert len(bad_at) > 20
    for unit_bytes in (1, 333, 1 << 20):
        bad = BadRecords()
        assert _read_all([path], unit_bytes, skip_bad=True, bad=bad)["text"] == expected
        assert bad.count == len(bad_at)
        assert bad.first == [f"{path}:{loc}" for loc in bad_at[:10]]
    # A skipped record is skipped for every key.
    path = _write(tmp_path / "m.jsonl", b'{"text": "a", "t": "A"}\n{"text": "b"}\n{"text": "c", "t": "C"}\n')
    bad = BadRecords()
    assert _read_all([path], 7, ("text", "t"), skip_bad=True, bad=bad) == {"text": ["a", "c"], "t": ["A", "C"]}
    assert bad.first == [f"{path}:line 2: missing key 't' (keys present: text)"]


def test_bad_records_merge():
    a, b = BadRecords(), BadRecords()
    for i in range(7):
        a.add("x", f"line {i}", "r")
        b.add("y", f"line {i}", "r")
    a.merge(b.count, b.first)
    assert a.count == 14 and a.first == [f"x:line {i}: r" for i in range(7)] + [f"y:line {i}: r" for i in range(3)]


def test_corrupt_compressed_input_is_never_skipped(tmp_path):
    good = gzip.compress(_jsonl_bytes(_docs(12, 2000), 12))
    path = tmp_path / "t.jsonl.gz"
    path.write_bytes(good[: len(good) // 2])
    with pytest.raises(InputError, match=r"t\.jsonl\.gz:line \d+: corrupt or truncated gz data: Compressed file "
                                         r"ended before the end-of-stream marker was reached"):
        _read_all([str(path)], 1, skip_bad=True)
    path = tmp_path / "n.txt.zst"
    path.write_bytes(b"plain text, not zstd\n")
    with pytest.raises(InputError, match=r"n\.txt\.zst:line 1: corrupt or truncated zst data: .*"):
        _read_all([str(path)], 1)


def test_parquet_errors_and_nulls(tmp_path):
    docs = ["a", None, "c", "d", None, "f", "g"]
    path = str(tmp_path / "n.parquet")
    pq.write_table(pa.table({"text": docs, "t2": ["A", "B", "C", None, "E", "F", "G"], "n": list(range(7))}),
                   path, row_group_size=3)
    _expect_error(path, 1, "row 2: value of 'text' is null, expected a string")
    bad = BadRecords()
    assert _read_all([path], 1, ("text", "t2"), skip_bad=True, bad=bad) == \
        {"text": ["a", "c", "f", "g"], "t2": ["A", "C", "F", "G"]}
    assert bad.first == [f"{path}:row 2: value of 'text' is null, expected a string",
                         f"{path}:row 4: value of 't2' is null, expected a string",
                         f"{path}:row 5: value of 'text' is null, expected a string"]
    with pytest.raises(MegacacheError) as ei:
        _read_all([path], 1, ("body",))
    assert str(ei.value) == f"{path}: no column 'body' (columns present: text, t2, n)"
    with pytest.raises(MegacacheError) as ei:
        _read_all([path], 1, ("n",))
    assert str(ei.value) == f"{path}: column 'n' has type int64, expected a string column"


def test_parquet_dictionary_and_large_string_columns(tmp_path):
    docs = _docs(13, 100)
    path = str(tmp_path / "d.parquet")
    pq.write_table(pa.table({"a": pa.array(docs).dictionary_encode(), "b": pa.array(docs, pa.large_string())}),
                   path, row_group_size=30)
    assert _read_all([path], 1, ("a", "b")) == {"a": docs, "b": docs}


def test_json_lines_follow_json_loads_exactly(tmp_path):
    """The fast parser must accept and reject exactly what json.loads accepts and rejects."""
    lines = [b'  {"text": "lead"}', b'{"text": "trail"} \t \r', b'\t{"a": 1, "text": "both"}\r',
             b'{"text": "ff"}\x0c', '\ufeff{"text": "bom"}'.encode(), b'{"text": "x", "text": "dup"}',
             b'{"text": "\\ud83d\\ude00 \\u00e9"}', b'{"text": "lone \\udc80"}', b'{"text": "a"} {"text": "b"}',
             b'{"text": "nan", "n": NaN}', '{"text": "raw\u2028sep"}'.encode()]
    path = _write(tmp_path / "w.jsonl", b"\n".join(lines))
    expected, errors = [], []
    for i, raw in enumerate(lines):
        try:
            expected.append(json.loads(raw.decode())["text"])
        except json.JSONDecodeError as e:
            errors.append(f"{path}:line {i + 1}: invalid JSON: {e.msg.removesuffix(' at')} at column {e.colno}")
    assert len(errors) == 3
    bad = BadRecords()
    assert _read_all([path], 1 << 20, skip_bad=True, bad=bad)["text"] == expected
    assert bad.first == errors


def test_lines_msgspec_refuses_or_reads_differently_get_json_loads_values(tmp_path):
    """Chunks are decoded by msgspec where it agrees with json.loads; the lines below are where it
    does not (or skips the line), and each must come out as json.loads has it, or be reported."""
    good = [
        '{"text": "a", "text": "last wins"}',         # duplicate key: both take the last
        '{"text": "lone \\ud800 surrogate"}',          # json.loads keeps it, msgspec refuses
        '{"text": "x", "n": NaN, "i": Infinity}',      # json.loads only
        '{"text": "big", "n": 123456789012345678901234567890}',
        '{"text": "\\u0000 nul and \\u00e9"}',
        '  {"text": "spaces around"}  \r',
        '{"text": "plain"}',
    ]
    path = _write(tmp_path / "m.jsonl", ("\n".join(good) + "\n").encode())
    assert _read_all([path], 1 << 20)["text"] == [json.loads(line)["text"] for line in good]
    for unit_bytes in (7, 50):
        assert _read_all([path], unit_bytes)["text"] == [json.loads(line)["text"] for line in good]
    # Keys that are not identifiers, two of them.
    rows = [{"my-key": f"v{i}", "other key": f"w{i}"} for i in range(5)]
    path = _write(tmp_path / "k.jsonl", "".join(json.dumps(r) + "\n" for r in rows).encode())
    got = _read_all([path], 1 << 20, keys=("my-key", "other key"))
    assert got == {"my-key": [r["my-key"] for r in rows], "other key": [r["other key"] for r in rows]}
    # A blank or whitespace-only line, which msgspec skips, is a bad line as json.loads has it.
    for blank in ("", "   ", "\t\r"):
        path = _write(tmp_path / "b.jsonl", f'{{"text": "a"}}\n{blank}\n{{"text": "b"}}\n'.encode())
        with pytest.raises(InputError) as ei:
            _read_all([path], 1 << 20)
        assert f"{path}:line 2: " in str(ei.value)
