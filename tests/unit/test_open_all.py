"""``open_all``: dataset opens on the calling thread while they are fast, on threads once the
first few show that each waits on the filesystem; results in order either way, errors raised."""

import threading
import time

import pytest

from megacache.builders.gpt import PROBE_OPENS, SLOW_OPEN_S, open_all
from megacache.errors import MegacacheError


def _opener(delay: float, threads: list):
    def fn(x):
        threads.append(threading.current_thread())
        if delay:
            time.sleep(delay)
        return x * x
    return fn


def test_fast_opens_stay_on_the_calling_thread():
    threads: list = []
    items = list(range(200))
    assert open_all(_opener(0.0, threads), items) == [x * x for x in items]
    assert set(threads) == {threading.current_thread()}


def test_slow_opens_go_to_threads_after_the_probe():
    threads: list = []
    items = list(range(3 * PROBE_OPENS))
    assert open_all(_opener(4 * SLOW_OPEN_S, threads), items) == [x * x for x in items]
    here = threading.current_thread()
    assert threads[:PROBE_OPENS] == [here] * PROBE_OPENS
    assert here not in threads[PROBE_OPENS:] and len(set(threads[PROBE_OPENS:])) > 1


def test_fewer_items_than_the_probe_and_none():
    threads: list = []
    assert open_all(_opener(4 * SLOW_OPEN_S, threads), [3, 1, 2]) == [9, 1, 4]
    assert open_all(_opener(0.0, threads), []) == []


@pytest.mark.parametrize("delay", [0.0, 4 * SLOW_OPEN_S])
def test_an_error_is_raised_on_either_path(delay):
    def fn(x):
        if delay:
            time.sleep(delay)
        if x == 2 * PROBE_OPENS:
            raise MegacacheError(f"dataset {x}: truncated")
        return x

    with pytest.raises(MegacacheError, match=f"dataset {2 * PROBE_OPENS}: truncated"):
        open_all(fn, range(3 * PROBE_OPENS))
