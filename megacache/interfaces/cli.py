"""megacache: Megatron's dataset files and index caches, byte for byte as megatron-core makes them,
built by every rank of a job instead of by rank 0 alone while the GPUs wait.

Every subcommand runs the same under mpiexec -n P, srun, or as one process; rank 0 prints. Flags
are spelled in full, as Megatron-LM's parser wants them: an abbreviation is refused.

Exit status: 0 success; 2 bad input or configuration (the message names the flag, file or field);
1 an unexpected failure (a bug: the traceback is printed); 3 (tokenize only) the output is complete
and exact, but the fast tokenizer backend disagreed with its reference on some unit, which was redone.
A command whose output reader goes away (| head -1) stops there, quietly, with status 141 (128 +
SIGPIPE, as a shell reports any tool that a closed pipe ends): not 0, since a verify cut short has
not checked everything. On SIGTERM or SIGINT a job releases its lock, says where it was and what it
leaves, and ends by that signal (a shell reports 143 or 130, mpiexec 15 or 2): nothing partial is
published, and a rerun resumes. What a stopped or failed job leaves, a rerun or `megacache clean DIR`
removes.

"""

from __future__ import annotations

import argparse
import gc
import os
import re
import select
import shlex
import signal
import sys
import textwrap
import traceback

from ..runtime.comm import Comm, get_comm
from ..runtime.preemption import stoppable
from ..runtime.startup import hide_torch_from_transformers, load_kernels, single_threaded_blas
from ..errors import JobCrashed, MegacacheError, is_bug
from ..megatron.flags import add_flags, number_at_least

_SIZE_SUFFIX = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def byte_size(text: str) -> int:
    """``65536``, ``64M``, ``1G`` (binary multiples)."""
    m = re.fullmatch(r"\s*(\d+)\s*([KMGT]?)i?B?\s*", text, re.IGNORECASE)
    if not m:
        raise argparse.ArgumentTypeError(f"{text!r} is not a size such as 65536, 64M or 1G")
    size = int(m.group(1)) * _SIZE_SUFFIX[m.group(2).upper()]
    if not size:
        raise argparse.ArgumentTypeError(f"{text!r}: give a size of at least 1 byte")
    return size


def nonempty(text: str) -> str:
    """A path or name: '' is an error (else it would read as the flag not given, or as the current
    directory)."""
    if not text:
        raise argparse.ArgumentTypeError("give a non-empty value")
    return text


#: argparse types of counts and amounts: a bad one is an error naming its flag when it is parsed
positive = number_at_least(int, 1)
count = number_at_least(int, 0)
amount = number_at_least(float, 0)


#: the Megatron-LM tokenizer flags tokenize reads, defined once with build's (same meaning and checks)
_TOKENIZE_FLAGS = ("--tokenizer-type", "--tokenizer-model", "--vocab-file", "--merge-file", "--vocab-size",
                   "--tokenizer-special-tokens", "--tiktoken-pattern", "--tiktoken-num-special-tokens")


def _add_tokenizer_args(p: argparse.ArgumentParser) -> None:
    from ..megatron.tokenizer import SUPPORTED_TYPES, TOKENIZER_FLAGS

    g = p.add_argument_group("tokenizer", f"Megatron-LM's flags mean here what they mean to build and to training; "
                                          f"--tokenizer-type is one of {', '.join(SUPPORTED_TYPES)}")
    g.add_argument("--tokenizer", metavar="SPEC",
                   help="a tokenizer.json or a directory holding one, a BERT vocab.txt, a directory with GPT-2 "
                        "vocab.json + merges.txt, or 'byte' (embedded: raw UTF-8 bytes, ids 0..255, EOD 256); "
                        "with --tokenizer-type, it stands in for the file flags not given. One of --tokenizer "
                        "and --tokenizer-type is required")
    add_flags(g, [f for f in TOKENIZER_FLAGS if f.names[0] in _TOKENIZE_FLAGS], defaults=True)
    g.add_argument("--eod-id", type=count, help="end-of-document id, overriding the tokenizer's own")


#: ``tokenize``'s exit status when the output is complete and exact but the fast backend disagreed
#: with its reference on some unit (redone with the reference): worth a report, not a rerun.
EXIT_BACKEND_DISAGREED = 3


def _cmd_tokenize(args: argparse.Namespace, comm: Comm) -> int:
    from ..builders.tokenize import TokenizeConfig, summary, tokenize

    cfg = TokenizeConfig(
        inputs=args.input, output_prefix=args.output_prefix, json_keys=args.json_keys,
        append_eod=args.append_eod, tokenizer=args.tokenizer, tokenizer_type=args.tokenizer_type,
        tokenizer_model=args.tokenizer_model, vocab_file=args.vocab_file, merge_file=args.merge_file,
        vocab_size=args.vocab_size, special_tokens=args.tokenizer_special_tokens,
        tiktoken_pattern=args.tiktoken_pattern, tiktoken_num_special_tokens=args.tiktoken_num_special_tokens,
        eod_id=args.eod_id, skip_bad=args.skip_bad, unit_bytes=args.unit_bytes, threads=args.threads,
        progress_interval_s=args.progress_interval, backend=args.tokenizer_backend,
        verify_fraction=args.verify_fraction, strict_backend=args.strict_backend,
        output_format=args.output_format, overwrite=args.overwrite,
    )
    result = tokenize(cfg, comm)
    if comm.rank == 0:
        print(summary(result), flush=True)
    return EXIT_BACKEND_DISAGREED if result.disagreements else 0


def _copy_summary(verb: str, r) -> str:
    from ..formats.paths import DS, MEGATRON, OLMO, format_of

    kind = format_of(r.output)
    megatron = kind == MEGATRON
    files = ".bin/.idx" if megatron else ""
    where = (f"{r.output}{files}" if len(r.outputs) == 1 else
             f"{len(r.outputs)} {'datasets' if '*' in r.output else 'parts'} {r.outputs[0]}{files} ... "
             f"{r.outputs[-1]}{files}")
    sequences = f"{r.sequences:,} sequences, " if megatron else ""
    line = (f"megacache {verb}: {r.inputs} dataset(s) -> {where}: {r.documents:,} documents, {sequences}"
            f"{r.tokens:,} tokens in {r.seconds:.1f} s on {r.ranks} rank(s)")
    if r.joined:
        one = "a .ds" if kind == DS else "an OLMo" if kind == OLMO else "a .pbin"
        line += (f"\n  {r.joined:,} document(s) held several sequences (Megatron sentence splits); {one} document "
                 "is one run of tokens, so each became one")
    if r.loss_masks:
        line += (f"\n  {r.loss_masks} input(s) had a .ds.loss mask, not carried (no output format holds one): "
                 + ("--drop-loss-mask: the tokens were written without it, masked ones too" if r.loss_masks_dropped
                    else "it masked no token, so nothing was lost"))
    if r.unterminated:
        line += (f"\n  {r.unterminated} input(s) end with tokens after their last EOS: each such tail became a "
                 "document without EOS (a wrong --dtype or --eos-id also looks like this)")
    return line


def _cmd_merge(args: argparse.Namespace, comm: Comm) -> None:
    from ..builders.merge import merge

    if not args.prefixes and args.input_list is None:
        raise MegacacheError("merge: give the datasets to merge, or --input-list FILE")
    r = merge(args.prefixes, args.output_prefix, comm, chunk_bytes=args.chunk_bytes,
              drop_loss_mask=args.drop_loss_mask, input_list=args.input_list, dtype=args.dtype,
              max_size=args.max_size, progress_interval_s=args.progress_interval)
    if comm.rank == 0:
        print(_copy_summary("merge", r), flush=True)


def _cmd_convert(args: argparse.Namespace, comm: Comm) -> None:
    from ..builders.merge import convert

    if not args.sources and args.input_list is None:
        raise MegacacheError("convert: give the datasets to convert, or --input-list FILE")
    r = convert(args.sources, args.destination, comm, vocab_size=args.vocab_size, chunk_bytes=args.chunk_bytes,
                drop_loss_mask=args.drop_loss_mask, input_list=args.input_list, max_size=args.max_size,
                eos_id=args.eos_id, dtype=args.dtype, per_file=args.per_file, progress_interval_s=args.progress_interval)
    if comm.rank == 0:
        print(_copy_summary("convert", r), flush=True)


def _cmd_build(args: argparse.Namespace, comm: Comm) -> None:
    # A build makes tens of thousands of short-lived objects and no garbage cycles worth collecting,
    # and its imports (numba's above all) a large object graph that lives as long as the process:
    # collecting while they load walks the growing graph again and again in each rank's start, and
    # full collections during the build would walk it over and over.
    enabled = gc.isenabled()
    gc.disable()
    try:
        _build(args, comm)
    finally:
        if enabled:
            gc.enable()


def _build(args: argparse.Namespace, comm: Comm) -> None:
    from ..runtime.environment import kernel_dir

    compiled = load_kernels()
    from ..builders.build import build

    cfg = build_config(args, comm)
    if args.json and not args.dry_run:
        raise MegacacheError("--json goes with --dry-run (a build prints a summary)")
    if args.verbose and args.training_flags and comm.rank == 0:
        print("megacache build: training flags accepted, which change nothing in the caches: "
              + " ".join(shlex.join(words) for words in args.training_flags), file=sys.stderr, flush=True)
    if args.dry_run:
        _dry_run(cfg, comm, args.verbose, args.json)
        return
    if not compiled and comm.rank == 0 and kernel_dir() is not None:
        print(f"megacache build: note: no kernels compiled for this CPU in {kernel_dir()}, so every rank "
              "loads numba's JIT (about 0.35 s of CPU each); `megacache kernels` compiles them once",
              file=sys.stderr, flush=True)
    result = build(cfg, comm)
    if comm.rank != 0:
        return
    prefixes = result.prefixes
    print(f"megacache build: {result.headline()}", flush=True)
    detailed = args.verbose or len(prefixes) <= 8
    for prefix in prefixes if detailed else []:
        jobs = [j for j in result.gpt if j.data_path == prefix]
        print(f"{prefix}: cache {jobs[0].entry.directory}", flush=True)
        for j in jobs:
            print(j.summary, flush=True)
            if args.verbose:
                print(j.entry.description, flush=True)
    if result.blends:  # a section of its own: the blends draw on all the datasets above
        print(f"blends: cache {result.blends[0].entry.directory}", flush=True)
    for b in result.blends:
        print(b.summary, flush=True)
        if args.verbose:
            print(b.entry.description, flush=True)
    if result.sequences_path:
        print(f"  Megatron's --per-dataset-sequences-path file: {result.sequences_path}", flush=True)
    print("  phases: " + ", ".join(f"{k} {v:.3f} s" for k, v in result.phases.items()), flush=True)


def build_config(args: argparse.Namespace, comm: Comm):
    """The ``BuildConfig`` of ``megacache build``'s parsed arguments (``build_parser``): from a
    Megatron-Bridge configuration, or from the Megatron-LM training command."""
    from dataclasses import replace

    cfg = _bridge_config(args, comm) if args.bridge_config else _megatron_lm_config(args, comm)
    return replace(cfg, progress_interval_s=args.progress_interval)


def _megatron_lm_config(args: argparse.Namespace, comm: Comm):
    """The build of a Megatron-LM training run's flags."""
    from ..builders.build import BuildConfig
    from ..builders.config import MEGATRON_FLAGS

    flags = {name: getattr(args, name) for name in MEGATRON_FLAGS if hasattr(args, name)}
    identity = _identity_given(args)

    def report(kind: str, text: str) -> None:
        print(f"megacache build: {kind}: {text}", file=sys.stderr, flush=True)

    from ..megatron.command import training_words, yaml_flags

    if args.yaml_cfg:
        ignored = [f"--{k.replace('_', '-')}" for k, v in flags.items() if v not in (None, False)]
        ignored += [words[0] for words in args.training_flags]
        if ignored and comm.rank == 0:
            report("warning", f"with --yaml-cfg, training reads its arguments from {args.yaml_cfg} alone and "
                              f"ignores {', '.join(ignored)}; so does this build")
        flags, others, warnings = yaml_flags(args.yaml_cfg, _version_of(args), MEGATRON_FLAGS,
                                             args.prepare_cache_world_size)
        for text in warnings if comm.rank == 0 else ():
            report("warning", text)
        args.training_flags = [[key] for key in others]

    command = training_words(args.words, _version_of(args), args.own_flags) if args.megatron_python else None
    return BuildConfig.from_megatron_flags(
        flags, args.megatron_version, args.megatron_python, args.prepare_cache_world_size, comm, report, command,
        **({} if identity is None else {"tokenizer": identity}), rebuild_stale=args.rebuild_stale,
        rebuild_damaged=not args.no_rebuild,
        add_extra_token=not args.no_add_extra_token_to_sequence,
        drop_last_partial_validation=not args.no_drop_last_partial_validation_sequence)


def _identity_given(args: argparse.Namespace) -> dict | None:
    """The tokenizer identity given as such (--tokenizer-identifiers, --tokenizer-from-description)."""
    from ..megatron.tokenizer import identifiers_from_description, identifiers_from_json

    if args.tokenizer_identifiers and args.tokenizer_from_description:
        raise MegacacheError("give the tokenizer identity once: --tokenizer-identifiers or "
                             "--tokenizer-from-description, not both")
    if args.tokenizer_identifiers:
        return identifiers_from_json(args.tokenizer_identifiers)
    if args.tokenizer_from_description:
        return identifiers_from_description(args.tokenizer_from_description)
    return None


#: build's own flags that describe a Megatron-LM run beside its flags, which a Bridge configuration
#: describes instead
_RUN_SETTINGS = ("no_add_extra_token_to_sequence", "no_drop_last_partial_validation_sequence", "tokenizer_identifiers",
                 "tokenizer_from_description", "megatron_python", "prepare_cache_world_size", "yaml_cfg")


def _bridge_config(args: argparse.Namespace, comm: Comm):
    """The build of a Megatron-Bridge ConfigContainer (its YAML): everything from the file."""
    from ..builders.build import BuildConfig
    from ..builders.config import MEGATRON_FLAGS, check_datasets

    given = [f"--{name.replace('_', '-')}" for name in MEGATRON_FLAGS + _RUN_SETTINGS
             if getattr(args, name, None) not in (None, False)]
    given += [words[0] for words in args.training_flags]
    if given:
        raise MegacacheError(f"--bridge-config {args.bridge_config} describes the run (data, sizes, tokenizer, cache "
                             f"path); leave out {', '.join(given)}")
    cfg = comm.on_root(lambda: BuildConfig.from_bridge(args.bridge_config, args.megatron_version,
                                                       rebuild_stale=args.rebuild_stale,
                                                       rebuild_damaged=not args.no_rebuild),
                       f"reading {args.bridge_config}")
    check_datasets(cfg.blend, cfg.blend_per_split, comm)
    return cfg


def _dry_run(cfg, comm: Comm, verbose: bool, as_json: bool) -> None:
    """Every entry the build would write, its files and their state; nothing written, no lock."""
    import json

    from ..builders.blend import BlendTask
    from ..builders.build import inventory

    planned, states, others = inventory(cfg, comm)
    if comm.rank != 0:
        return
    if as_json:
        entries = []
        for s in states:
            e = s.item.entry
            record = {"state": s.state, "class": e.class_name, "split": e.split_name, "md5": e.hash,
                      "samples": s.samples, "requested": _requested(e), "directory": e.directory,
                      "files": {w: {"path": e.path(w), "present": p} for w, p in zip(e.names, s.present)}}
            if s.problems:
                record["problems"] = s.problems
            if s.damage:
                record["damage"] = s.damage
            if s.near:
                record["nearest_built"] = s.near
            if verbose:
                record["description"] = e.description
            entries.append(record)
        print(json.dumps({"megatron_version": planned.megatron_version, "entries": entries,
                          "also_written": others}, indent=1), flush=True)
        return
    counts = {}
    for s in states:
        counts[s.state] = counts.get(s.state, 0) + 1
    print(f"megacache build --dry-run: {len(states)} cache entries for megatron-core {planned.megatron_version} ("
          + ", ".join(f"{n} {state}" for state, n in counts.items()) + "); nothing written", flush=True)
    for s in states:
        e = s.item.entry
        source = (f"blend of {len(s.item.children)} datasets" if isinstance(s.item, BlendTask)
                  else s.item.data_path)
        requested = _requested(e)
        asked = (" (one epoch)" if requested is None else "" if requested == s.samples else
                 f" ({requested:,} asked)")
        print(f"{s.state:<8} {e.split_name:<5} {e.class_name:<14} {s.samples:>14,} samples{asked}  "
              f"{os.path.join(e.directory, e.stem)}-*  {source}", flush=True)
        for problem in s.problems + s.damage:
            print(f"         {problem}", flush=True)
        if s.near:
            print(f"         nearest built entry: {s.near}", flush=True)
        if verbose:
            for what, present in zip(e.names, s.present):
                print(f"         {'present' if present else 'absent '}  {e.path(what)}", flush=True)
            print(_indent(e.description, 9), flush=True)
    for path in others:
        print(f"also written: {path}", flush=True)


def _requested(entry) -> int | None:
    """The samples an entry's description asks for (None: one epoch)."""
    return entry.identifiers.get("num_samples", entry.identifiers.get("size"))


def _indent(text: str, spaces: int) -> str:
    return "\n".join(" " * spaces + line for line in text.split("\n"))


def _cmd_pack(args: argparse.Namespace, comm: Comm) -> None:
    import time

    from ..builders.sft_packing import pack_bridge, packed_states, read_config

    started = time.perf_counter()
    cfg = read_config(args.bridge_config, comm)
    if args.dry_run:
        states = packed_states(cfg, comm)
        if comm.rank == 0:
            for s in states:
                state = "present" if s.state == "present" else "to write"
                print(f"{state:<9}{s.split.name:<11}{s.split.output_path}"
                      + ("  (Bridge finds it and packs nothing)" if s.state == "present" else ""), flush=True)
            if any(s.state == "missing" for s in states):
                print(f"{'appended':<9}{'metadata':<11}{cfg.metadata_path}", flush=True)
            print("megacache pack --dry-run: nothing written", flush=True)
        return
    outcomes = pack_bridge(cfg, comm)
    if comm.rank != 0:
        return
    for o in outcomes:
        if o.state == "present":
            print(f"{o.split.name}: {o.split.output_path} is there already, left as it is (as Bridge leaves it)",
                  flush=True)
        else:
            m = o.metadata
            print(f"{o.split.name}: {o.split.output_path}: packing factor {m['packing_factor']}, efficiency "
                  f"{m['packing_efficiency']}%", flush=True)
    written = sum(o.state == "written" for o in outcomes)
    print(f"megacache pack: {written} packed file(s) written, metadata {cfg.metadata_path}, in "
          f"{time.perf_counter() - started:.1f} s on {comm.size} rank(s)", flush=True)


def _cmd_verify(args: argparse.Namespace, comm: Comm) -> None:
    import time

    from ..megatron.versions import resolve
    from ..readers.verify import verify_paths

    _check_olmo_flags(args, "verify")
    version = resolve(args.megatron_version)  # on every rank, so all agree on a bad version
    started = time.perf_counter()

    def show(v) -> None:
        if v.problems:
            print("\n".join([f"FAIL {v.name}", *(f"  {p}" for p in v.problems)]), flush=True)
        else:
            print(f"ok   {v.summary}", flush=True)

    verdicts = verify_paths(args.paths, version, comm, vocab_size=args.vocab_size, dtype=args.dtype,
                            eos_id=args.eos_id, progress_interval_s=args.progress_interval,
                            report=show if comm.rank == 0 else None)
    failed = [v.name for v in verdicts if v.problems]
    if failed:
        shown = ", ".join(failed[:5]) + (f" and {len(failed) - 5} more" if len(failed) > 5 else "")
        raise MegacacheError(f"{len(failed)} of {len(verdicts)} dataset(s) or cache entries failed verification: "
                             f"{shown}")
    if comm.rank == 0:
        print(f"megacache verify: all {len(verdicts)} dataset(s) and cache entries passed in "
              f"{time.perf_counter() - started:.1f} s on {comm.size} rank(s)", flush=True)


def _check_olmo_flags(args: argparse.Namespace, verb: str) -> None:
    """--eos-id and --dtype describe OLMo token files: given for none, they are a mistake, not ignored."""
    from ..formats.olmo import is_olmo

    if (args.eos_id is not None or args.dtype is not None) and not any(is_olmo(p) for p in args.paths):
        raise MegacacheError(f"{verb}: --eos-id and --dtype are for OLMo token files (.npy), and none of the "
                             "paths is one")


def _cmd_inspect(args: argparse.Namespace, comm: Comm) -> None:
    from ..readers.inspection import inspect_path
    from ..megatron.versions import resolve

    _check_olmo_flags(args, "inspect")

    version = resolve(args.megatron_version)  # on every rank, so all agree on a bad version
    failure = None
    if comm.rank == 0:
        problems = 0
        try:
            for path in args.paths:
                report = inspect_path(path, version, eos_id=args.eos_id, dtype=args.dtype)
                print(report.text, flush=True)
                problems += len(report.problems)
            if problems:
                failure = f"{problems} problem(s) found"
        except MegacacheError as exc:
            failure = str(exc)
    # Only rank 0 reads; the others learn the outcome so every rank exits alike.
    failure = comm.bcast(failure)
    if failure:
        raise MegacacheError(failure)


def _cmd_clean(args: argparse.Namespace, comm: Comm) -> None:
    from ..runtime.coordination import clean

    for directory in args.directories:
        if not os.path.isdir(directory):
            raise MegacacheError(f"{directory}: not a directory: give the directory a job wrote to (a cache "
                                 f"directory, or the directory of an output prefix); nothing was removed")

    def each() -> list[str]:
        lines = []
        for directory in args.directories:
            removed = clean(directory)
            lines += [f"megacache clean: {directory}: {report}" for report in removed.reports]
            lines.append(f"megacache clean: {directory}: removed {removed.describe()}" if removed else
                         f"megacache clean: {directory}: nothing left by megacache jobs")
        return lines

    lines = comm.on_root(each, "cleaning")
    if comm.rank == 0:
        print("\n".join(lines), flush=True)


def _cmd_sample_corpus(args: argparse.Namespace, comm: Comm) -> None:
    from ..text.sample_corpus import write_sample_corpus

    if comm.rank == 0:
        paths = write_sample_corpus(args.output_dir, files=args.files, documents_per_file=args.documents,
                                    seed=args.seed)
        print(f"megacache sample-corpus: wrote {len(paths)} file(s) to {args.output_dir}", flush=True)
    comm.barrier()


def _cmd_kernels(args: argparse.Namespace, comm: Comm) -> None:
    import time

    from ..runtime.kernels import compile_library, compiled_library

    start = time.perf_counter()

    def compiled() -> tuple[bool, str]:
        path = compiled_library()
        return (False, path) if path is not None else (True, compile_library())

    made, path = comm.on_root(compiled, "kernels")
    if comm.rank == 0:
        print(f"megacache kernels: compiled for this CPU in {time.perf_counter() - start:.0f} s: {path}"
              if made else f"megacache kernels: already compiled for this CPU and this megacache: {path}", flush=True)


def _add_version_arg(p: argparse.ArgumentParser) -> None:
    from ..megatron.versions import NEWEST, listing

    p.add_argument("--megatron-version", metavar="X.Y",
                   help=f"the megatron-core whose caches to reproduce: {listing()} (default: the installed "
                        f"megatron-core's version, else {NEWEST})")


class _Help(argparse.HelpFormatter):
    """argparse's help wrapped to the terminal: a description's paragraphs filled one by one, each
    indented line (a table's row) under its own second column; a flag shown by its first long
    spelling (the others named in its help) and its value by the last word of its name, or N for
    a count, so that no line outgrows the width."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        out = []
        for paragraph in text.strip().split("\n\n"):
            lines, prose = [], []
            for line in paragraph.splitlines() + [""]:
                row = re.match(r"\s+\S+\s+", line)
                if row is None and line:
                    prose.append(line)
                    continue
                if prose:
                    lines.append(textwrap.fill(" ".join(" ".join(prose).split()), width, initial_indent=indent,
                                               subsequent_indent=indent))
                    prose = []
                if row is not None:
                    lines.append(textwrap.fill(line, width, initial_indent=indent,
                                               subsequent_indent=indent + " " * row.end()))
            out.append("\n".join(lines))
        return "\n\n".join(out)

    def _format_action_invocation(self, action: argparse.Action) -> str:
        if len(action.option_strings) > 1 and action.nargs == 0:
            shown = [o for o in action.option_strings if not o.startswith("--")] + [_first_long(action)]
            return ", ".join(shown)
        if len(action.option_strings) > 1:
            return f"{_first_long(action)} {self._format_args(action, self._get_default_metavar_for_optional(action))}"
        return super()._format_action_invocation(action)

    def _get_help_string(self, action: argparse.Action) -> str:
        others = [o for o in action.option_strings if o.startswith("--") and o != _first_long(action)]
        text = action.help or ""
        return f"{text} (also {', '.join(others)})".lstrip() if others else text

    def _get_default_metavar_for_optional(self, action: argparse.Action) -> str:
        return value_name(action)


def _first_long(action: argparse.Action) -> str:
    return next(o for o in action.option_strings if o.startswith("--"))


def value_name(action: argparse.Action) -> str:
    """The name of a flag's value where none is given: N for a count, else the last word of the
    flag's name (--seq-length N, --tokenizer-model MODEL)."""
    if getattr(action.type, "kind", action.type) is int:
        return "N"
    return action.dest.rsplit("_", 1)[-1].upper()


def _add_progress_interval_arg(p, training: bool = False) -> None:
    """--progress-interval, also spelled --log-interval except in build, where --log-interval is
    the training command's own flag (iterations between training's log lines)."""
    names = ("--progress-interval",) if training else ("--progress-interval", "--log-interval")
    p.add_argument(*names, dest="progress_interval", type=amount, metavar="SECONDS",
                   help="seconds between progress lines on stderr (default: 0.5 on a terminal, 30 otherwise; "
                        "0 disables)")


class _Parser(argparse.ArgumentParser):
    """argparse reading flags as Megatron-LM's parser does, never abbreviated (``--seq 256`` is no
    ``--seq-length``, which training would refuse), and refusing an unknown flag where it was given:
    a subcommand's own usage and the flag it most likely meant, not the top level's usage. A parser
    that ``reads_training_command`` (build's) sets aside the flags of the chosen Megatron-LM
    version's training it does not read (``training_flags``) instead."""

    reads_training_command = False

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("formatter_class", _Help)
        super().__init__(*args, allow_abbrev=False, **kwargs)

    def parse_known_args(self, args=None, namespace=None):
        from ..megatron.command import nearest, set_aside

        namespace, extras = super().parse_known_args(args, namespace)
        if self.reads_training_command:  # build's words and flags, for the command as training has it
            namespace.words = list(args or [])
            namespace.own_flags = {name: 1 if a.nargs is None else a.nargs
                                   for name, a in self._option_string_actions.items()}
        if extras and self.reads_training_command:
            try:
                namespace.training_flags = set_aside(extras, _version_of(namespace), self._option_string_actions)
            except MegacacheError as exc:
                self.error(str(exc))
        elif extras:
            hints = [nearest(w.partition("=")[0], self._option_string_actions) for w in extras if w.startswith("-")]
            self.error(f"unrecognized arguments: {' '.join(extras)}" + "".join(f"; {h}" for h in hints if h))
        return namespace, []


def with_argument_files(words: list[str], parser: argparse.ArgumentParser, reading: tuple = ()) -> list[str]:
    """``words`` with each ``@FILE`` replaced by the words in FILE, split as a shell splits them
    (quotes, ``#`` comments, lines continued with a backslash), so that the flags of a training
    script read as written; a FILE may name more @FILEs."""
    out = []
    for word in words:
        if not word.startswith("@") or len(word) == 1:
            out.append(word)
            continue
        path = word[1:]
        if path in reading:
            parser.error(f"{word}: read again from within itself")
        try:
            with open(path, encoding="utf-8") as f:
                text = f.read()
            inner = shlex.split(text.replace("\\\n", " "), comments=True)
        except OSError as exc:
            parser.error(f"{word}: cannot read the file of arguments ({exc.strerror})")
        except (ValueError, UnicodeDecodeError) as exc:
            parser.error(f"{word}: cannot split it into words as a shell would ({exc})")
        out += with_argument_files(inner, parser, (*reading, path))
    return out


def _version_of(namespace: argparse.Namespace) -> str:
    from ..megatron.versions import resolve

    return resolve(namespace.megatron_version)


def build_parser() -> argparse.ArgumentParser:
    from ..runtime.environment import VARIABLES

    width = max(map(len, VARIABLES)) + 2
    described = "\n".join(f"  {name:<{width}}{text}" for name, text in VARIABLES.items())
    parser = _Parser(prog="megacache", description=f"{__doc__.strip()}\n\nEnvironment:\n{described}")
    parser.add_argument("-V", "--version", action=_Version)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for add, run in ((_add_tokenize_args, _cmd_tokenize), (_add_build_args, _cmd_build), (_add_pack_args, _cmd_pack),
                     (_add_merge_args, _cmd_merge),
                     (_add_convert_args, _cmd_convert), (_add_verify_args, _cmd_verify),
                     (_add_inspect_args, _cmd_inspect), (_add_clean_args, _cmd_clean),
                     (_add_sample_corpus_args, _cmd_sample_corpus), (_add_kernels_args, _cmd_kernels)):
        add(sub).set_defaults(func=run)
    return parser


#: help texts that two subcommands share
_DROP_LOSS_HELP = ("write a .ds input's tokens although its .ds.loss mask masks some of them (no output format "
                   "holds a loss mask; without this flag such an input is refused, and an all-ones mask passes)")
_INPUTS_HELP = ("; a folder stands for the datasets in it and a quoted glob pattern for those it matches, each in "
                "name order")
_INPUT_LIST_HELP = ("a file naming more datasets, one per line, after those given (blank lines and lines starting "
                    "with # skipped): for tens of thousands of shards")
_MAX_SIZE_HELP = ("write parts of at most this many bytes of tokens each (whole inputs, in order; an input larger "
                  "than this alone), named OUT-00000-of-000NN ...")


def _add_tokenize_args(sub) -> argparse.ArgumentParser:
    from ..text.backends import BACKENDS, DEFAULT_VERIFY_FRACTION

    p = sub.add_parser("tokenize", help="tokenize text into Megatron .bin/.idx datasets")
    p.add_argument("--input", nargs="+", required=True, metavar="PATH", type=nonempty,
                   help="files, directories or globs: .jsonl/.json, .txt, .parquet; .gz/.zst for the line formats; "
                        "also in buckets, read where they are: s3://BUCKET/PREFIX/, s3://BUCKET/KEY, "
                        "'s3://BUCKET/dir/*.jsonl.gz', msc://PROFILE/... (docs/object-storage.md)")
    p.add_argument("--output-prefix", required=True, metavar="PREFIX", type=nonempty,
                   help="as Megatron's preprocess_data.py: writes {PREFIX}_{key}_document.bin/.idx (or "
                        "{PREFIX}_{key}_document.pbin), one dataset per --json-keys key (unlike merge's "
                        "--output-prefix, which is the dataset's own prefix); also in a bucket, "
                        "s3://BUCKET/DIR/NAME or msc://PROFILE/DIR/NAME (.bin/.idx only; docs/object-storage.md)")
    p.add_argument("--overwrite", action="store_true",
                   help="replace the datasets at the output prefix when they are there already, made from other "
                        "inputs or settings or by another tool (without it such a dataset is refused; one that "
                        "megacache tokenize made from these inputs and settings is kept, nothing written)")
    p.add_argument("--output-format", choices=("megatron", "pbin"), default="megatron",
                   help="megatron (default): Megatron's .bin/.idx; pbin: Modalities' packed file, every "
                        "document ending with EOD as its packer ends them (--append-eod or not)")
    p.add_argument("--json-keys", nargs="+", default=["text"], metavar="KEY", type=nonempty,
                   help="one output dataset per key (default: text)")
    p.add_argument("--append-eod", action="store_true", help="append the EOD token to every non-empty document")
    _add_tokenizer_args(p)
    p.add_argument("--skip-bad", action="store_true",
                   help="skip bad records (reported in the summary) instead of stopping at the first")
    p.add_argument("--unit-bytes", type=byte_size, default="64M",
                   help="size of a work unit of plain input (default 64M); units are resumable")
    p.add_argument("--threads", type=positive, help="tokenizer threads per rank (default: cores / ranks per node)")
    p.add_argument("--tokenizer-backend", choices=BACKENDS, default="auto",
                   help="auto (default): gigatoken where it loads the tokenizer and passes its self-test, "
                        "else the library Megatron uses; gigatoken: that or an error; hf: the library "
                        "Megatron uses. The bytes written are the same with each")
    p.add_argument("--verify-fraction", type=amount, default=DEFAULT_VERIFY_FRACTION, metavar="F",
                   help=f"fraction of documents gigatoken's output is checked on by encoding them again "
                        f"with the reference library (default {DEFAULT_VERIFY_FRACTION}); a unit that "
                        f"disagrees is redone with the reference and the exit status is "
                        f"{EXIT_BACKEND_DISAGREED}")
    p.add_argument("--strict-backend", action="store_true",
                   help="stop with an error when gigatoken disagrees with the reference library (self-test or a "
                        "unit), instead of falling back to it")
    _add_progress_interval_arg(p)
    return p


def _add_build_args(sub) -> argparse.ArgumentParser:
    from ..algorithms.blend_sizes import DEFAULT_SURPLUS
    from ..megatron.tokenizer import TOKENIZER_FLAGS
    from ..megatron.training import DEFAULT_SEED, SIZE_FLAGS

    # Groups in the order a user writes a command: the data first, the build's own switches last.
    p = sub.add_parser("build", add_help=False,
                       help="build Megatron GPTDataset index caches (flags as in Megatron-LM training, or a "
                            "Megatron-Bridge configuration)",
                       usage="%(prog)s --data-path ... --seq-length N SAMPLES TOKENIZER [...]\n"
                             "       %(prog)s --yaml-cfg FILE.yaml | --bridge-config CONFIG.yaml [...]",
                       description="Takes the training command as it is: besides the flags below, every flag of "
                                   "the chosen Megatron-LM version's training is accepted and changes nothing in "
                                   "the caches (--verbose lists them); a flag that version does not know is an "
                                   "error. @FILE reads more words from FILE, as a shell splits them. Flags marked "
                                   "(required) are needed unless --yaml-cfg or --bridge-config gives them.")
    p.reads_training_command = True
    p.set_defaults(training_flags=[])
    g = p.add_argument_group("data (required: one of these forms, as in Megatron-LM)")
    g.add_argument("--data-path", nargs="+", metavar="WORD",
                   help="PREFIX, or W1 PREFIX1 W2 PREFIX2 ... (a weighted blend), or PREFIX1 PREFIX2 ... "
                        "(blended by length); prefixes exactly as given to Megatron (they are hashed)")
    g.add_argument("--data-args-path", metavar="FILE", type=nonempty, help="a file holding the --data-path words")
    g.add_argument("--train-data-path", nargs="+", metavar="WORD", help="the train split's own blend")
    g.add_argument("--valid-data-path", nargs="+", metavar="WORD", help="the valid split's own blend")
    g.add_argument("--test-data-path", nargs="+", metavar="WORD", help="the test split's own blend")
    g.add_argument("--per-split-data-args-path", metavar="FILE.json", type=nonempty,
                   help='JSON {"train": [...], "valid": [...], "test": [...]} of per-split words')
    g = p.add_argument_group("sequences (hashed into the cache name)")
    g.add_argument("--seq-length", type=int, help="(required, or --encoder-seq-length) training's --seq-length")
    g.add_argument("--encoder-seq-length", type=int, help="the sequence length when --seq-length is not given, as "
                                                          "Megatron-LM takes it")
    g.add_argument("--split", help="as Megatron: 1 to 3 non-negative weights separated by commas (default '969, 30, "
                                   "1' with --data-path; spaces are hashed). A string megatron-core reads "
                                   "otherwise than written (a sign, a letter, an empty place) builds what it reads, "
                                   "with a warning saying so")
    g.add_argument("--seed", type=int, help=f"training's --seed (default {DEFAULT_SEED}; not sample-corpus's "
                                            f"--seed, which seeds the synthetic text)")
    g.add_argument("--mid-level-dataset-surplus", type=amount,
                   help=f"extra samples each blended dataset is built with (default {DEFAULT_SURPLUS})")
    g.add_argument("--no-add-extra-token-to-sequence", action="store_true",
                   help="GPTDatasetConfig.add_extra_token_to_sequence=False")
    g.add_argument("--no-drop-last-partial-validation-sequence", action="store_true",
                   help="GPTDatasetConfig.drop_last_partial_validation_sequence=False")
    g = p.add_argument_group("samples per split (required)", "--train-samples, or --train-iters with a batch size: "
                                                             "Megatron-LM's training flags; the counts are hashed")
    add_flags(g, SIZE_FLAGS)
    g.add_argument("--prepare-cache-world-size", type=positive,
                   help="the ranks training runs on, as Megatron-LM's tools/prepare_cache.py takes it: with "
                        "--micro-batch-size, the global batch when --global-batch-size is not given")
    g = p.add_argument_group("tokenizer (required)", "Megatron-LM's flags, as training is given them; hashed into "
                                                     "the cache name")
    add_flags(g, TOKENIZER_FLAGS)
    g.add_argument("--tokenizer-identifiers", metavar="FILE.json", type=nonempty,
                   help="the tokenizer's identifiers, verbatim")
    g.add_argument("--tokenizer-from-description", metavar="PATH", type=nonempty,
                   help="take the tokenizer entry of an existing Megatron ...-description.txt")
    g = p.add_argument_group("Megatron version")
    _add_version_arg(g)
    g.add_argument("--megatron-python", metavar="PYTHON", type=nonempty,
                   help="ask the Megatron this interpreter imports (in this environment, so a Megatron-LM "
                        "checkout on PYTHONPATH counts) for the tokenizer identity, built from these flags by "
                        "its own build_tokenizer; it must agree with megacache's table where the table knows "
                        "that version (a newer one is followed as it answers). With Megatron-LM there and a "
                        "whole training command, its own parse_args and validate_args also read the command, "
                        "as tools/prepare_cache.py does: the samples per split, seed, split, blends and cache "
                        "path it gives must be megacache's, or the build stops naming each field that differs. "
                        "Costs one import of Megatron")
    g = p.add_argument_group("the command from a file, instead of the flags above")
    g.add_argument("--yaml-cfg", metavar="FILE.yaml", type=nonempty,
                   help="Megatron-LM's experimental YAML arguments, read as training reads them: its top-level "
                        "keys are the arguments (data_path, split, seq_length, ...), the parallel sizes are in "
                        "its model_parallel section, and every other training flag given is ignored")
    g.add_argument("--bridge-config", metavar="CONFIG.yaml", type=nonempty,
                   help="a Megatron-Bridge ConfigContainer as Bridge writes it to YAML (cfg.to_yaml, or a "
                        "checkpoint's run_config.yaml): the data, split, sequence length, seed, cache path, "
                        "tokenizer and sample counts all come from it, as Bridge's first run computes them")
    g = p.add_argument_group("the cache")
    g.add_argument("--data-cache-path", help="default: Megatron's <prefix>/cache/GPTDataset_indices (blends "
                                             "need it: Megatron caches blends only there)")
    g.add_argument("--object-storage-cache-path", metavar="DIR",
                   help="with s3:// or msc:// data paths (required then, as in Megatron-LM): each dataset's .idx "
                        "is copied into DIR where training copies it, and read there; the .bin is not read")
    g.add_argument("--per-dataset-sequences-path", metavar="FILE.json",
                   help="training's sequences file (default: sequences_per_dataset.json in --data-cache-path; '' for none)")
    g.add_argument("--rebuild-stale", action="store_true",
                   help="replace existing entries built from other data or settings (default: refuse)")
    g.add_argument("--no-rebuild", action="store_true",
                   help="refuse, rather than rebuild, existing entries whose files are damaged (cut short, "
                        "extended, not the array their header or the plan says)")
    g.add_argument("--dry-run", action="store_true",
                   help="build nothing: list every cache entry the build would write (its state: complete, "
                        "missing, partial, stale or damaged; split; samples; files), and the other files it writes; "
                        "takes no lock, exits 0")
    g.add_argument("--json", action="store_true", help="with --dry-run: the list as JSON, for tools")
    g.add_argument("--verbose", action="store_true",
                   help="print each split's full description (with --dry-run: also each file and whether it is there)")
    _add_progress_interval_arg(g, training=True)
    g.add_argument("-h", "--help", action="help", help="show this help message and exit")
    g = p.add_argument_group("Megatron-LM's loading flags", "accepted; the cache is the same with or without them")
    g.add_argument("--dataloader-fast-cache-load", action="store_true")
    g.add_argument("--dataloader-defer-npy-index-mmap", action="store_true")
    return p


def _add_pack_args(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("pack", help="prepare Megatron-Bridge's packed SFT sequences before fine-tuning "
                                    "(docs/sft-packing.md), every rank tokenizing a share of each split")
    p.add_argument("--bridge-config", required=True, metavar="CONFIG.yaml", type=nonempty,
                   help="a Megatron-Bridge finetuning ConfigContainer as Bridge writes it to YAML: its dataset "
                        "(GPTSFTDatasetConfig with dataset_root, seq_length, seed, dataset_kwargs, "
                        "offline_packing_specs) and HuggingFaceTokenizer; the training and validation packed "
                        "files and the metadata file are written where Bridge's builder looks for them, and a "
                        "split whose packed file is there is left as it is")
    p.add_argument("--dry-run", action="store_true",
                   help="write nothing: list the packed files and whether each is there or would be written")
    return p


def _add_merge_args(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("merge", help="concatenate datasets in the order given (Megatron prefixes, .pbin or .ds files)")
    p.add_argument("prefixes", nargs="*", metavar="PREFIX|FILE.pbin|FILE.ds",
                   help="the datasets to concatenate, in order: Megatron prefixes, .pbin files or datatrove .ds files"
                        + _INPUTS_HELP)
    p.add_argument("--input-list", metavar="FILE", type=nonempty, help=_INPUT_LIST_HELP)
    p.add_argument("--output-prefix", required=True, metavar="PREFIX|FILE.pbin|FILE.ds", type=nonempty,
                   help="the merged dataset's own prefix (PREFIX.bin/.idx), .pbin or .ds file, in the inputs' "
                        "format (unlike tokenize's --output-prefix, nothing is appended to it)")
    p.add_argument("--dtype", choices=["uint8", "int8", "uint16", "int16", "uint32", "int32", "int64"],
                   help="the output's token dtype, for inputs of several widths (refused without it); every id is "
                        "checked to fit (a Megatron prefix holds uint8, int8, uint16, int16, int32 or int64, a .pbin "
                        "uint8, uint16 or uint32, a .ds uint16 or uint32)")
    _add_copy_args(p)
    return p


def _add_copy_args(p: argparse.ArgumentParser) -> None:
    """The flags merge and convert share, which copy tokens from their inputs into outputs."""
    p.add_argument("--max-size", type=byte_size, metavar="SIZE", help=_MAX_SIZE_HELP)
    p.add_argument("--chunk-bytes", type=byte_size, default="256M", help="copy granularity (default 256M)")
    p.add_argument("--drop-loss-mask", action="store_true", help=_DROP_LOSS_HELP)
    _add_progress_interval_arg(p)


def _add_convert_args(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("convert", help="a dataset in another format: Megatron's .bin/.idx, Modalities' .pbin, "
                                       "datatrove's .ds, OLMo's token files (docs/modalities.md, docs/datatrove.md, "
                                       "docs/olmo.md)")
    p.add_argument("sources", nargs="*", metavar="SRC",
                   help="the datasets to convert, in order, into one: Megatron prefixes, or paths ending in .pbin, "
                        ".ds or .npy (OLMo's headerless token files), all of one format" + _INPUTS_HELP)
    p.add_argument("destination", metavar="DST",
                   help="another format: a path ending in .pbin, .ds or .npy (OLMo), or a Megatron prefix; with "
                        "--per-file a pattern whose * stands for each input's name (out/*.pbin, out/* for prefixes)")
    p.add_argument("--per-file", action="store_true",
                   help="convert each input into its own dataset, named by DST's pattern, the ranks sharing the "
                        "inputs (instead of all inputs into one)")
    p.add_argument("--vocab-size", type=positive,
                   help="the tokenizer's vocabulary size (as tokenize's and build's --vocab-size, Megatron's), "
                        "which here chooses the output's token size by its format's rule (Megatron: uint16 "
                        "below 65500, else int32; .pbin: the bytes log2(vocab) bits take, 3 as 4; .ds: 2 bytes "
                        "up to 65536, else 4; OLMo: uint16 up to 65536, else uint32, also an OLMo input's width "
                        "without --dtype); default: the source's tokens decide (uint16 <-> 2 bytes, int32 "
                        "<-> 4 bytes, 1-byte .pbin -> uint16 or a 2-byte .ds)")
    p.add_argument("--eos-id", type=int,
                   help="OLMo token files (input or output): the EOS id that ends every document (OLMo-core's "
                        "eos_token_id). An OLMo input's documents are cut after each EOS, which stays with its "
                        "document; an OLMo output needs every source document to end with it (tokenize "
                        "--append-eod): nothing is added or dropped")
    p.add_argument("--dtype", choices=["uint16", "uint32"],
                   help="an OLMo token file's width (OLMo-core's dtype): an input's, which the file does not "
                        "record, or the output's (default: the sources' width)")
    p.add_argument("--input-list", metavar="FILE", type=nonempty, help=_INPUT_LIST_HELP)
    _add_copy_args(p)
    return p


def _add_verify_args(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("verify", help="check datasets (.bin/.idx, .pbin, .ds, OLMo .npy, Megatron-Bridge packed SFT "
                                      ".parquet/.npy) and cache directories for "
                                      "consistency; exit 0 only if all hold; under mpiexec/srun the ranks share the "
                                      "datasets and entries and each checks a slice of every blend")
    _add_paths_args(p, "PREFIX|FILE|CACHE_DIR")
    p.add_argument("--vocab-size", type=positive,
                   help="the tokenizer's vocabulary size (as tokenize's and build's --vocab-size, Megatron's): "
                        "here, also check that every token id is below it (and an OLMo file's width without "
                        "--dtype, by OLMo's rule)")
    _add_progress_interval_arg(p)
    return p


def _add_inspect_args(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("inspect", help="summarize dataset prefixes, dataset files or cache directories; "
                                       "exit 2 on an incomplete or altered cache entry or a damaged file")
    _add_paths_args(p, "PATH")
    return p


def _add_paths_args(p: argparse.ArgumentParser, metavar: str) -> None:
    """The datasets and cache directories verify and inspect read, and how to read them."""
    p.add_argument("paths", nargs="+", metavar=metavar,
                   help="a dataset prefix (or its .idx/.bin), local or in a bucket (s3://BUCKET/KEY, "
                        "msc://PROFILE/PATH: the .idx read once, the .bin by ranged reads), a .pbin, .ds or OLMo .npy "
                        "file, a Megatron-Bridge packed SFT file (.parquet, .pq, or an .npy of pickled rows, read "
                        "without unpickling), or a cache directory")
    p.add_argument("--eos-id", type=int, help="an OLMo token file's EOS id (OLMo-core's eos_token_id), which ends "
                                               "each of its documents")
    p.add_argument("--dtype", choices=["uint16", "uint32"],
                   help="an OLMo token file's width (OLMo-core's dtype), which the file does not record")
    _add_version_arg(p)


def _add_clean_args(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("clean", help="remove what interrupted or failed jobs left in a directory: temporary files, "
                                     "tokenize's finished work units (a rerun would resume from them), the records "
                                     "of jobs that did not finish; refused while a job runs there")
    p.add_argument("directories", nargs="+", metavar="DIR", type=nonempty,
                   help="a cache directory, or the directory of an output prefix")
    return p


def _add_sample_corpus_args(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("sample-corpus", help="write the bundled synthetic sample corpus (jsonl)")
    p.add_argument("--output-dir", required=True, type=nonempty, help="writes shard_0.jsonl, shard_1.jsonl, ... here")
    p.add_argument("--files", type=positive, default=4, help="files to write")
    p.add_argument("--documents", type=positive, default=2000, help="documents per file")
    p.add_argument("--seed", type=count, default=0,
                   help="seeds the synthetic text (not build's --seed, which is training's)")
    return p


def _add_kernels_args(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("kernels", help="compile megacache's kernels for this machine's CPU, once, so that builds start "
                                       "without numba's JIT (needs a C compiler); into $MEGACACHE_KERNEL_DIR, by default "
                                       "$XDG_CACHE_HOME/megacache/kernels, where builds look for them")
    return p


class _Version(argparse.Action):
    """``-V``: the installed version, looked up only when asked for: the lookup imports
    ``importlib.metadata`` and searches ``sys.path``, which every rank's start would pay for."""

    def __init__(self, option_strings, dest=argparse.SUPPRESS, default=argparse.SUPPRESS,
                 help="show program's version number and exit"):
        super().__init__(option_strings, dest=dest, default=default, nargs=0, help=help)

    def __call__(self, parser, namespace, values, option_string=None):
        try:
            sys.stdout.write(f"megacache {_version()}\n")
        except OSError:  # stdout's reader gone, as argparse's own version action allows
            pass
        parser.exit()


def _version() -> str:
    from importlib import metadata

    try:
        return metadata.version("megacache")
    except metadata.PackageNotFoundError:  # run from a source tree that was never installed
        return "(not installed)"


def reader_gone(exc: BaseException) -> bool:
    """Whether ``exc`` is stdout's reader going away (``megacache verify ... | head -1`` once head has
    its line), told from a broken pipe of megacache's own (to a worker process) by polling stdout:
    a pipe without a reader polls as an error."""
    if not isinstance(exc, BrokenPipeError):
        return False
    try:
        fd = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):  # stdout replaced by a stream without a descriptor
        return False
    poll = select.poll()
    poll.register(fd, select.POLLOUT)
    return any(events & (select.POLLERR | select.POLLHUP) for _, events in poll.poll(0))


def end_quietly() -> int:
    """The exit status of a command whose stdout reader went away, with nothing more said: what a
    shell reports for a tool that SIGPIPE ends (``set -o pipefail`` then sees that the command did
    not finish; ``head`` itself chose to stop, so nothing is an error to report). stdout goes to
    /dev/null, so that nothing written after, the interpreter's last flush included, fails again."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
    return 128 + signal.SIGPIPE


def _with_notes(exc: BaseException) -> str:
    """An error's message and, a line each, its notes (what the job left behind)."""
    return "\n".join([str(exc), *getattr(exc, "__notes__", ())])


def main(argv: list[str] | None = None) -> int:
    from ..runtime.log import show_on_stderr

    single_threaded_blas()
    parser = build_parser()
    args = parser.parse_args(with_argument_files(sys.argv[1:] if argv is None else argv, parser))
    show_on_stderr()
    if argv is None and args.command == "tokenize":
        hide_torch_from_transformers()
    # Until MPI has started, a signal ends the process as usual: MPI's start holds the interpreter,
    # so no handler could run, and nothing has been written.
    comm = get_comm()
    try:
        with stoppable(args.command, comm.rank):
            status = args.func(args, comm) or 0
    except MegacacheError as exc:
        # Raised on every rank alike (errors are agreed collectively), so rank 0 speaks for all.
        if comm.rank == 0:
            print(f"megacache {args.command}: error: {_with_notes(exc)}", file=sys.stderr, flush=True)
        return 2
    except JobCrashed as exc:
        # A bug on some rank, agreed by all: rank 0 prints the failed ranks' tracebacks.
        if comm.rank == 0:
            print(f"megacache {args.command}: unexpected failure, a bug in megacache (please report it "
                  f"with this output): {_with_notes(exc)}", file=sys.stderr, flush=True)
        return 1
    except BaseException as exc:
        # Not agreed, so possibly on this rank alone: report it and take the whole job down rather
        # than leave the other ranks waiting in a collective. The system's or the input's fault (an
        # OSError a command did not check for first) is bad input; anything else is a bug.
        if reader_gone(exc):
            status = end_quietly()
            if comm.size > 1:
                comm.abort(status)
            return status
        bug = is_bug(exc)
        print(f"megacache {args.command}: rank {comm.rank} failed:\n{traceback.format_exc()}" if bug else
              f"megacache {args.command}: error: {exc}", file=sys.stderr, flush=True)
        status = 1 if bug else 2
        if comm.size > 1:
            comm.abort(status)
        return status
    return status


def run() -> None:
    """The ``megacache`` process: ``main``, then exit with every object frozen out of the garbage
    collector. The interpreter's teardown otherwise collects over numba's and numpy's objects, on
    every rank, after the work is done."""
    status = main()
    gc.freeze()
    sys.exit(status)


if __name__ == "__main__":
    run()
