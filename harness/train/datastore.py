"""The retrieval corpus of REST's datastore and SAM-Decoding's static automaton, built into a
token index (methods/common/token_index.py) and cached under $SPECBENCH_CACHE/datastores/.

The default corpus is the project's training data and never a benchmark question: every prompt
of the shared training prompt file (its text, tokenized without special tokens) and every
distilled answer under datasets/distill/ made with the target's tokenizer (the stored token ids,
kept as they are: exactly what the target generated, and nothing to decode and re-tokenize).
`--from` names other sources: a JSONL file, or a folder of them, whose lines hold text in
"text", "prompt", "turns" (a list) or "content", or a distill folder (its manifest.json says
which tokenizer made its ids). Each prompt, turn and answer is one document of the index.
"""
from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from harness.core.errors import SpecbenchError
from harness.core.paths import REPO_ROOT, repo_relative
from harness.core.timing import Clock
from methods.common.token_index import TokenIndex, datastore_dir

DEFAULT = "default"
DISTILL_ROOT = REPO_ROOT / "datasets" / "distill"
TEXT_FIELDS = ("text", "prompt", "turns", "content")


@dataclass
class Source:
    """One input of a build: a JSONL file of texts, or a distill folder of token ids."""

    path: Path
    kind: str  # "text" | "distill"

    def files(self) -> list[Path]:
        if self.kind == "distill":
            return sorted(self.path.glob("shard-*.jsonl"))
        return sorted(self.path.glob("*.jsonl")) if self.path.is_dir() else [self.path]


def is_distill_folder(path: Path) -> bool:
    return path.is_dir() and (path / "manifest.json").is_file() and any(path.glob("shard-*.jsonl"))


def distill_vocab(folder: Path) -> str | None:
    try:
        return json.loads((folder / "manifest.json").read_text()).get("vocab_hash")
    except (OSError, ValueError):
        raise SpecbenchError(f"{folder}/manifest.json is unreadable: is it a distill folder?") from None


def default_sources(target, prompts: Path) -> list[Source]:
    """The training prompts plus every distill folder made with the target's tokenizer."""
    if not prompts.is_file():
        raise SpecbenchError(f"training prompt file {prompts} not found; pass --prompts "
                             "(e.g. ../shared/data/train_prompts/prompts.jsonl)")
    vocab = target.vocab_hash()
    folders = [d for d in sorted(DISTILL_ROOT.iterdir()) if is_distill_folder(d) and distill_vocab(d) == vocab] \
        if DISTILL_ROOT.is_dir() else []
    return [Source(prompts, "text")] + [Source(d, "distill") for d in folders]


def resolve_sources(specs: list[str], target, prompts: Path) -> list[Source]:
    """`--from` values as sources: "default" (the default corpus), a distill folder, a JSONL file
    or a folder of JSONL files."""
    out: list[Source] = []
    for spec in specs:
        if spec == DEFAULT:
            out += default_sources(target, prompts)
            continue
        path = Path(spec).expanduser()
        if is_distill_folder(path):
            if distill_vocab(path) != target.vocab_hash():
                raise SpecbenchError(f"--from {spec}: its token ids come from another tokenizer than {target.name}'s")
            out.append(Source(path, "distill"))
        elif path.is_file() or (path.is_dir() and any(path.glob("*.jsonl"))):
            out.append(Source(path, "text"))
        else:
            raise SpecbenchError(f"--from {spec}: no JSONL file, folder of JSONL files or distill folder there")
    if any(s.kind == "text" for s in out) and target.tokenizer is None:
        raise SpecbenchError(f"target {target.name} has no tokenizer: build its datastore from distill folders "
                             "(token ids) only")
    return out


def line_texts(rec: dict) -> list[str]:
    """The texts a JSONL record contributes (one document each)."""
    for key in TEXT_FIELDS:
        value = rec.get(key)
        if isinstance(value, str):
            return [value]
        if isinstance(value, list) and all(isinstance(v, str) for v in value):
            return list(value)
    return []


def documents(source: Source, target) -> Iterator[list[int]]:
    """Token id lists of one source, in file and line order."""
    from harness.train.distill import record_ids

    for file in source.files():
        with file.open() as f:
            for i, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    rec = json.loads(line)
                except json.JSONDecodeError as e:
                    raise SpecbenchError(f"{file}:{i}: not a JSON line ({e})") from None
                if source.kind == "distill":
                    yield record_ids(rec)
                    continue
                texts = line_texts(rec) if isinstance(rec, dict) else []
                if not texts:
                    raise SpecbenchError(f"{file}:{i}: no text in any of the fields {', '.join(TEXT_FIELDS)}")
                for text in texts:
                    yield target.tokenizer.encode(text, add_special_tokens=False)


def sources_digest(sources: list[Source]) -> str:
    """SHA-256 over the sources' file contents: a cached index is reused only for the same data."""
    h = hashlib.sha256()
    for s in sources:
        for file in s.files():
            h.update(f"{s.kind}:{file.name}:".encode())
            h.update(hashlib.sha256(file.read_bytes()).digest())
    return h.hexdigest()


def build_datastore(target, specs: list[str], name: str | None = None, out: Path | None = None,
                    prompts: Path = Path("../shared/data/train_prompts/prompts.jsonl"),
                    force: bool = False) -> tuple[Path, dict, bool]:
    """Build (or find up to date) the datastore of `specs` for `target`; returns (folder, meta,
    built now). Written to `out`, else to the cache under `name` ("default" for the default corpus;
    another corpus needs its own name, so it never shadows the default one)."""
    if out is None:
        if name is None:
            if specs != [DEFAULT]:
                raise SpecbenchError("a datastore of other sources than the default corpus needs --name NAME "
                                     "(then --set rest.datastore=NAME) or --out FOLDER")
            name = DEFAULT
        if "/" in name or name.startswith("."):
            raise SpecbenchError(f"--name {name!r}: a plain name, e.g. my-corpus (or --out FOLDER)")
    folder = out or datastore_dir(name, target.name)
    sources = resolve_sources(specs, target, prompts)
    digest = sources_digest(sources)
    if not force:
        try:
            have = TokenIndex.load(folder, target.vocab_hash())
            if have.meta.get("sources_sha256") == digest:
                return folder, have.meta, False
        except SpecbenchError:
            pass  # missing, stale or corrupt: build it
    clock = Clock(None)
    start = clock.now()
    docs = [doc for s in sources for doc in documents(s, target)]
    meta = {"target": target.name, "vocab_hash": target.vocab_hash(), "sources_sha256": digest,
            "sources": [{"path": repo_relative(s.path), "kind": s.kind} for s in sources]}
    index = TokenIndex.build(docs, meta)
    index.meta["build_s"] = round(clock.now() - start, 1)
    index.save(folder)
    return folder, index.meta, True
