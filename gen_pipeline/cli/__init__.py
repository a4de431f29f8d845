"""The command line: one module per subcommand (its flags and one call into the library), and the parser
that joins them. No logic lives here, and nothing in the library imports this package.

Exit codes (generate): 0 every row ended in the output or under a permanent ledger reason;
1 error (bad flags, unusable fleet, refused resume); 2 usage; 3 incomplete (transient failures are in
the ledger: run again to retry them); 4 no server usable for --outage-timeout; 5 the output could not be
written (disk full, I/O error); 130 interrupted (Ctrl-C, SIGTERM, SIGHUP). Codes 3, 4, 5 and 130 leave
a resumable directory: run the same command again.

May import: anything (and nothing but `python -m gen_pipeline` imports it).
"""

from __future__ import annotations

import argparse
import importlib
import logging
import signal
import sys
from typing import Any

from .._version import __version__
from ..errors import EXIT_ERROR, EXIT_INTERRUPTED, EXIT_OUTPUT, OutputError, PipelineError
from ..runtime import install_stop_handlers, restore_handlers, say, silence, tune_process
from .generate import config_from_args, with_config_file

__all__ = ["build_parser", "config_from_args", "main", "parse_argv", "subcommands"]

EXIT_BROKEN_PIPE = 128 + signal.SIGPIPE  # what a shell reports for a tool killed by SIGPIPE
CONFIG_COMMANDS = ("generate", "check")  # the commands that take --config FILE
GENERATE_HELP = "generate completions for a prompts file"
# The other subcommands, each in a module of its own: name -> (module, help).
PLUGGED = {
    "simulate": ("gen_pipeline.sim", "serve a simulated SGLang fleet on localhost"),
    "prepare": ("gen_pipeline.cli.prepare", "turn datasets into deduplicated prompt JSONL"),
    "export": ("gen_pipeline.cli.export", "turn a run directory into a training dataset"),
    "check": ("gen_pipeline.cli.check", "preflight: fleet, tokenizer agreement and the budget plan"),
    "status": ("gen_pipeline.cli.status", "show how a run is doing (running, finished or stopped)"),
    "report": ("gen_pipeline.cli.report", "a run's summary as a table, plus plots"),
}


def _plug(sub: Any, name: str, module_name: str, help_text: str) -> None:
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name != module_name:
            raise
        return
    p = sub.add_parser(name, help=help_text)
    module.add_arguments(p)
    p.set_defaults(func=module.main)


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The whole command line. With `command`, only that subcommand's module is imported and the other
    plugged ones are listed by name: `generate` does not pay for importing the simulator and the rest (0.1-0.4 s)."""
    parser = argparse.ArgumentParser(
        prog="gen-pipeline",
        description="Generate completions for a large prompts file on a fleet of SGLang servers.",
        epilog=_user_text(__doc__),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"gen-pipeline {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    _plug(sub, "generate", "gen_pipeline.cli.generate", GENERATE_HELP)
    for name, (module_name, help_text) in PLUGGED.items():
        if command is None or command == name:
            _plug(sub, name, module_name, help_text)
        else:
            sub.add_parser(name, help=help_text)
    return parser


def subcommands() -> dict[str, argparse.ArgumentParser]:
    """Every subcommand's parser by name, each with all its flags (what a CLI reference walks)."""
    return _choices(build_parser())


def _choices(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    """parser's subcommands by name."""
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(sub.choices)


def parse_argv(argv: list[str]) -> argparse.Namespace:
    """argv parsed, over the settings of a --config FILE for the commands that take one."""
    command = _command(argv)
    parser = build_parser(command)
    if command in CONFIG_COMMANDS:
        with_config_file(_choices(parser)[command], argv)
    args = parser.parse_args(argv)
    args.argv = argv  # --workers re-runs it per worker
    return args


def _user_text(doc: str | None) -> str | None:
    """The docstring below its first paragraph, without the "May import:" rule (for tests/test_imports.py,
    not for users)."""
    paragraphs = (doc or "").strip().split("\n\n")[1:]
    return "\n\n".join(p for p in paragraphs if not p.startswith("May import:")) or None


def _command(argv: list[str]) -> str | None:
    """The subcommand named in argv, if it is one we know; None (build them all) otherwise."""
    first = next((a for a in argv if not a.startswith("-")), None)
    return first if first == "generate" or first in PLUGGED else None


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `gen-pipeline` command."""
    argv = list(sys.argv[1:] if argv is None else argv)
    # first of all: a signal while `generate` starts (fleet discovery, tokenizer load) exits 130, one line
    previous = install_stop_handlers() if _command(argv) == "generate" else {}
    try:
        return _main(argv)
    finally:
        restore_handlers(previous)


def _main(argv: list[str]) -> int:
    tune_process()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", stream=sys.stderr)
    try:
        args = parse_argv(argv)
        return int(args.func(args))
    except OutputError as exc:
        say(f"error: {exc}")
        return EXIT_OUTPUT
    except PipelineError as exc:
        say(f"error: {exc}")
        return EXIT_ERROR
    except KeyboardInterrupt:
        say("interrupted; the output directory stays resumable")
        return EXIT_INTERRUPTED
    except BrokenPipeError:  # the reader went away (`status --watch | head`): nothing more to say
        silence(sys.stdout)
        return EXIT_BROKEN_PIPE


if __name__ == "__main__":
    raise SystemExit(main())
