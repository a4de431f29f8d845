"""`python -m gen_pipeline` and the `gen-pipeline` command.

`generate` owns the stop signals before anything else is imported: the command line, the pipeline and
their dependencies take most of start-up (0.6-1 s on a busy node), and a SIGTERM, SIGHUP or Ctrl-C then
must exit 130 with one line, as it does later (the README promises it "also during start-up").
"""

from __future__ import annotations

import sys


def main() -> int:
    """Entry point: the stop handlers of `generate` first, then the command line (cli.main)."""
    from .runtime import install_stop_handlers, restore_handlers

    argv = sys.argv[1:]
    command = next((a for a in argv if not a.startswith("-")), None)
    previous = install_stop_handlers() if command == "generate" else {}
    try:
        from .cli import main as run_command

        return run_command(argv)
    finally:
        restore_handlers(previous)


if __name__ == "__main__":
    raise SystemExit(main())
