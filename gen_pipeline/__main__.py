"""`python -m gen_pipeline` and the `gen-pipeline` command.

`generate` owns the stop signals before anything else is imported: the command line, the pipeline and
their dependencies take most of start-up (0.6-1 s on a busy node), and a SIGTERM, SIGHUP or Ctrl-C then
must exit 130 with one line, as it does later (docs/reference/exit-codes.md promises it "also during start-up").

A wrapper that supervises this process names itself in GEN_PIPELINE_SUPERVISOR_PID: the process then
dies with it (runtime.die_with). The variable is taken out of the environment, so that a process this one
starts (a `--workers` claimer) does not take this one for its supervisor.
"""

from __future__ import annotations

import os
import sys

SUPERVISOR_VARIABLE = "GEN_PIPELINE_SUPERVISOR_PID"


def main() -> int:
    """Entry point: the stop handlers of `generate` first, then the command line (cli.main). They stay until the
    command returns: a signal in its last moments, the run written, still exits 130 with one line (put back, the
    default SIGINT raised KeyboardInterrupt out of the interpreter's shutdown). Then the stop signals are
    ignored: the interpreter's shutdown puts Python handlers back to the default (freeing a large run's memory
    takes tens of ms, and a SIGTERM then killed a finished run, exit 143), and what is left to do writes nothing."""
    from .runtime import die_with, ignore_stop_signals, install_stop_handlers

    supervisor = os.environ.pop(SUPERVISOR_VARIABLE, "")
    if supervisor.isdigit():
        die_with(int(supervisor))
    argv = sys.argv[1:]
    command = next((a for a in argv if not a.startswith("-")), None)
    if command == "generate":
        install_stop_handlers()
    from .cli import main as run_command

    code = run_command(argv)
    if command == "generate":
        ignore_stop_signals()
    return code


if __name__ == "__main__":
    raise SystemExit(main())
