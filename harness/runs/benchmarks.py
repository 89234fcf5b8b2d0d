"""The six evaluation benchmarks (EAGLE / Spec-Bench prompt files): manifest, loading, download, checks.

The manifest `datasets/benchmarks.json` pins every file to the SafeAILab/EAGLE commit and its SHA-256, and
`datasets/question_hashes.json` holds the SHA-256 of every question's line in those files: each record
carries its question line's hash, so whether a run answered the official prompts is decided from its
records (`official_prompts`), byte for byte, whatever data folder a later command was pointed at.
"""
from __future__ import annotations

import hashlib
import json
import os
import tempfile
import urllib.request
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

from harness.core.errors import SpecbenchError, unknown
from harness.core.paths import REPO_ROOT

MANIFEST_PATH = REPO_ROOT / "datasets" / "benchmarks.json"
QUESTION_HASHES_PATH = REPO_ROOT / "datasets" / "question_hashes.json"
DATA_ENV = "SPECBENCH_DATA"

# A copy of the code folders alone (scripts/gpu_check.py on a bare GPU box) has no datasets/: there
# no benchmark is built in, and runs take prompt files.
BENCHMARKS: dict[str, dict] = (json.loads(MANIFEST_PATH.read_text(encoding="utf-8")) if MANIFEST_PATH.is_file()
                               else {})


@dataclass(frozen=True)
class Question:
    """One benchmark prompt: its user turns, in order (2 for MT-Bench, else 1), and the SHA-256
    of its line in the file (the bytes between two newlines): what its records say they answered."""

    benchmark: str
    question_id: int
    category: str
    turns: tuple[str, ...]
    sha256: str = field(default="", compare=False)


@dataclass(frozen=True)
class PromptFile:
    """A user's prompt file run as a benchmark: a question.jsonl in the EAGLE / FastChat /
    Spec-Bench format (`question_id`, `category`, `turns`; other fields ignored). Its SHA-256 goes
    into the run config and every record's key, so a changed file never mixes with an old one."""

    name: str
    path: str     # as the user gave it: relative paths stay relative in meta.json
    sha256: str

    def as_config(self) -> dict[str, str]:
        return {"path": self.path, "sha256": self.sha256}


NAME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-.")


def _is_path(spec: str) -> bool:
    return spec.endswith(".jsonl") or "/" in spec or os.sep in spec or Path(spec).is_file()


def parse_benchmarks(specs: list[str]) -> tuple[list[str], dict[str, PromptFile]]:
    """Benchmark names (built-in, or a prompt file named by its parent folder or by `NAME=PATH`)
    and the prompt files among them. Every file is read and checked here, before any model loads."""
    names: list[str] = []
    files: dict[str, PromptFile] = {}
    for spec in specs:
        if spec in BENCHMARKS:
            name = spec
        elif "=" in spec or _is_path(spec):
            name, _, path = spec.partition("=") if "=" in spec else ("", "", spec)
            name = name.strip() or Path(path).resolve().parent.name
            prompt = _prompt_file(name, path.strip())
            if name in files and files[name] != prompt:
                raise SpecbenchError(f"two prompt files are named '{name}'; name them apart with NAME=PATH")
            files[name] = prompt
        else:
            _check_benchmark(spec)  # unknown: one line with "did you mean"
            name = spec
        if name not in names:
            names.append(name)
    return names, files


def _prompt_file(name: str, path: str) -> PromptFile:
    if name in BENCHMARKS:
        raise SpecbenchError(f"prompt file {path} would be named '{name}', a built-in benchmark; "
                             f"name it with NAME={path}")
    if not name or not set(name) <= NAME_CHARS:
        raise SpecbenchError(f"benchmark name '{name}' for {path}: use letters, digits, '_', '-' or '.' (NAME=PATH)")
    file = Path(path).expanduser()
    if not file.is_file():
        raise SpecbenchError(f"prompt file '{path}' not found: pass a question.jsonl (EAGLE / Spec-Bench format)")
    data = file.read_bytes()
    _parse(name, file)  # malformed lines: one line naming file:line
    return PromptFile(name, path, _sha256(data))


def benchmark_names() -> list[str]:
    """Benchmark names in manifest order (mt_bench, humaneval, gsm8k, alpaca, cnn_dm, nq)."""
    return list(BENCHMARKS)


def _check_benchmark(benchmark: str) -> dict:
    if benchmark not in BENCHMARKS:
        # EAGLE's folder names ("sum", "qa") are what users of its scripts will type first.
        for name, entry in BENCHMARKS.items():
            if entry["eagle_name"] == benchmark:
                raise SpecbenchError(f"benchmark '{benchmark}' is EAGLE's folder name; here it is called '{name}'")
        raise unknown("benchmark", benchmark, BENCHMARKS)
    return BENCHMARKS[benchmark]


def resolve_data_dir(data_dir: str | Path | None) -> Path:
    """The benchmark data folder: `data_dir` if given, else $SPECBENCH_DATA; it must exist."""
    source = "--data-dir"
    if data_dir is None or str(data_dir) == "":
        env = os.environ.get(DATA_ENV, "")
        if not env:
            raise SpecbenchError(
                f"no benchmark data dir: pass --data-dir DIR or set {DATA_ENV} (e.g. ../shared/data), "
                "or download with `cli.py fetch-data DIR`"
            )
        data_dir, source = env, f"${DATA_ENV}"
    path = Path(data_dir).expanduser()
    if not path.is_dir():
        raise SpecbenchError(
            f"benchmark data dir '{path}' (from {source}) does not exist or is not a folder; "
            "point it at the folder holding mt_bench/, humaneval/, ... or run `cli.py fetch-data DIR`"
        )
    return path


def _file_path(benchmark: str, data_dir: Path) -> Path:
    entry = BENCHMARKS[benchmark]
    return data_dir / entry["dir"] / entry["file"]


def _parse(benchmark: str, path: Path) -> list[Question]:
    data = path.read_bytes()
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise SpecbenchError(f"{path}: not valid UTF-8 ({exc.reason}); re-download with `cli.py fetch-data DIR --force`")
    questions: list[Question] = []
    seen: set[int] = set()
    # split(b"\n") rather than a line count: cnn_dm and nq have no final newline; blank lines are skipped.
    for lineno, raw in enumerate(data.split(b"\n"), start=1):
        line = raw.decode("utf-8")
        if not line.strip():
            continue
        where = f"{path}:{lineno}"
        try:
            rec: Any = json.loads(line)
        except json.JSONDecodeError as exc:
            raise SpecbenchError(f"{where}: malformed JSON ({exc.msg} at column {exc.colno}); fix or re-download the file")
        if not isinstance(rec, dict):
            raise SpecbenchError(f"{where}: expected a JSON object per line, got {type(rec).__name__}")
        qid = rec.get("question_id")
        if isinstance(qid, bool) or not isinstance(qid, int):
            raise SpecbenchError(f"{where}: record needs an integer 'question_id'")
        if qid in seen:
            raise SpecbenchError(f"{where}: duplicate question_id {qid}")
        seen.add(qid)
        turns = rec.get("turns")
        if not isinstance(turns, list) or not turns:
            raise SpecbenchError(f"{where}: record {qid} needs a non-empty list 'turns'")
        for i, turn in enumerate(turns, start=1):
            if not isinstance(turn, str) or not turn.strip():
                raise SpecbenchError(f"{where}: record {qid} has an empty or non-string turn {i}")
        category = rec.get("category") or ""
        questions.append(Question(benchmark, qid, str(category), tuple(turns), _sha256(raw)))
    if not questions:
        raise SpecbenchError(f"{path} holds no questions: give a question.jsonl with one JSON object per line")
    return questions


def _stratified(questions: list[Question], limit: int) -> list[Question]:
    # Round-robin over categories (order of first appearance), file order within each, so a small
    # --limit covers every category instead of the first few lines (MT-Bench's first 10 are all "writing").
    groups: dict[str, list[int]] = {}
    for pos, q in enumerate(questions):
        groups.setdefault(q.category, []).append(pos)
    picked: list[int] = []
    depth = 0
    while len(picked) < limit:
        for positions in groups.values():
            if depth < len(positions) and len(picked) < limit:
                picked.append(positions[depth])
        depth += 1
    return [questions[pos] for pos in sorted(picked)]


def load_questions(
    benchmark: str,
    data_dir: str | Path | None = None,
    limit: int | None = None,
    ids: list[int] | None = None,
    files: dict[str, PromptFile] | None = None,
) -> list[Question]:
    """Load a benchmark's questions, in file order: a built-in one from `data_dir`, or the prompt
    file `files[benchmark]` (whose bytes must still have the recorded SHA-256).

    `ids` picks those question ids (all must exist). `limit=N` then takes N spread evenly over the
    categories (deterministic round-robin; see `_stratified`); N >= the count returns everything.
    """
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        raise SpecbenchError(f"--limit must be a positive number of questions, got {limit!r}; omit it to run all")
    if files and benchmark in files:
        prompt = files[benchmark]
        path = Path(prompt.path).expanduser()
        if not path.is_file() or _sha256(path.read_bytes()) != prompt.sha256:
            raise SpecbenchError(f"prompt file {prompt.path} changed or vanished since this run was configured "
                                 f"(sha256 {prompt.sha256[:12]}...); use another --out for the new file")
    else:
        _check_benchmark(benchmark)
        root = resolve_data_dir(data_dir)
        path = _file_path(benchmark, root)
        if not path.is_file():
            raise SpecbenchError(
                f"benchmark file '{path}' is missing; download it with `cli.py fetch-data {root}`"
            )
    questions = _parse(benchmark, path)
    if ids is not None:
        by_id = {q.question_id for q in questions}
        missing = [i for i in dict.fromkeys(ids) if i not in by_id]
        if missing:
            valid = sorted(by_id)
            few = ", ".join(map(str, valid[:5]))
            raise SpecbenchError(
                f"unknown question id(s) {', '.join(map(str, missing))} for {benchmark}; "
                f"valid ids are {valid[0]}..{valid[-1]} ({len(valid)} in all, e.g. {few})"
            )
        wanted = set(ids)
        questions = [q for q in questions if q.question_id in wanted]
    if limit is not None and limit < len(questions):
        questions = _stratified(questions, limit)
    return questions


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def fetch_data(
    dest: Path,
    benchmarks: list[str] | None = None,
    *,
    opener: Callable[[str], Any] = urllib.request.urlopen,
    force: bool = False,
    notify: Callable[[str], None] | None = None,
) -> list[Path]:
    """Download benchmark files from the manifest URLs into `dest/<dir>/question.jsonl`, checking SHA-256.

    A file already present with the right hash is kept unless `force`; one with another hash is moved
    aside (`question.jsonl.bad-<its hash>`, said through `notify` and in any error that follows) before
    the download. A bad download raises and leaves nothing behind (written to a temp file, renamed only
    once verified). `opener(url)` must return a context manager with `.read()` (urlopen; it also
    handles file:// URLs). Returns every requested path.
    """
    names = benchmark_names() if benchmarks is None else list(dict.fromkeys(benchmarks))
    for name in names:
        _check_benchmark(name)
    dest = Path(dest).expanduser()
    if dest.exists() and not dest.is_dir():
        raise SpecbenchError(f"fetch-data destination '{dest}' is a file; pass a folder")
    paths: list[Path] = []
    for name in names:
        entry = BENCHMARKS[name]
        target = _file_path(name, dest)
        paths.append(target)
        moved = ""
        if target.is_file():
            local = _sha256(target.read_bytes())
            if local == entry["sha256"] and not force:
                continue
            if local != entry["sha256"]:
                aside = target.with_name(f"{target.name}.bad-{local[:12]}")
                os.replace(target, aside)
                moved = (f"{target} failed its checksum (sha256 {local[:16]}... != expected "
                         f"{entry['sha256'][:16]}...) and was moved aside to {aside.name}")
                if notify:
                    notify(moved)
                moved = f"; {moved}"
        url = entry["url"]
        try:
            with opener(url) as resp:
                data = resp.read()
        except OSError as exc:  # URLError / HTTPError are OSErrors
            raise SpecbenchError(f"could not download {name} from {url} ({exc}){moved}; check the network or copy "
                                 "the files by hand")
        got = _sha256(data)
        if got != entry["sha256"]:
            raise SpecbenchError(
                f"checksum mismatch for {name} from {url}: sha256 {got[:16]}... != expected "
                f"{entry['sha256'][:16]}...; nothing was written{moved}; retry the download"
            )
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{entry['file']}.", suffix=".part")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.replace(tmp, target)  # atomic on one filesystem: readers never see a half-written file
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
    return paths


def question_file(benchmark: str, data_dir: Path | None, files: dict[str, PromptFile] | None = None) -> Path:
    """The file `benchmark`'s questions are read from: its prompt file, or its file in `data_dir`."""
    if files and benchmark in files:
        return Path(files[benchmark].path).expanduser()
    return _file_path(benchmark, Path(data_dir or "."))


def line_hashes(path: Path) -> dict[int, str]:
    """{question_id: SHA-256 of its line} of a question file (what `datasets/question_hashes.json`
    holds for each official file)."""
    return {q.question_id: q.sha256 for q in _parse(path.parent.name, path)}


@lru_cache(maxsize=1)
def official_line_hashes() -> dict[str, dict[int, str]]:
    """{benchmark: {question_id: SHA-256 of its line in the official file}} (empty without datasets/)."""
    if not QUESTION_HASHES_PATH.is_file():
        return {}
    data = json.loads(QUESTION_HASHES_PATH.read_text(encoding="utf-8"))
    return {b: {int(q): h for q, h in lines.items()} for b, lines in data.items()}


def official_prompts(answered: Iterable[tuple[str, int, str | None]]) -> dict[str, bool | None]:
    """Per benchmark of `answered` ((benchmark, question_id, question line's SHA-256) of each
    record): True when every answer is to the official question line, False when one is not (an
    edited line, a prompt file), None when that is unknown (records written before they carried
    the hash, none of them off)."""
    official = official_line_hashes()
    out: dict[str, bool | None] = {}
    for benchmark, question_id, sha in answered:
        state = out.get(benchmark, True)
        if sha is not None and official.get(benchmark, {}).get(int(question_id)) != sha:
            state = False
        elif sha is None and state is not False:
            state = None
        out[benchmark] = state
    return out


def verify_data_dir(data_dir: str | Path | None) -> dict[str, bool]:
    """For each benchmark file present under `data_dir`: does it match the manifest SHA-256 (official prompts)?

    Missing files are left out of the result.
    """
    root = resolve_data_dir(data_dir)
    result: dict[str, bool] = {}
    for name, entry in BENCHMARKS.items():
        path = _file_path(name, root)
        if path.is_file():
            result[name] = _sha256(path.read_bytes()) == entry["sha256"]
    return result
