"""One writer per folder: `hold(folder)` takes an exclusive `fcntl.flock` on `folder/.lock` for
as long as a command writes the folder (a run folder's records, meta.json, summary, tables and
plots; the history file's folder). A second writer is refused at once with one line naming the
process that holds it, never left to append the same answers twice or to time its answers while
another run fights it for the cores.

The kernel drops the lock when its process ends, however it ends, so the lock of a killed
process is simply taken over. The lock file is removed on release; the holder checks after
locking that the file it locked is still the one in the folder, so two processes never both
hold a lock, one on a file another has just removed. A process that holds a folder may take it
again (nested `hold`s are free), so a command and the library calls it makes share one lock.
"""
from __future__ import annotations

import fcntl
import os
import shlex
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from harness.core.errors import SpecbenchError
from harness.core.files import os_reason

LOCK_NAME = ".lock"
_held: dict[Path, int] = {}   # folders this process holds -> nesting depth


def holder_text(fd: int) -> str:
    """'PID 1234: cli.py run ...' as the holder wrote it into the lock file."""
    text = ""
    for _ in range(20):  # the holder writes its PID right after locking: give it that moment
        text = os.pread(fd, 4096, 0).decode("utf-8", "replace").strip()
        if text:
            break
        os.sched_yield()
    pid, _, command = text.partition(" ")
    return f"PID {pid}: {command}" if pid.isdigit() else "a process that has not written its PID yet"


def _open_folder(folder: Path, what: str) -> bool:
    """Make `folder` (and its parents); True when it was created here. A file in its place or a
    folder that cannot be made is one line naming the option."""
    if folder.exists() and not folder.is_dir():
        raise SpecbenchError(f"{what} {folder} is a file, not a folder: pass a folder")
    created = not folder.exists()
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise SpecbenchError(f"{what} {folder}: cannot make this folder ({os_reason(e)}); "
                             "pass a writable folder") from None
    return created


def _lock(folder: Path, what: str) -> int:
    """The locked file's descriptor, the caller's PID and command written in it."""
    path = folder / LOCK_NAME
    while True:
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as e:
            raise SpecbenchError(f"{what} {folder} is not writable ({os_reason(e)}); pass a writable folder") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = holder_text(fd)
            os.close(fd)
            raise SpecbenchError(f"{folder} is being written by another process ({holder}); wait for it to "
                                 f"finish, or pass another {what}") from None
        except OSError as e:
            os.close(fd)
            raise SpecbenchError(f"{what} {folder}: cannot lock it ({os_reason(e)}); pass a local folder") from None
        try:
            current = os.stat(path).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            current = False
        if current:
            break
        os.close(fd)  # the holder before us removed the file we locked: lock the one there now
    command = shlex.join([Path(sys.argv[0]).name, *sys.argv[1:]])[:300] if sys.argv else ""
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()} {command}\n".encode(), 0)
    except OSError:
        pass  # a full disk: the lock holds all the same, a second writer only misses the PID
    return fd


def _unlock(folder: Path, fd: int) -> None:
    path = folder / LOCK_NAME
    try:
        if os.stat(path).st_ino == os.fstat(fd).st_ino:
            path.unlink()
    except OSError:
        pass  # already gone, or a read-only folder: the lock itself ends with the descriptor
    os.close(fd)


@contextmanager
def hold(folder: Path | str, what: str = "--out") -> Iterator[Path]:
    """Hold `folder` (made if missing) as its one writer until the block ends; `what` names the
    option that chose the folder in the one-line errors. A folder this process made and left
    empty is removed again, so a refused command leaves nothing behind."""
    folder = Path(folder)
    key = folder.resolve()
    if key in _held:
        _held[key] += 1
        try:
            yield folder
        finally:
            _held[key] -= 1
        return
    created = _open_folder(folder, what)
    fd = _lock(folder, what)
    _held[key] = 1
    try:
        yield folder
    finally:
        del _held[key]
        _unlock(folder, fd)
        if created:
            try:
                folder.rmdir()  # only when empty
            except OSError:
                pass
