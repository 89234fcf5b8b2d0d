"""The token index of REST's datastore and SAM-Decoding's static automaton: every query against a
brute-force answer on random corpora (with document ends), the checks that make a missing,
corrupt or foreign datastore one line, and `cli.py datastore build` on the default corpus shape."""
from __future__ import annotations

import json
import random

import numpy as np
import pytest

from harness.core.errors import SpecbenchError
from methods.common.token_index import SEPARATOR, TokenIndex, datastore_dir, load_datastore, suffix_array
from tests.conftest import make_tiny_target


def occurrences(flat: list[int], pattern: list[int]) -> list[int]:
    return [i for i in range(len(flat)) if flat[i:i + len(pattern)] == pattern]


def random_docs(rng: random.Random, n: int = 25, vocab: int = 4) -> list[list[int]]:
    return [[rng.randrange(vocab) for _ in range(rng.randint(1, 30))] for _ in range(n)]


def test_suffix_array_is_the_sorted_suffixes():
    rng = random.Random(0)
    for _ in range(300):
        toks = np.array([rng.choice([SEPARATOR, 0, 1, 2]) for _ in range(rng.randint(0, 50))], dtype=np.int32)
        assert suffix_array(toks).tolist() == sorted(range(toks.size), key=lambda i: toks[i:].tolist())


def test_find_and_longest_suffix_agree_with_brute_force():
    rng = random.Random(1)
    index = TokenIndex.build(random_docs(rng))
    flat = index.tokens.tolist()
    for _ in range(400):
        pattern = [rng.randrange(4) for _ in range(rng.randint(1, 6))]
        lo, hi = index.find(pattern)
        assert sorted(index.suffixes[lo:hi].tolist()) == occurrences(flat, pattern)
        context = [rng.randrange(4) for _ in range(rng.randint(1, 12))]
        length, lo, hi = index.longest_suffix(context, max_len=8, min_len=2)
        want = max((n for n in range(2, min(8, len(context)) + 1) if occurrences(flat, context[-n:])), default=0)
        assert length == want
        if want:
            assert sorted(index.suffixes[lo:hi].tolist()) == occurrences(flat, context[-want:])


def test_extend_match_tracks_the_longest_suffix_in_the_corpus():
    """SAM-Decoding's static automaton on the suffix array: after each token, the longest suffix
    of the stream that occurs anywhere in the corpus, with no length cap."""
    rng = random.Random(2)
    docs = random_docs(rng, n=10, vocab=3)
    index = TokenIndex.build(docs)
    flat = index.tokens.tolist()
    stream = docs[3][:] + [rng.randrange(3) for _ in range(60)]  # starts with a whole document
    match = index.empty_match()
    for i in range(len(stream)):
        match = index.extend_match(match, stream[: i + 1])
        want = max((n for n in range(1, i + 2) if occurrences(flat, stream[i + 1 - n: i + 1])), default=0)
        assert match[0] == want, i
        if want:
            length, lo, hi = match
            assert sorted(index.suffixes[lo:hi].tolist()) == occurrences(flat, stream[i + 1 - want: i + 1])
            assert index.first_start(lo, hi) == occurrences(flat, stream[i + 1 - want: i + 1])[0]


def test_continuations_and_next_tokens_stop_at_document_ends():
    index = TokenIndex.build([[5, 1, 2], [5, 1, 3, 4], [5, 1, 3]])
    lo, hi = index.find([5, 1])
    rows = index.continuations(lo, hi, 2, 3, limit=10)
    assert sorted(map(tuple, rows.tolist())) == [(2, -1, -1), (3, -1, -1), (3, 4, -1)]
    assert index.next_tokens(lo, hi, 2, k=8) == [(3, 2), (2, 1)]
    assert index.continuation(index.first_start(lo, hi) + 2, 5) == [2]
    assert index.continuations(lo, hi, 2, 3, limit=1).shape == (1, 3)


def test_a_saved_index_loads_and_a_broken_one_is_one_line(tmp_path):
    index = TokenIndex.build([[1, 2, 3], [2, 3, 4]], {"vocab_hash": "v1"})
    index.save(tmp_path / "ds")
    back = TokenIndex.load(tmp_path / "ds", "v1")
    assert back.tokens.tolist() == index.tokens.tolist() and back.suffixes.tolist() == index.suffixes.tolist()
    with pytest.raises(SpecbenchError, match="another tokenizer"):
        TokenIndex.load(tmp_path / "ds", "v2")
    with pytest.raises(SpecbenchError, match="no datastore at .*; build it"):
        TokenIndex.load(tmp_path / "nothing", "v1", "build it")
    tokens = np.load(tmp_path / "ds" / "tokens.npy")
    tokens[1] += 1
    np.save(tmp_path / "ds" / "tokens.npy", tokens)
    with pytest.raises(SpecbenchError, match="corrupt"):
        TokenIndex.load(tmp_path / "ds", "v1")
    (tmp_path / "ds" / "suffixes.npy").write_bytes(b"torn")
    with pytest.raises(SpecbenchError, match="unreadable"):
        TokenIndex.load(tmp_path / "ds", "v1")


def test_the_default_datastore_is_looked_up_in_the_cache(tmp_path, monkeypatch, tiny_target):
    monkeypatch.setenv("SPECBENCH_CACHE", str(tmp_path))
    with pytest.raises(SpecbenchError, match=r"datastore build --target tiny-llama`"):
        load_datastore("default", tiny_target)
    TokenIndex.build([[1, 2, 3]], {"vocab_hash": tiny_target.vocab_hash()}).save(datastore_dir("default", "tiny-llama"))
    assert load_datastore("default", tiny_target).size == 4


def write_distill(folder, vocab_hash: str, responses: list[list[int]]) -> None:
    """A distill folder as `cli.py distill` writes it (2-byte ids)."""
    from harness.train.distill import encode_ids

    folder.mkdir(parents=True)
    (folder / "manifest.json").write_text(json.dumps({"vocab_hash": vocab_hash}))
    (folder / "shard-00000.jsonl").write_text("".join(
        json.dumps({"prompt_id": str(i), "response": encode_ids(r)}) + "\n" for i, r in enumerate(responses)))


def test_datastore_build_reads_distill_ids_and_caches(tmp_path, monkeypatch, tiny_target):
    """Distill folders are read as ids; the build is cached until the sources change; text needs a
    tokenizer (the tiny target has none: one line); another corpus needs its own name."""
    from harness.train.datastore import build_datastore

    monkeypatch.setenv("SPECBENCH_CACHE", str(tmp_path / "cache"))
    folder = tmp_path / "answers"
    write_distill(folder, tiny_target.vocab_hash(), [[1, 2, 3], [4, 5]])
    path, meta, built = build_datastore(tiny_target, [str(folder)], name="mine")
    assert built and meta["documents"] == 2 and path == datastore_dir("mine", "tiny-llama")
    assert load_datastore("mine", tiny_target).tokens.tolist() == [1, 2, 3, SEPARATOR, 4, 5, SEPARATOR]
    assert build_datastore(tiny_target, [str(folder)], name="mine")[2] is False   # up to date: reused
    write_distill(tmp_path / "more", tiny_target.vocab_hash(), [[7]])
    assert build_datastore(tiny_target, [str(folder), str(tmp_path / "more")], name="mine")[2] is True
    with pytest.raises(SpecbenchError, match="needs --name"):
        build_datastore(tiny_target, [str(folder)])
    text = tmp_path / "texts.jsonl"
    text.write_text(json.dumps({"text": "hello"}) + "\n")
    with pytest.raises(SpecbenchError, match="has no tokenizer"):
        build_datastore(tiny_target, [str(text)], name="t")
    write_distill(tmp_path / "other", "another-vocab", [[1]])
    with pytest.raises(SpecbenchError, match="another tokenizer"):
        build_datastore(tiny_target, [str(tmp_path / "other")], name="o")


def test_datastore_build_cli_writes_and_reports(tmp_path, monkeypatch):
    """The command end to end on the tiny target (a distill folder of ids); a bad source is one line."""
    from typer.testing import CliRunner

    from cli import app

    folder = tmp_path / "answers"
    write_distill(folder, make_tiny_target(name="tiny").vocab_hash(), [[1, 2, 3], [4, 5]])
    monkeypatch.setenv("SPECBENCH_CACHE", str(tmp_path / "cache"))
    res = CliRunner().invoke(app, ["datastore", "build", "--target", "tiny", "--from", str(folder), "--name", "x"])
    assert res.exit_code == 0, res.output
    assert "2 documents, 7 tokens" in res.output and "built in" in res.output
    res = CliRunner().invoke(app, ["datastore", "build", "--target", "tiny", "--from", str(tmp_path / "none"),
                                   "--name", "x"])
    assert res.exit_code == 2 and res.output.strip().startswith("error:") and len(res.output.strip().splitlines()) == 1


@pytest.mark.parametrize("method,key", [("rest", "datastore"), ("samd", "corpus")])
def test_a_run_without_its_datastore_is_one_line(tmp_path, monkeypatch, shared_data, method, key):
    """`cli.py run -m rest|samd` with no datastore built (or a corrupt one): one line naming the
    command that builds it, exit 2."""
    from typer.testing import CliRunner

    from cli import app
    from tests.test_faults import error_line

    monkeypatch.setenv("SPECBENCH_CACHE", str(tmp_path / "cache"))
    args = ["run", "-m", method, "--target", "tiny", "-b", "gsm8k", "--limit", "1", "--max-new-tokens", "4",
            "--dtype", "float32", "--data-dir", str(shared_data), "--out", str(tmp_path / "run")]
    line = error_line(CliRunner().invoke(app, args))
    assert "no datastore at" in line and "datastore build --target tiny" in line
    TokenIndex.build([[1, 2]], {"vocab_hash": "x"}).save(tmp_path / "ds")
    (tmp_path / "ds" / "tokens.npy").write_bytes(b"torn")
    assert "unreadable" in error_line(CliRunner().invoke(app, [*args, "--set", f"{method}.{key}={tmp_path / 'ds'}"]))
