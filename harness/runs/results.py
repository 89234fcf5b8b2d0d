"""Run directories: records.jsonl, meta.json and summary.csv; the machine metadata stored beside
every run comes from `harness.core.machine_meta`.

A run directory holds:
- `meta.json`: the run config, its hash, the machine/software state (`collect_meta`) and the
  start time of every (re)start of the run;
- `records.jsonl`: one JSON object per answer (a `harness.runs.record.Record`), appended and
  fsynced one at a time so that a crash loses at most the answer being written;
- `summary.csv`: written by `harness.runs.metrics.write_summary`.
Tables and plots are rebuilt from these files alone, so everything that can explain a number
(commit, versions, threads, CPU flags, load) is written here once per run.
"""
from __future__ import annotations

import json
import os
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from harness.core.errors import SpecbenchError
from harness.core.hashing import canonical_json, config_hash
from harness.core.machine_meta import collect_meta, git_state
from harness.core.files import os_reason, write_atomic
from harness.runs.record import Record, record_problem
from harness.runs.record import record_key  # noqa: F401 - record keys are asked of run folders too

# ----------------------------------------------------------------------------- provenance

def refuse_dirty(meta: dict, what: str, allow_dirty: bool) -> None:
    """Refuse to make reference results (`what`) from a run whose tree had uncommitted changes."""
    if allow_dirty:
        return
    dirty = meta.get("dirty") or any(r.get("dirty") for r in meta.get("resumed_at", []) if isinstance(r, dict))
    if dirty:
        raise SpecbenchError(
            f"{what}: the run was made from a tree with uncommitted changes (commit {str(meta.get('commit'))[:7]}+); "
            "commit and rerun it, or pass --allow-dirty")


def _short(value: Any, limit: int = 60) -> str:
    text = json.dumps(value, default=str) if not isinstance(value, str) else repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def first_difference(old: Any, new: Any, path: str = "") -> str | None:
    """Dotted path and values of the first place where two JSON-like values differ, or None."""
    if isinstance(old, dict) and isinstance(new, dict):
        for k in sorted(set(old) | set(new), key=str):
            sub = f"{path}.{k}" if path else str(k)
            if k not in old:
                return f"{sub}: absent vs {_short(new[k])}"
            if k not in new:
                return f"{sub}: {_short(old[k])} vs absent"
            diff = first_difference(old[k], new[k], sub)
            if diff:
                return diff
        return None
    if isinstance(old, (list, tuple)) and isinstance(new, (list, tuple)):
        for i, (a, b) in enumerate(zip(old, new)):
            diff = first_difference(a, b, f"{path}[{i}]")
            if diff:
                return diff
        if len(old) != len(new):
            return f"{path or 'config'}: {len(old)} items vs {len(new)}"
        return None
    if canonical_json(old) != canonical_json(new):
        return f"{path or 'config'}: {_short(old)} vs {_short(new)}"
    return None


class RunDir:
    """One run's directory: meta.json, records.jsonl (append-only, crash-safe), summary.csv."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        # The tail of records.jsonl is repaired once, on the first append of this object.
        self._tail_checked = False

    @property
    def records_path(self) -> Path:
        return self.path / "records.jsonl"

    @property
    def meta_path(self) -> Path:
        return self.path / "meta.json"

    @property
    def summary_path(self) -> Path:
        return self.path / "summary.csv"

    def read_meta(self) -> dict | None:
        """meta.json as a dict, or None when the run has not been opened yet."""
        try:
            text = self.meta_path.read_text()
        except FileNotFoundError:
            return None
        try:
            meta = json.loads(text)
        except json.JSONDecodeError as e:
            raise SpecbenchError(f"{self.meta_path} is not valid JSON ({e}); delete the run dir") from e
        if not isinstance(meta, dict) or "config" not in meta:
            raise SpecbenchError(f"{self.meta_path} has no 'config'; delete the run dir")
        return meta

    def open(self, config: dict) -> None:
        """Start or resume the run for `config`.

        New directory: writes meta.json. Existing one with the same config (by hash): appends a
        start timestamp to `runs` and keeps the rest, so the commit and machine recorded are those
        of the first start. Another config: refuses, since mixing records of two configs in one
        directory would silently merge different experiments; a folder without a record yet
        (a run refused or stopped before its first answer) is started anew instead.
        """
        now = datetime.now(timezone.utc).isoformat(timespec="seconds")
        chash = config_hash(config)
        meta = self.read_meta()
        if meta is not None and config_hash(meta["config"]) != chash and not self.records():
            meta = None  # no answer is bound to the old config: it locks nothing
        if meta is None:
            if self.records_path.exists() and self.records_path.stat().st_size > 0:
                raise SpecbenchError(
                    f"{self.path} holds records but no meta.json; use another --out or delete it"
                )
            self.path.mkdir(parents=True, exist_ok=True)
            meta = {"config": config, "config_hash": chash, **collect_meta(), "runs": [now]}
        else:
            # Hash the stored config rather than trusting its stored hash: a hand edit shows up.
            if config_hash(meta["config"]) != chash:
                diff = first_difference(meta["config"], json.loads(canonical_json(config)))
                raise SpecbenchError(
                    f"{self.path} holds a run with another config (first difference: {diff}); "
                    f"use another --out or delete it"
                )
            meta["runs"] = [*meta.get("runs", []), now]
            # A resume from another commit or a dirty tree mixes provenance: say so in meta.json.
            commit, dirty = git_state()
            if (commit, dirty) != (meta.get("commit"), meta.get("dirty")):
                meta["resumed_at"] = [*meta.get("resumed_at", []), {"date": now, "commit": commit, "dirty": dirty}]
        self._write_meta(meta)

    def write_extra(self, extra: dict) -> None:
        """Merge `extra` facts (data dir, prompt provenance...) into meta.json, atomically."""
        meta = self.read_meta() or {}
        meta.update(extra)
        self._write_meta(meta)

    def _write_meta(self, meta: dict) -> None:
        # A temp file renamed over it: a crash or a full disk never leaves a half-written meta.json.
        write_atomic(self.meta_path, json.dumps(meta, indent=2, default=str) + "\n")

    def records(self) -> list[dict]:
        """All complete records, in file order, as parsed (no field checked)."""
        return [rec for _, rec in self.lines()]

    def lines(self) -> list[tuple[int, dict]]:
        """(line number, parsed record) of every complete record, in file order.

        A last line without its newline was cut by a crash: it is dropped if it does not parse
        (the next `append` truncates it away) and kept if it is a whole JSON object (the next
        `append` adds the newline). A bad line followed by others is real corruption: it raises,
        naming the line. Blank lines are skipped.
        """
        try:
            data = self.records_path.read_bytes()
        except FileNotFoundError:
            return []
        lines = data.split(b"\n")
        last = len(lines) - 1  # index of the text after the final newline ("" when complete)
        out: list[tuple[int, dict]] = []
        for i, raw in enumerate(lines):
            if not raw.strip():
                continue
            try:
                rec = json.loads(raw)
                if not isinstance(rec, dict):
                    raise ValueError("not a JSON object")
            except ValueError as e:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
                if i == last:
                    break  # truncated by a crash while writing; dropped
                raise SpecbenchError(
                    f"{self.records_path}:{i + 1}: malformed record ({e}); fix or delete that line"
                ) from e
            out.append((i + 1, rec))
        return out

    def read_records(self) -> list[Record]:
        """All complete records, in file order, as `Record`s, each checked (`record_problem`):
        what every statistic and a resume read. A record whose fields disagree raises, naming
        its line (`records()` gives the lines as parsed, for checks of the file itself)."""
        return self.checked_records()[0]

    def checked_records(self, skip_invalid: bool = False) -> tuple[list[Record], int]:
        """(the records, how many were skipped): with `skip_invalid` a record whose fields
        disagree is left out and counted instead of refused."""
        out: list[Record] = []
        skipped = 0
        for line, data in self.lines():
            try:
                rec = Record.from_dict(data)
                problem = record_problem(rec)
            except SpecbenchError as e:
                problem = str(e)
            if problem is None:
                out.append(rec)
            elif skip_invalid:
                skipped += 1
            else:
                raise SpecbenchError(f"{self.records_path}:{line}: invalid record: {problem}; fix or delete that "
                                     "line (`cli.py table DIR --skip-invalid` tabulates without it)")
        return out, skipped

    def done_keys(self) -> set[str]:
        """Keys of the answers already recorded: the runner skips them when resuming."""
        return {rec.key for rec in self.read_records()}

    def _repair_tail(self, fd: int) -> None:
        """Make the file end at a line boundary before the first append.

        Cuts off an unparsable partial last line, or terminates a whole-object last line, so the
        next record starts on a line of its own.
        """
        size = os.fstat(fd).st_size
        if size == 0:
            return
        # Find the last newline by reading backwards in blocks: the file can be large.
        pos, tail, block = size, b"", 1 << 16
        while pos > 0:
            start = max(0, pos - block)
            chunk = os.pread(fd, pos - start, start)
            nl = chunk.rfind(b"\n")
            if nl >= 0:
                tail = chunk[nl + 1:] + tail
                pos = start + nl + 1
                break
            tail = chunk + tail
            pos = start
        if not tail:
            return
        try:
            whole = isinstance(json.loads(tail), dict)
        except ValueError:
            whole = False
        if whole:
            os.write(fd, b"\n")
        else:
            os.ftruncate(fd, pos)  # a partial record or stray whitespace
        os.fsync(fd)

    def append(self, rec: Record | dict) -> None:
        """Append one record as one compact JSON line, then flush and fsync.

        Field order is kept as given (a Record's own order; no sort) so records read alike. The line goes out in one
        `write` on an O_APPEND descriptor, so appends from several processes do not interleave.
        """
        if isinstance(rec, Record):
            rec = rec.to_json_dict()
        line = (json.dumps(rec, separators=(",", ":"), default=str) + "\n").encode("utf-8")
        try:
            fd = os.open(self.records_path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                if not self._tail_checked:
                    self._repair_tail(fd)
                    self._tail_checked = True
                view = memoryview(line)
                while view:  # regular files write everything at once; loop for the odd short write
                    n = os.write(fd, view)
                    view = view[n:]
                os.fsync(fd)
            finally:
                os.close(fd)
        except OSError as e:  # a full disk: the answers before stay; a torn last line is cut on resume
            raise SpecbenchError(f"could not append to {self.records_path} ({os_reason(e)}); the answers "
                                 "before it are kept: free space and rerun the same command to resume") from None


def default_run_dir(config: dict, root: Path = Path("results/runs")) -> Path:
    """`root/<config hash>`: rerunning the same config resumes in the same place."""
    return Path(root) / config_hash(config)
