"""Process-level pieces: standard streams that never raise (the stop signals: tests/test_stops.py)."""

from __future__ import annotations

import os

from gen_pipeline.runtime import QuietStream, say


def test_a_stream_whose_reader_is_gone_never_raises():
    """Writes to a pipe with no reader are dropped: no BrokenPipeError, now or at the next flush."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    raw = os.fdopen(write_end, "w")
    quiet = QuietStream(raw)  # type: ignore[arg-type]
    quiet.write("x\n" * 10_000)
    quiet.flush()
    assert quiet.broken
    quiet.write("more\n")
    say("one line", quiet)  # type: ignore[arg-type]
    raw.write("after\n")
    raw.flush()  # the descriptor now leads to /dev/null
    raw.close()
