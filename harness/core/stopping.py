"""Stop long work the way Ctrl-C does, whoever sends the signal.

A trainer saves its exact resume state on KeyboardInterrupt (otherwise only every `save_every`
steps). Two stops would skip that: SIGTERM (`kill PID`, a batch scheduler's time limit) ends
Python without unwinding, and a job started with `&` from a non-interactive shell inherits SIGINT
ignored, so `kill -INT` does nothing. Both become KeyboardInterrupt here.
"""
from __future__ import annotations

import signal
import threading


def interrupt_on_stop_signals() -> bool:
    """SIGINT and SIGTERM raise KeyboardInterrupt in the main thread; False (nothing changed) when
    called from another thread, where Python cannot set signal handlers."""
    if threading.current_thread() is not threading.main_thread():
        return False
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, _raise_keyboard_interrupt)
    return True


def _raise_keyboard_interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(signal.Signals(signum).name)
