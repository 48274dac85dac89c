"""The size and modification time of many files of one directory: what a build's reuse check
compares with the manifest for every file of every entry there (tens of thousands in a blend of a
thousand datasets). A kernel makes one Linux ``statx`` call per file and builds no Python object:
``os.stat`` spends longer on its result object than the system call takes. ``file_states_reference``
is the same through ``os.stat`` (the tests hold the kernel to it)."""

from __future__ import annotations

import os

import numpy as np

from .kernels import intrinsic, kernel

#: statx's request: the size and the modification time (STATX_SIZE | STATX_MTIME)
_WANTED = 0x200 | 0x40


@intrinsic
def _statx(typingctx, directory_fd, name_address, buffer_address):
    """``statx(directory_fd, name, 0, _WANTED, buffer)`` for a NUL-terminated name at an address,
    following a symbolic link as ``os.stat`` does; 0 where it succeeded."""
    from llvmlite import ir
    from numba import types
    from numba.core import cgutils

    def codegen(context, builder, sig, args):
        i8p, i32 = ir.IntType(8).as_pointer(), ir.IntType(32)
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(i32, [i32, i8p, i32, i32, i8p]), "statx")
        return builder.call(fn, [builder.trunc(args[0], i32), builder.inttoptr(args[1], i8p), ir.Constant(i32, 0),
                                 ir.Constant(i32, _WANTED), builder.inttoptr(args[2], i8p)])

    return types.int32(types.int64, types.int64, types.int64), codegen


@kernel("int64, readonly(uint8[::1]), int64[::1], int64[::1], int64[::1]")
def _stat_names(directory_fd, names, starts, sizes, mtimes):  # pragma: no cover - compiled
    # struct statx has one layout on every architecture: stx_size in bytes 40-47, stx_mtime's
    # seconds in 112-119 and nanoseconds (32 bits) in 120-123
    buffer = np.zeros(32, np.int64)
    words = buffer.view(np.uint32)
    for i in range(len(starts)):
        if _statx(directory_fd, names.ctypes.data + starts[i], buffer.ctypes.data) == 0:
            sizes[i] = buffer[5]
            mtimes[i] = buffer[14] * 1_000_000_000 + np.int64(words[30])
        else:
            sizes[i] = -1
            mtimes[i] = -1


def file_states(directory_fd: int, names: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """Each name's size and ``st_mtime_ns`` in the directory open as ``directory_fd``; -1 for both
    where it cannot be stat'ed (gone, no permission)."""
    sizes = np.empty(len(names), np.int64)
    mtimes = np.empty(len(names), np.int64)
    if names:
        encoded = np.frombuffer(os.fsencode("\0".join(names) + "\0"), np.uint8)
        starts = np.zeros(len(names), np.int64)
        starts[1:] = np.flatnonzero(encoded == 0)[:-1] + 1
        _stat_names(directory_fd, encoded, starts, sizes, mtimes)
    return sizes, mtimes


def directory_states(directory: str, names: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """``file_states`` of names in ``directory``, opened for the call (an OSError where it cannot
    be: gone, not a directory)."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        return file_states(fd, names)
    finally:
        os.close(fd)


def file_states_reference(directory_fd: int, names: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """``file_states`` through ``os.stat``."""
    states = []
    for name in names:
        try:
            st = os.stat(name, dir_fd=directory_fd)
            states.append((st.st_size, st.st_mtime_ns))
        except OSError:
            states.append((-1, -1))
    sizes, mtimes = np.array(states, np.int64).reshape(-1, 2).T
    return np.ascontiguousarray(sizes), np.ascontiguousarray(mtimes)
