"""Clean stops: Ctrl-C (SIGINT) and SIGTERM end a command with one line saying what is saved and how to resume,
instead of a traceback. Every answer is written whole and flushed as it finishes (`evaluation.run.folder`), so
the answers file stays valid and the same command picks up where it stopped."""

from __future__ import annotations

import contextlib
import signal
import sys
import threading

EXIT_STATUS = {"Ctrl-C": 130, "SIGTERM": 143}  # the shell's 128 + signal number


class Stopped(KeyboardInterrupt):
    """SIGTERM, raised where the main thread is, as Ctrl-C raises KeyboardInterrupt."""


@contextlib.contextmanager
def clean_stop(results_dir):
    """Within: SIGTERM stops like Ctrl-C; either ends the process with one line on stderr naming `results_dir` and
    the way to resume, exit status 130 or 143."""
    main_thread = threading.current_thread() is threading.main_thread()

    def on_term(signum, frame):
        raise Stopped("SIGTERM")

    previous = signal.signal(signal.SIGTERM, on_term) if main_thread else None
    try:
        yield
    except KeyboardInterrupt as exc:
        how = "SIGTERM" if isinstance(exc, Stopped) else "Ctrl-C"
        print(f"stopped by {how}: every finished answer is saved under {results_dir}; run the same command again to "
              f"resume", file=sys.stderr)
        sys.exit(EXIT_STATUS[how])
    finally:
        if main_thread:
            signal.signal(signal.SIGTERM, previous)
