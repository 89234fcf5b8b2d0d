"""Stop long work the way Ctrl-C does, whoever sends the signal.

A trainer saves its exact resume state on KeyboardInterrupt (otherwise only every `save_every`
steps). Two stops would skip that: SIGTERM (`kill PID`, a batch scheduler's time limit) ends
Python without unwinding, and a job started with `&` from a non-interactive shell inherits SIGINT
ignored, so `kill -INT` does nothing. Both become KeyboardInterrupt here.
"""
from __future__ import annotations

import signal
import threading


# What the CLI and the scripts print on KeyboardInterrupt (the trainer itself names the saved step).
INTERRUPTED = "finished work is saved; rerun the same command to resume"


def interrupt_on_stop_signals() -> None:
    """SIGINT and SIGTERM raise KeyboardInterrupt in the main thread; nothing changes when called
    from another thread, where Python cannot set signal handlers."""
    if threading.current_thread() is not threading.main_thread():
        return
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, _raise_keyboard_interrupt)


def _raise_keyboard_interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(signal.Signals(signum).name)
