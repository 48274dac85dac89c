"""runtime.progress on one rank, its lines read as a log and as a terminal shows them: nothing before
an interval has passed (short work stays quiet), each phase under way with done/total, rate and ETA,
overlapping phases on one line, and a last line with every phase done only after one was shown. The
command-line tests with several ranks are tests/system/test_progress.py."""

from __future__ import annotations

import io
import os
import pty
import re
import time

from megacache.runtime.comm import SingleComm
from megacache.runtime.progress import BYTES, Progress


def test_work_shorter_than_the_interval_prints_nothing():
    log = io.StringIO()
    with Progress(SingleComm(), None, "build", interval_s=5, stream=log) as progress:
        progress.phase("document index", 1000, "documents")
        progress.add("document index", 1000)
    assert log.getvalue() == ""


def test_lines_name_the_phases_under_way_and_the_last_has_them_done():
    log = io.StringIO()
    with Progress(SingleComm(), None, "build", interval_s=1.0, stream=log) as progress:
        progress.phase("document index", 3_000_000, "documents")
        progress.phase("shuffle index", 2_000, "samples")
        progress.phase("publish", 3, "entries")
        progress.add("document index", 500_000)
        progress.add("shuffle index", 500)
        time.sleep(0.2)
        progress.add("document index", 500_000)
        time.sleep(1.3)  # past the first line
        progress.add("document index", 2_000_000)
        progress.add("shuffle index", 1_500)
        progress.add("publish", 3)
    lines = log.getvalue().splitlines()
    assert len(lines) == 2, lines
    first, last = lines
    # a rate once a phase's second chunk is counted (the first one's start is not known), an ETA from it
    assert re.fullmatch(r"build: document index 33\.3%: 1\.00M/3\.00M documents, [\d.]+[kM] documents/s, ETA \d+s; "
                        r"shuffle index 25\.0%: 500/2\.00k samples, 0 samples/s, ETA \? \| 1s elapsed", first), first
    assert re.fullmatch(r"build: document index 100\.0%: 3\.00M/3\.00M documents, [\d.]+M documents/s, ETA 0s; "
                        r"shuffle index 100\.0%: 2\.00k/2\.00k samples, [\d.]+k? samples/s, ETA 0s; "
                        r"publish 100\.0%: 3/3 entries, [\d.]+ entries/s, ETA 0s \| 1s elapsed", last), last


def test_bytes_and_further_counters():
    log = io.StringIO()
    with Progress(SingleComm(), None, "tokenize", interval_s=0.3, stream=log) as progress:
        progress.phase("tokenizing", 4_000_000, BYTES, ("docs", "tokens"))
        progress.add("tokenizing", 1_500_000, docs=1_000, tokens=500_000)
        time.sleep(0.05)
        progress.add("tokenizing", 1_000_000, docs=234, tokens=67_000)
        time.sleep(0.4)
    first = log.getvalue().splitlines()[0]
    assert re.fullmatch(r"tokenize: tokenizing 62\.5%: 2\.5 MB/4\.0 MB, 1\.23k docs, 567\.00k tokens, [\d.]+ MB/s, "
                        r"ETA \d+s \| 0s elapsed", first), first


def test_a_terminal_gets_a_bar_redrawn_in_place():
    main, tty = pty.openpty()
    with os.fdopen(tty, "w") as stream:
        with Progress(SingleComm(), None, "merge", stream=stream) as progress:  # a terminal's default interval
            progress.phase("writing", 400, "tokens")
            progress.add("writing", 50)
            progress.add("writing", 50)
            time.sleep(0.8)
            progress.add("writing", 300)
    shown = b""
    while True:  # until the terminal, its writer gone, has nothing more
        try:
            chunk = os.read(main, 1 << 16)
        except OSError:
            break
        if not chunk:
            break
        shown += chunk
    os.close(main)
    shown = shown.decode()
    assert shown.startswith("\r[######------------------] merge: writing 25.0%: 100/400 tokens, "), repr(shown)
    assert "\r[########################] merge: writing 100.0%: 400/400 tokens, " in shown, repr(shown)
    assert shown.endswith("\r\n") and shown.count("\n") == 1, repr(shown)  # the terminal's own \r\n
