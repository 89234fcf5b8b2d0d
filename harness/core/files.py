"""Files written whole or not at all: `write_atomic` writes a temporary file beside the target
and renames it over it, so a full disk, a kill or a crash leaves the previous file as it was and
never a half-written one. An OS error (no space, read-only, no permission) is one line naming the
file, never a traceback."""
from __future__ import annotations

import os
from pathlib import Path

from harness.core.errors import SpecbenchError


def os_reason(e: OSError) -> str:
    """'No space left on device' for an OSError: the part a user acts on."""
    return e.strerror or type(e).__name__


def write_atomic(path: Path | str, data: str | bytes) -> Path:
    """Write `data` (text as UTF-8) to `path` through a temporary file renamed over it; the
    folder is created if missing. Returns `path`."""
    path = Path(path)
    raw = data.encode("utf-8") if isinstance(data, str) else data
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(tmp, "wb") as f:
            f.write(raw)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        kept = "the previous file is kept as it was" if path.exists() else "nothing was written"
        raise SpecbenchError(f"could not write {path} ({os_reason(e)}); {kept}: free space or fix the "
                             "folder's permissions, then rerun") from None
    return path
