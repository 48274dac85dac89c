"""Stand-ins for the GPU-only packages Megatron-Bridge imports unconditionally, installed by
tests/bridge_oracle.sh into the Bridge oracle's interpreter (a ``.pth`` line imports this module).

Only ``transformer_engine`` needs one: Bridge's PEFT layers import ``transformer_engine.pytorch`` at
module level, and the configuration classes import those layers, so nothing of Bridge imports
without it. Transformer Engine builds against CUDA and has no CPU wheel. The stand-in is an empty
package whose every attribute is an inert class; it is served only to importers inside
``megatron.bridge``, so megatron-core's own ``try: import transformer_engine`` still fails and
megatron-core keeps its non-TE code paths. The data path (configuration, tokenizer,
BlendedMegatronDatasetBuilder, GPTDataset, BlendedDataset) never touches Transformer Engine.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import types

#: top-level packages that get a stand-in
NAMES = ("transformer_engine",)
#: importers that get it
IMPORTERS = ("megatron.bridge",)


class _Inert(type):
    """A class that is every attribute of itself, callable, subscriptable, and false."""

    def __getattr__(cls, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _inert(f"{cls.__name__}.{name}")

    def __call__(cls, *args, **kwargs):
        return cls

    def __getitem__(cls, item):
        return cls

    def __bool__(cls):
        return False


def _inert(name: str) -> type:
    return _Inert(name, (), {})


class _StandInModule(types.ModuleType):
    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        value = _inert(f"{self.__name__}.{name}")
        setattr(self, name, value)
        return value


def _importer() -> str:
    """The module whose import statement is being run."""
    frame = sys._getframe(1)
    while frame is not None:
        name = frame.f_globals.get("__name__", "")
        if not (name.startswith(("importlib", "_frozen_importlib")) or name == __name__):
            return name
        frame = frame.f_back
    return ""


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname, path=None, target=None):
        if fullname.split(".")[0] in NAMES and _importer().startswith(IMPORTERS):
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        module = _StandInModule(spec.name)
        module.__path__ = []
        module.__version__ = "0.0.0"
        module.__megacache_standin__ = True
        return module

    def exec_module(self, module):
        pass


if not any(isinstance(f, _Finder) for f in sys.meta_path):
    sys.meta_path.insert(0, _Finder())
