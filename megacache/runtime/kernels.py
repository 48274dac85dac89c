"""How megacache's kernels run. Each is written once, in numba's Python subset, and runs either

* from a native library compiled ahead of time for this machine's CPU (``megacache kernels``, or
  ``compile_library``, in parts by as many processes as there are cores): importing it loads its
  parts and needs no numba; or
* where there is none, or for argument types it was not compiled for, through numba's JIT, whose
  import and first kernel load are most of a small build's start on every rank (docs/benchmarks.md).

Both are the same numba code lowered by the same LLVM without fast-math; the test suite runs every
kernel both ways and compares the arrays bit for bit. A call runs natively only when the types of
its arguments equal one of the kernel's declared signatures exactly (dtype, dimensions, layout,
writability, alignment); any other call goes to the JIT, which compiles what it is given.

The library is named by a digest of the kernel modules' sources, this file, the CPU (vendor,
family, model, flags), numpy's major version and the interpreter's ABI, so a changed kernel, another
CPU or another Python never loads a stale or foreign one. It lives in ``$MEGACACHE_KERNEL_DIR``, by
default ``$XDG_CACHE_HOME/megacache/kernels`` (``~/.cache/megacache/kernels``);
``MEGACACHE_KERNEL_DIR=jit`` runs every kernel through the JIT.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import importlib.util
import os
import platform
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
import types
import warnings

import numpy as np

from .environment import kernel_dir, usable_cores
from ..errors import MegacacheError

#: every module that declares kernels: compiled into the library, and hashed into its name
MODULES = (
    "megacache.algorithms.blend_kernels",
    "megacache.algorithms.gpt_index",
    "megacache.algorithms.packing",
    "megacache.algorithms.permutation",
    "megacache.algorithms.verification",
    "megacache.formats.pickled_pairs",
    "megacache.formats.sft_packed",
    "megacache.runtime.file_states",
)
_PREFIX = "megacache_kernels_"

_lock = threading.RLock()
_declared: dict[str, list] = {}  # module name -> its Kernel and Intrinsic objects
_library: list = []  # [the native module or None], once looked for
_jit_globals: dict[str, dict] = {}  # module name -> the globals its functions compile with


class Intrinsic:
    """A numba ``@intrinsic`` (a few lines of LLVM IR), defined only when the JIT or the compiler
    loads. Its function imports what it needs from numba and llvmlite inside its body."""

    def __init__(self, fn):
        self.fn = fn
        _declared.setdefault(fn.__module__, []).append(self)

    def numba_object(self):
        from numba.extending import intrinsic

        return intrinsic(self.fn)


class Kernel:
    """A numba function: callable from Python (natively where the library has the call's
    signature), and from other kernels of its module (inlined when ``inline=True``)."""

    def __init__(self, fn, signatures: tuple[str, ...], options: dict):
        self.py_func = fn
        self.signatures = signatures
        self.options = options
        self.__name__, self.__qualname__, self.__doc__ = fn.__name__, fn.__qualname__, fn.__doc__
        self.__module__ = fn.__module__
        self._calls: dict[tuple, object] = {}  # argument types -> what runs them
        self._dispatcher = None
        _declared.setdefault(fn.__module__, []).append(self)

    def __repr__(self) -> str:
        return f"<kernel {self.__module__}.{self.__qualname__}>"

    def __call__(self, *args):
        key = tuple(map(_value_type, args))
        run = self._calls.get(key)
        if run is None:
            run = self._resolve(key)
        return run(*args)

    def _resolve(self, key: tuple):
        with _lock:
            library = native_library()
            run = getattr(library, export_name(self, key), None) if library is not None else None
            if run is None:
                run = self.dispatcher()
            self._calls[key] = run
            return run

    def compiled_keys(self) -> dict:
        """The declared signatures: call key -> numba argument types (imports numba)."""
        return {tuple(map(numba_type_key, args)): args for args in map(_argument_types, self.signatures)}

    def dispatcher(self):
        """The numba JIT dispatcher of this kernel (imports numba)."""
        with _lock:
            if self._dispatcher is None:
                self._dispatcher = _jit_module(self.__module__)[self.__name__]
            return self._dispatcher


def kernel(*signatures: str, inline: bool = False):
    """Declare a kernel. ``signatures`` (numba's argument-type strings, e.g.
    ``"int32[::1], int64"``) are the types the native library is compiled for; a helper that
    only other kernels call declares none. Kernels touch no Python object, so every one releases
    the GIL while it runs (the build runs them on several threads at once)."""
    options = {"cache": True, "nogil": True}
    if inline:
        options["inline"] = "always"

    def declare(fn):
        return Kernel(fn, signatures, options)

    return declare


def intrinsic(fn) -> Intrinsic:
    return Intrinsic(fn)


def _prefetch(write: int):
    """A call of ``llvm.prefetch`` for the cache line at an int64 address (kept in every cache
    level); it never faults, so any address will do."""
    from llvmlite import ir
    from numba import types
    from numba.core import cgutils

    def codegen(context, builder, sig, args):
        i8p, i32 = ir.IntType(8).as_pointer(), ir.IntType(32)
        fnty = ir.FunctionType(ir.VoidType(), [i8p, i32, i32, i32])
        fn = cgutils.get_or_insert_function(builder.module, fnty, "llvm.prefetch.p0")
        builder.call(fn, [builder.inttoptr(args[0], i8p), ir.Constant(i32, write), ir.Constant(i32, 3),
                          ir.Constant(i32, 1)])
        return context.get_dummy_value()

    return types.void(types.int64), codegen


@intrinsic
def prefetch_read(typingctx, address):
    """Ask for the cache line at ``address`` for reading (a gather's element, ahead of its load)."""
    return _prefetch(0)


@intrinsic
def prefetch_write(typingctx, address):
    """Ask for the cache line at ``address`` for writing (a swap's element, ahead of the swap)."""
    return _prefetch(1)


# ------------------------------------------------------------------------------------------------
# argument types: the same key from a Python value (at each call) and from a numba type (when
# compiling), so that a call meets the export compiled for it

_ARRAY_FLAGS = ("C_CONTIGUOUS", "F_CONTIGUOUS", "WRITEABLE", "ALIGNED")


def _value_type(value) -> tuple | str:
    kind = type(value)
    name = _TYPE_NAMES.get(kind)
    if name is not None:
        return name
    if isinstance(value, np.ndarray):
        flags = value.flags
        layout = "C" if flags.c_contiguous else "F" if flags.f_contiguous else "A"
        return value.dtype.str, value.ndim, layout, flags.writeable, flags.aligned
    if isinstance(value, int) and not isinstance(value, bool):
        return "int64" if -(1 << 63) <= value < (1 << 63) else "uint64"
    name = _TYPE_NAMES[kind] = _type_name(value)
    return name


#: what ``_type_name`` said of each type seen (numpy's ``dtype.name`` costs microseconds a call)
_TYPE_NAMES: dict[type, str] = {}


def _type_name(value) -> str:
    """The name of a value whose type alone decides it (not an array, not a Python int)."""
    if isinstance(value, bool | np.bool_):
        return "bool"
    if isinstance(value, np.integer | np.floating):
        return value.dtype.name
    if isinstance(value, float):
        return "float64"
    return type(value).__qualname__  # never exported: the JIT decides what it means


def numba_type_key(t) -> tuple | str:
    """``_value_type`` of any value numba types as ``t``."""
    from numba import types as nt
    from numba.np.numpy_support import as_dtype

    if isinstance(t, nt.Array):
        return as_dtype(t.dtype).str, t.ndim, t.layout, t.mutable, t.aligned
    if isinstance(t, nt.Boolean):
        return "bool"
    return str(t)


def _argument_types(text: str) -> tuple:
    """numba's argument-type string (``"int32[::1], int64"``), where ``readonly(T)`` is the
    array type T of a read-only array (a memory map opened for reading, bytes) and
    ``unaligned(T)`` that of an array whose elements sit off their alignment (the sequence lengths
    of a memory-mapped ``.idx``, 34 bytes into the file)."""
    from numba.core import types as nt

    parsed = eval(text, {**vars(nt), "readonly": lambda t: t.copy(readonly=True),  # noqa: S307 (our own strings)
                         "unaligned": lambda t: nt.Array(t.dtype, t.ndim, t.layout, readonly=not t.mutable,
                                                         aligned=False)})
    return parsed if isinstance(parsed, tuple) else (parsed,)


def export_name(k: Kernel, key: tuple) -> str:
    digest = hashlib.sha1(repr((k.__module__, k.__qualname__, key)).encode()).hexdigest()[:16]
    return f"{k.__name__.lstrip('_')}_{digest}"


# ------------------------------------------------------------------------------------------------
# the JIT


def _jit_module(name: str) -> dict:
    """The globals the module's kernels compile with: its own, with every Kernel and Intrinsic
    replaced by numba's object, so that kernels call (and inline) each other as numba functions.
    Intrinsics may come from another module (``prefetch_read``); kernels call only their own
    module's. The module itself is left as it is."""
    with _lock:
        g = _jit_globals.get(name)
        if g is None:
            import numba

            module = sys.modules[name]
            g = dict(vars(module))
            for key, value in vars(module).items():
                if isinstance(value, Intrinsic):
                    g[key] = value.numba_object()
            for obj in _declared.get(name, ()):
                if isinstance(obj, Kernel):
                    fn = obj.py_func
                    clone = types.FunctionType(fn.__code__, g, fn.__name__, fn.__defaults__, fn.__closure__)
                    clone.__qualname__, clone.__doc__ = fn.__qualname__, fn.__doc__
                    g[fn.__name__] = numba.njit(**obj.options)(clone)
            _jit_globals[name] = g
        return g


# ------------------------------------------------------------------------------------------------
# the native library


def _cpu() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            first = f.read(1 << 16).split("\n\n", 1)[0]
        wanted = ("vendor_id", "cpu family", "model", "flags", "Features", "CPU implementer", "CPU part")
        return "\n".join(line for line in first.splitlines() if line.split(":")[0].strip() in wanted)
    except OSError:
        return f"{platform.machine()} {platform.processor()}"


def _digest() -> str:
    h = hashlib.sha256()
    for name in (__name__, *MODULES):
        with open(importlib.util.find_spec(name).origin, "rb") as f:
            h.update(f.read())
    h.update(f"{_cpu()}\n{np.__version__.split('.')[0]}\n{sys.implementation.cache_tag}".encode())
    return h.hexdigest()[:20]


def library_path(directory: str, part: int = 0) -> str:
    """The library's file in ``directory``: its first part, published last, under the plain name;
    part i > 0 (of a library compiled by several processes) under that name with ``_i``."""
    stem = _PREFIX + _digest() + (f"_{part}" if part else "")
    return os.path.join(directory, stem + sysconfig.get_config_var("EXT_SUFFIX"))


def native_library():
    """The native library for this machine, imported, or None (none compiled, or the JIT asked for)."""
    with _lock:
        if not _library:
            _library.append(_import_library())
        return _library[0]


def compiled_library() -> str | None:
    """The path of this machine's library where it is compiled already; None where it is not yet,
    or under ``MEGACACHE_KERNEL_DIR=jit``."""
    directory = kernel_dir()
    if directory is None:
        return None
    path = library_path(directory)
    # Published by rename and never removed by megacache: once seen, it stays loadable.
    return path if os.path.isfile(path) else None


def _import_library():
    """The library's exports, from its parts (all published before the first one's name appears)."""
    path = compiled_library()
    if path is None:
        return None
    exports = {}
    part = 0
    while os.path.isfile(path):
        name = os.path.basename(path).split(".", 1)[0]
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        exports.update((key, value) for key, value in vars(module).items() if not key.startswith("_"))
        part += 1
        path = library_path(os.path.dirname(path), part)
    return types.SimpleNamespace(**exports)


def jit_calls() -> list[tuple[Kernel, tuple]]:
    """The kernels, with their call keys, that this process has run through the JIT."""
    with _lock:
        return [(obj, key) for objs in _declared.values() for obj in objs if isinstance(obj, Kernel)
                for key, run in obj._calls.items() if run is obj._dispatcher]


def forget_library() -> None:
    """Look for the library again at the next call (after compiling one, or changing
    ``MEGACACHE_KERNEL_DIR``)."""
    with _lock:
        _library.clear()
        for objs in _declared.values():
            for obj in objs:
                if isinstance(obj, Kernel):
                    obj._calls.clear()


@contextlib.contextmanager
def _releasing_the_gil():
    """pycc compiles every export with one set of flags, made inside it, that has no way to say
    what the JIT's ``nogil=True`` says; while it compiles, the flags it makes release the GIL."""
    import numba.pycc.compiler as pycc
    from numba.core.compiler import Flags

    class Releasing(Flags):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.release_gil = True

    pycc.Flags = Releasing
    try:
        yield
    finally:
        pycc.Flags = Flags


def compile_library(directory: str | None = None) -> str:
    """Compile every kernel's declared signatures for this CPU into the library (a C compiler is
    needed to link it) and publish it atomically in ``directory`` (default ``kernel_dir()``).
    Returns its path. The exports are shared among as many processes as there are cores (each
    compiles and links a part; LLVM compiles a part on one core). Running it again, or on many
    ranks at once, is harmless."""
    from . import fsio

    directory = directory or kernel_dir()
    if directory is None:
        raise MegacacheError("MEGACACHE_KERNEL_DIR=jit: there is no kernel directory to compile into; unset it or name one")
    try:
        os.makedirs(directory, exist_ok=True)
    except OSError as exc:
        raise MegacacheError(f"{directory}: cannot create the kernel directory ({exc.strerror}); "
                             f"set MEGACACHE_KERNEL_DIR to a writable directory") from None
    _pycc()  # a clear error before any process starts
    parts = max(1, min(usable_cores(), _MAX_PARTS))
    with tempfile.TemporaryDirectory(prefix=".megacache-kernels-", dir=directory) as work:
        # New interpreters, not forks: they start without this process's threads, locks or MPI. They
        # import this megacache, whichever the path would find.
        top = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, (top, os.environ.get("PYTHONPATH"))))}
        others = []
        for part in range(1, parts):
            with open(os.path.join(work, f"part-{part}.err"), "w") as err:
                others.append(subprocess.Popen([sys.executable, "-c", _COMPILE_PART, work, str(part), str(parts)],
                                               stdout=subprocess.DEVNULL, stderr=err, env=env))
        try:
            built = [_compile_part(work, 0, parts)]
        except BaseException as exc:  # an interrupt too: the others go with this one
            for other in others:
                other.kill()
                other.wait()
            if not isinstance(exc, Exception):
                raise
            raise _compile_failed(f"{type(exc).__name__}: {exc}") from None
        for part, other in enumerate(others, 1):
            if other.wait():
                with open(os.path.join(work, f"part-{part}.err")) as err:
                    lines = err.read().strip().splitlines()
                raise _compile_failed(lines[-1] if lines else f"a compiling process ended with status {other.returncode}")
            built.append(library_path(work, part))
        # the first part last: its name is what says the library is there
        for part in reversed(range(parts)):
            final = library_path(directory, part)
            tmp = fsio.tmp_path(final, f"{os.getpid()}-{time.monotonic_ns()}")
            os.replace(built[part], tmp)
            fsio.publish(tmp, final)
    forget_library()
    return final


#: the most processes one compile uses (each a share of the exports)
_MAX_PARTS = 8
#: what each of the other processes runs: ``_compile_part(work, part, parts)``
_COMPILE_PART = "import sys; from megacache.runtime.kernels import _compile_part; " \
                "_compile_part(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]))"


def _compile_failed(reason: str) -> MegacacheError:
    return MegacacheError(f"compiling megacache's kernels failed ({reason}); it needs a C compiler (cc) and "
                          "Python's headers. Builds still run, through numba's JIT")


def _pycc():
    """numba's ahead-of-time compiler, ``numba.pycc.CC``; its notice that it will be replaced one
    day is not the user's business."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            from numba.pycc import CC
        except ImportError as exc:
            raise MegacacheError(f"this numba cannot compile ahead of time (numba.pycc: {exc}); builds still "
                                 "run, through numba's JIT") from None
    return CC


def _compile_part(work: str, part: int, parts: int) -> str:
    """Compile every ``parts``-th export, from the ``part``-th, into a library in ``work``; returns
    its path."""
    for name in MODULES:
        importlib.import_module(name)
    path = library_path(work, part)
    cc = _pycc()(os.path.basename(path).split(".", 1)[0])
    cc.target_cpu = "host"
    cc.verbose = False
    cc.output_dir = work
    exports = [(obj, key, args) for module in MODULES for obj in _declared.get(module, ())
               if isinstance(obj, Kernel) for key, args in obj.compiled_keys().items()]
    for obj, key, args in exports[part::parts]:
        d = obj.dispatcher()
        d.compile(args)
        cc.export(export_name(obj, key), d.overloads[args].signature)(d.py_func)
    with warnings.catch_warnings(), _releasing_the_gil():
        warnings.simplefilter("ignore")
        cc.compile()
    return path
