"""Exceptions that reach the user. Their messages say what is wrong, where, and what to do."""

from __future__ import annotations


class MegacacheError(Exception):
    """A problem with the user's input or configuration: printed without a traceback."""


class InputError(MegacacheError):
    """A bad input record, located by file and line (or row)."""

    def __init__(self, path: str, where: str, reason: str):
        self.path, self.where, self.reason = path, where, reason
        super().__init__(f"{path}:{where}: {reason}")


class FormatError(MegacacheError):
    """A malformed dataset or cache file."""


class CacheNotBuilt(MegacacheError):
    """An entry a configuration needs is not in the cache directory."""


class CacheDamaged(MegacacheError):
    """An entry a configuration needs is there, but its files are not what it must hold."""


class _PhaseFailures:
    """Ranks that failed in a phase, each with its message, said once per distinct message."""

    def __init__(self, phase: str, failures: list[tuple[int, str]]):
        self.phase, self.failures = phase, failures
        lines = [f"{len(failures)} rank(s) failed during {phase}:"]
        seen = set()
        for rank, message in failures:
            # Several ranks often report the same problem; say it once.
            if message in seen:
                lines.append(f"  rank {rank}: (same as above)")
            else:
                seen.add(message)
                lines.append(f"  rank {rank}: {message}")
        super().__init__("\n".join(lines))


class JobFailed(_PhaseFailures, MegacacheError):
    """One or more ranks failed in a phase on the input, the configuration or the system (a
    ``MegacacheError``, an ``OSError``); every rank raises this together."""


class JobCrashed(_PhaseFailures, RuntimeError):
    """One or more ranks hit an unexpected error (a bug) in a phase; every rank raises this together,
    the failed ranks' tracebacks in its message. Not a ``MegacacheError``: a bug is never reported
    as the user's mistake."""


def is_bug(error: BaseException) -> bool:
    """Whether an exception is megacache's own fault rather than the input's or the system's."""
    return not isinstance(error, (MegacacheError, OSError))
