"""Filesystem primitives: positional writes, fsync, and atomic publish.

Every output megacache produces is written where no reader looks, made durable and then put in
place in one step, so a reader (megacache or megatron-core) sees either nothing or the whole file:
under a temporary name and renamed (``publish``), or, for a build's files, held by a ``Staging``
(unnamed and linked in where the filesystem allows, else renamed).
"""

from __future__ import annotations

import ctypes
import errno
import json
import os
import resource
import shutil
import threading
import time
from contextlib import contextmanager
from typing import Any

import numpy as np

from ..errors import MegacacheError
from .environment import stale_s

TMP_MARK = ".megacache-tmp"
#: the end of a work directory's name (tokenize's finished units, kept for a rerun to resume from)
WORK_MARK = ".megacache-work"
#: what a path that is not there (any more) answers: ENOENT, or ESTALE where a network filesystem's
#: client still held a handle to what another node removed
GONE = (errno.ENOENT, errno.ESTALE)
#: the hidden directory megacache keeps beside its outputs (locks, rank records, the manifest)
STATE_DIR = ".megacache"
#: the start of the name of a job's progress directory in a state directory, for a job that holds
#: no lock (verify, convert); rank 0 touches it at each progress line
PROGRESS_MARK = "progress-"

try:
    # The interpreter's own symbols, libc's among them: ctypes.util.find_library runs ldconfig.
    _libc = ctypes.CDLL(None, use_errno=True)
    _libc.syncfs.argtypes = [ctypes.c_int]
    _libc.linkat.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_int]
except (OSError, AttributeError):  # not Linux/glibc: fall back to os.sync
    _libc = None


@contextmanager
def writing(path: str):
    """An OSError while writing ``path`` (no space, quota, file-size limit, permissions) as an error
    that names the file, instead of a bare errno."""
    try:
        yield
    except OSError as exc:
        raise MegacacheError(
            f"{path}: cannot write ({exc.strerror or exc}); make room for the output (disk space, quota, "
            f"file-size limit) in a writable directory and run again") from None


def tmp_path(path: str, tag: str) -> str:
    """A temporary sibling of ``path`` that no reader will mistake for the real file."""
    d, base = os.path.split(path)
    return os.path.join(d, f".{base}{TMP_MARK}-{tag}")


def _bytes(data: Any) -> memoryview:
    """Bytes or an array (made C-contiguous) as a flat byte view."""
    return memoryview(np.ascontiguousarray(data) if isinstance(data, np.ndarray) else data).cast("B")


def pwrite_all(fd: int, data: Any, offset: int) -> None:
    """Write all of ``data`` (bytes or a C-contiguous array) at ``offset``."""
    pwritev_all(fd, [_bytes(data)], offset)


def pwritev_all(fd: int, views: list[memoryview], offset: int) -> None:
    """Write the byte views end to end from ``offset``: one system call where the kernel takes
    them whole (pwritev may be short)."""
    views = [v for v in views if len(v)]
    while views:
        done = os.pwritev(fd, views, offset)
        offset += done
        while views and done >= len(views[0]):
            done -= len(views.pop(0))
        if done:
            views[0] = views[0][done:]


#: writes of at least this many bytes go through O_DIRECT where the filesystem takes it
DIRECT_MIN = 64 << 10
#: O_DIRECT's alignment of memory, file offsets and lengths (a page covers every block size in use)
DIRECT_ALIGN = 4096
#: bytes staged per O_DIRECT write
DIRECT_STAGE = 16 << 20
_staging = threading.local()


def aligned_empty(nbytes: int) -> np.ndarray:
    """``uint8[nbytes]`` starting at a ``DIRECT_ALIGN`` boundary: what a direct write takes as it is."""
    raw = np.empty(nbytes + DIRECT_ALIGN, dtype=np.uint8)
    start = -raw.ctypes.data % DIRECT_ALIGN
    return raw[start : start + nbytes]


def _stage() -> memoryview:
    """This thread's page-aligned staging buffer (reused: fresh memory would fault in every page)."""
    stage = getattr(_staging, "buffer", None)
    if stage is None:
        stage = _staging.buffer = aligned_empty(DIRECT_STAGE)
    return memoryview(stage)


def open_direct(path: str) -> int | None:
    """A second, O_DIRECT descriptor for writing ``path``, or None where the filesystem refuses it
    (or, for an unnamed file's ``/proc/self/fd`` path, where there is no /proc)."""
    if not hasattr(os, "O_DIRECT"):
        return None
    try:
        return os.open(path, os.O_WRONLY | os.O_DIRECT)
    except OSError as exc:
        if exc.errno == errno.EINVAL or (exc.errno == errno.ENOENT and path.startswith(_PROC_FD)):
            return None
        raise


def _spans(views: list[memoryview], a: int, b: int):
    """The bytes [a, b) of the views laid end to end, as slices of them."""
    base = 0
    for view in views:
        lo, hi = max(a, base), min(b, base + len(view))
        if lo < hi:
            yield view[lo - base : hi - base]
        base += len(view)


def pwrite_mostly_direct(fd: int, direct_fd: int | None, buffers: list, offset: int) -> None:
    """Write ``buffers`` (bytes or C-contiguous arrays) end to end from ``offset``, the whole aligned
    blocks inside the range through ``direct_fd`` (O_DIRECT, staged in an aligned buffer unless
    one buffer holds them at an aligned address already, as ``npy_image`` makes them). A
    buffered write costs a kernel copy into freshly allocated page-cache pages, several times a
    direct write's cost: the largest CPU cost of writing a cache. The partial blocks at either
    end stay buffered, so writers of adjacent ranges (other ranks) never overlap a direct write.
    Durability is still the caller's fsync."""
    views = [_bytes(p) for p in buffers]
    start, end = offset, offset + sum(map(len, views))
    first = min(-(-start // DIRECT_ALIGN) * DIRECT_ALIGN, end)
    last = max(end // DIRECT_ALIGN * DIRECT_ALIGN, first)
    if direct_fd is None or last - first < DIRECT_MIN:
        pwritev_all(fd, views, start)  # most of a blend's files: one call
        return

    def buffered(lo: int, hi: int) -> None:  # file positions [lo, hi) through ``fd``
        pwritev_all(fd, list(_spans(views, lo - start, hi - start)), lo)

    buffered(start, first)
    position = _write_in_place(direct_fd, views, start, first, last)
    stage = _stage() if position < last else None
    while position < last:
        n = min(len(stage), last - position)
        filled = 0
        for span in _spans(views, position - start, position - start + n):
            stage[filled : filled + len(span)] = span
            filled += len(span)
        try:
            done = 0
            while done < n:
                done += os.pwrite(direct_fd, stage[done:n], position + done)
        except OSError as exc:
            if exc.errno != errno.EINVAL:
                raise
            break  # the filesystem took the descriptor but not the write: the rest buffered
        position += n
    buffered(position, end)


def _write_in_place(direct_fd: int, views: list[memoryview], start: int, first: int, last: int) -> int:
    """Where one view holds the file's blocks ``[first, last)`` at an aligned address (an image
    made with ``aligned_empty``), write them straight from it, with no staging copy; returns the
    position written up to (``first`` where that is not so, or the filesystem refused)."""
    base = 0
    for view in views:
        lo, hi = first - start - base, last - start - base
        if 0 <= lo and hi <= len(view):
            whole = np.frombuffer(view, dtype=np.uint8)
            if (whole.ctypes.data + lo) % DIRECT_ALIGN:
                return first
            done = 0
            try:
                while done < hi - lo:
                    done += os.pwrite(direct_fd, view[lo + done : hi], first + done)
            except OSError as exc:
                if exc.errno != errno.EINVAL:
                    raise
            return first + done
        base += len(view)
    return first


def write_new_file(path: str, buffers: list) -> None:
    """Create (or truncate) ``path`` holding the concatenation of ``buffers`` (bytes or C-contiguous
    arrays), mostly through O_DIRECT (``pwrite_mostly_direct``)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o666)
    try:
        _write_whole(fd, path, buffers)
    finally:
        os.close(fd)


def _write_whole(fd: int, path: str, buffers: list) -> None:
    """``buffers`` end to end from the start of the empty file ``fd``, which ``path`` opens again for
    O_DIRECT."""
    views = [_bytes(p) for p in buffers]
    direct_fd = open_direct(path) if sum(map(len, views)) >= DIRECT_MIN else None
    try:
        pwrite_mostly_direct(fd, direct_fd, views, 0)
    finally:
        if direct_fd is not None:
            os.close(direct_fd)


def pread_into(fd: int, out: np.ndarray, offset: int) -> np.ndarray:
    """Fill ``out`` (C-contiguous) with the file's bytes from ``offset``: a read into private
    memory, so nothing of the file stays mapped (a memory map's touched pages count as the
    process's resident memory until it is unmapped)."""
    view = memoryview(out).cast("B")
    done = 0
    while done < len(view):
        n = os.preadv(fd, [view[done:]], offset + done)
        if n == 0:
            raise OSError(f"unexpected end of file reading {len(view)} bytes at offset {offset}")
        done += n
    return out


def read_ahead(path: str, offset: int = 0, length: int = 0) -> None:
    """Ask the kernel to start reading ``length`` bytes (0: to the end) of ``path`` into the page
    cache, and return at once: a pass that will need them next finds them there instead of waiting
    on each page as it faults. A file that cannot be opened is left for the pass to report."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.posix_fadvise(fd, offset, length, os.POSIX_FADV_WILLNEED)
    except OSError:
        pass  # advice only
    finally:
        os.close(fd)


def copy_range(src_fd: int, src_offset: int, dst_fd: int, dst_offset: int, count: int) -> None:
    """Copy bytes between files inside the kernel (no user-space buffer of the data)."""
    while count > 0:
        try:
            n = os.copy_file_range(src_fd, dst_fd, count, src_offset, dst_offset)
        except OSError:
            n = 0
        if n == 0:
            # Filesystems without copy_file_range, or an unexpected short copy: fall back to
            # bounded user-space chunks.
            n = min(count, 64 << 20)
            chunk = os.pread(src_fd, n, src_offset)
            if not chunk:
                raise OSError(f"unexpected end of file copying {count} bytes at offset {src_offset}")
            n = len(chunk)
            pwrite_all(dst_fd, chunk, dst_offset)
        src_offset += n
        dst_offset += n
        count -= n


def fsync_path(path: str) -> None:
    with writing(path):  # where a write failed (no space), fsync says so
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def fsync_dir(path: str) -> None:
    fsync_path(os.path.dirname(os.path.abspath(path)) or ".")


def publish(tmp: str, final: str) -> None:
    """fsync ``tmp`` and rename it over ``final`` atomically, then make the rename durable."""
    fsync_path(tmp)
    os.replace(tmp, final)
    fsync_dir(final)


def _syncfs(path: str) -> None:
    """Flush the filesystem holding ``path`` (one syncfs(2) instead of an fsync per file);
    where syncfs is unavailable, a global sync."""
    fd = os.open(path, os.O_RDONLY)
    try:
        if _libc is None:
            os.sync()
        elif _libc.syncfs(fd) != 0:
            error = ctypes.get_errno()
            if error != errno.ENOSYS:  # a write that failed (no space, I/O error) is reported
                with writing(path):
                    raise OSError(error, os.strerror(error), path)
            os.sync()
    finally:
        os.close(fd)


def sync_filesystems(paths) -> None:
    """Make everything this process wrote under ``paths`` (files or directories) durable: one
    syncfs per distinct directory, however many files."""
    for d in sorted({p if os.path.isdir(p) else os.path.dirname(os.path.abspath(p)) for p in paths}):
        _syncfs(d)


_PROC_FD = "/proc/self/fd/"
#: linkat(2): the file ``olddirfd`` refers to itself, where ``oldpath`` is empty
_AT_EMPTY_PATH = 0x1000
_AT_FDCWD = -100


def open_unnamed(directory: str) -> int | None:
    """A new, empty file in ``directory`` that has no name (O_TMPFILE, opened for writing): no
    reader can see it, and it vanishes with its last descriptor unless ``link_unnamed`` names it.
    None where the filesystem or the system has no such files."""
    if not hasattr(os, "O_TMPFILE"):
        return None
    try:
        return os.open(directory, os.O_TMPFILE | os.O_WRONLY, 0o666)
    except OSError as exc:
        if exc.errno in (errno.EOPNOTSUPP, errno.EISDIR, errno.EINVAL):
            return None
        raise


def link_unnamed(fd: int, path: str) -> None:
    """Name the unnamed file ``fd`` ``path`` (which must not exist): linkat(2) on the descriptor,
    which takes CAP_DAC_READ_SEARCH before Linux 6.10 (else ENOENT), then through ``/proc/self/fd``,
    the way any process may."""
    if _libc is not None:
        if _libc.linkat(fd, b"", _AT_FDCWD, os.fsencode(path), _AT_EMPTY_PATH) == 0:
            return
        err = ctypes.get_errno()
        if err not in (errno.ENOENT, errno.EPERM, errno.EINVAL):
            raise OSError(err, os.strerror(err), path)
    os.link(f"{_PROC_FD}{fd}", path, follow_symlinks=True)


def _descriptor_budget() -> int:
    """How many unnamed files a process may hold open: half its descriptor limit, less a margin
    for everything else it opens."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        soft = 1 << 20
    return max(0, soft // 2 - 256)


#: per filesystem (st_dev): whether this process can name unnamed files there
_linkable: dict[int, bool] = {}


def _can_link_unnamed(directory: str, tag: str) -> bool:
    """Whether files ``open_unnamed`` makes in ``directory`` can be named later (tried once per
    filesystem with one such file: the publish step must never find out too late)."""
    device = os.stat(directory).st_dev
    known = _linkable.get(device)
    if known is not None:
        return known
    fd = open_unnamed(directory)
    works = False
    if fd is not None:
        probe = tmp_path(os.path.join(directory, "probe"), f"{tag}-{os.getpid()}-{threading.get_ident()}")
        try:
            link_unnamed(fd, probe)
            works = True
        except OSError:
            pass
        finally:
            os.close(fd)
            remove_quietly(probe)
    _linkable[device] = works
    return works


class Staging:
    """New files held until ``publish`` puts them in place, invisible until then.

    ``write`` keeps a file unnamed (``open_unnamed``: no directory entry, linked in at publish; a
    killed process leaves nothing) where its filesystem allows and the process has descriptors to
    spare, else under its temporary name; ``path`` gives the temporary name of a file that
    others write into or memory-map. An unnamed file saves the temporary name's directory entry,
    created and then removed again by the rename: of a build's thousands of small files, that is
    a large share of their cost on ext4."""

    def __init__(self, tag: str, unnamed_limit: int | None = None):
        self.tag = tag
        self._lock = threading.Lock()
        self._unnamed: dict[str, int] = {}  # final path -> descriptor of its unnamed file
        self._named: dict[str, str] = {}    # final path -> temporary path
        self._spare = _descriptor_budget() if unnamed_limit is None else unnamed_limit
        self._directories: dict[str, bool] = {}

    def name(self, final: str) -> str:
        """``final``'s temporary name (``tmp_path`` with this staging's tag), the same on every rank."""
        return tmp_path(final, self.tag)

    def path(self, final: str) -> str:
        """The temporary name ``final`` waits under, held for ``publish``."""
        tmp = self.name(final)
        with self._lock:
            self._named[final] = tmp
        return tmp

    def write(self, final: str, buffers: list) -> None:
        """``final``'s whole content (bytes or C-contiguous arrays end to end), held until
        ``publish``. Safe from several threads."""
        fd = self._take_unnamed(os.path.dirname(final) or ".")
        with writing(final):
            if fd is None:
                write_new_file(self.path(final), buffers)
                return
            try:
                _write_whole(fd, f"{_PROC_FD}{fd}", buffers)
            except BaseException:
                os.close(fd)
                with self._lock:
                    self._spare += 1
                raise
        with self._lock:
            self._unnamed[final] = fd

    def _take_unnamed(self, directory: str) -> int | None:
        with self._lock:
            if self._spare <= 0:
                return None
            self._spare -= 1
        linkable = self._directories.get(directory)
        if linkable is None:
            linkable = self._directories[directory] = _can_link_unnamed(directory, self.tag)
        fd = open_unnamed(directory) if linkable else None
        if fd is None:
            with self._lock:
                self._spare += 1
        return fd

    def publish(self, finals) -> None:
        """These files into place, in this order, once durable (one syncfs per directory, not an
        fsync per file); then each directory synced. A file that exists already is replaced
        atomically."""
        finals = list(finals)
        directories = sorted({os.path.dirname(os.path.abspath(f)) for f in finals})
        sync_filesystems(directories)
        for final in finals:
            fd = self._unnamed.pop(final, None)
            if fd is None:
                os.replace(self._named.pop(final), final)
                continue
            try:
                try:
                    link_unnamed(fd, final)
                except FileExistsError:
                    tmp = self.name(final)
                    link_unnamed(fd, tmp)
                    os.replace(tmp, final)
            finally:
                os.close(fd)
                with self._lock:
                    self._spare += 1
        # On a journaling filesystem the link count rides in the directory's transaction; the
        # directory's fsync makes both durable.
        for d in directories:
            fsync_path(d)

    def discard(self) -> None:
        """Everything not yet published: unnamed files closed (so gone), temporary names removed."""
        with self._lock:
            fds, self._unnamed = list(self._unnamed.values()), {}
            tmps, self._named = list(self._named.values()), {}
            self._spare += len(fds)
        for fd in fds:
            os.close(fd)
        for tmp in tmps:
            remove_quietly(tmp)


def write_atomic(path: str, data: bytes, durable: bool = True) -> None:
    """``data`` at ``path``: a reader sees the old content or the new, never part of either.
    ``durable``: on disk before this returns (``publish``). A record that only describes a live
    process (its phase, its progress) needs the rename alone: each fsync waits behind the build's
    own writeback, and a crash makes such a record moot anyway."""
    tmp = tmp_path(path, str(os.getpid()))
    write_new_file(tmp, [data])
    if durable:
        publish(tmp, path)
    else:
        os.replace(tmp, path)


def write_json_atomic(path: str, obj: Any, durable: bool = True) -> None:
    write_atomic(path, json.dumps(obj, indent=1, sort_keys=True).encode(), durable)


def read_json(path: str) -> Any:
    with open(path, "rb") as f:
        return json.loads(f.read())


def read_mapping(path: str, what: str, expected: str, language: str = "JSON") -> dict:
    """The one mapping a configuration file written in ``language`` (JSON or YAML) holds; else an
    error naming ``what`` (a flag, or the kind of file) and ``path``; ``expected`` says what the
    mapping should be ("expected a JSON object with keys ...")."""
    where = f"{what} {path}"
    invalid = "not YAML" if language == "YAML" else "not valid JSON"
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError as exc:
        raise MegacacheError(f"{where}: cannot read it ({exc.strerror})") from None
    except UnicodeDecodeError as exc:
        raise MegacacheError(f"{where}: {invalid} ({exc})") from None
    if language == "YAML":
        import yaml

        # libyaml's parser where PyYAML was built with it: the same safe constructor, and many
        # times faster on the large configurations Megatron-Bridge saves
        loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
        try:
            data = yaml.load(text, Loader=loader)
        except yaml.YAMLError as exc:
            raise MegacacheError(f"{where}: {invalid} ({' '.join(str(exc).split())})") from None
    else:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise MegacacheError(f"{where}: line {exc.lineno}: {invalid} ({exc.msg})") from None
    if not isinstance(data, dict):
        raise MegacacheError(f"{where}: {expected}, got {type(data).__name__}")
    return data


def remove_tree(path: str, tag: str) -> None:
    """Delete a directory, renamed away first: a job killed while deleting never leaves a half
    directory under the old name (whose leftovers a rerun would trust)."""
    trash = tmp_path(path, tag)
    os.rename(path, trash)
    shutil.rmtree(trash, ignore_errors=True)


def gone(exc: OSError) -> bool:
    """Whether ``exc`` says its path is not there (any more). A path on a shared filesystem is
    acted on and this asked of the error, never tested first: another node may remove or create it
    between the test and the act, and a client's cached entry can still show what the server no
    longer has."""
    return exc.errno in GONE


def names(directory: str) -> list[str]:
    """``directory``'s entries, read once; none where it is gone (removed by another node, perhaps
    since this client last saw it)."""
    try:
        return os.listdir(directory)
    except OSError as exc:
        if gone(exc):
            return []
        raise


def make_directories(path: str) -> None:
    """``path`` and its missing parents made, as ``os.makedirs(path, exist_ok=True)``, for paths that
    another node may make or remove meanwhile: an EEXIST is taken as the directory being there,
    with no stat after it (a client's cached entry can answer EEXIST for a directory that its next
    stat says is gone, or the reverse). For a while after another node removed or replaced a
    directory on the path, a client that still holds its old entry answers ESTALE, or ENOENT inside
    a parent that answered EEXIST: both are asked again for up to the stale time (unless a parent
    is a link to nothing, which no wait mends). What is not a directory fails the next step inside
    it."""
    deadline = time.monotonic() + stale_s()
    delay = 0.05
    while True:
        try:
            _make_directories(path)
            return
        except OSError as exc:
            if not gone(exc) or time.monotonic() > deadline or _dangling_parent(path):
                raise
        time.sleep(delay)
        delay = min(2 * delay, 1.0)


def _dangling_parent(path: str) -> bool:
    """Whether a directory above ``path`` is a symbolic link to nothing."""
    parent = os.path.dirname(os.path.abspath(path))
    while parent != os.path.dirname(parent):
        if os.path.islink(parent) and not os.path.exists(parent):
            return True
        parent = os.path.dirname(parent)
    return False


def _make_directories(path: str) -> None:
    try:
        os.mkdir(path)
    except FileExistsError:
        return
    except FileNotFoundError:
        parent = os.path.dirname(os.path.abspath(path))
        if parent == os.path.abspath(path):
            raise
        _make_directories(parent)
        try:
            os.mkdir(path)
        except FileExistsError:
            pass


def remove_quietly(path: str) -> None:
    try:
        os.unlink(path)
    except NotADirectoryError:
        pass
    except OSError as exc:
        if not gone(exc):
            raise
