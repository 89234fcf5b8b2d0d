"""Run the official implementations (peers) beside specbench, on the same target, drafter weights
and prompt token ids, into one run folder.

`run_peers` does, in order: check each peer's folder and environment (before anything loads);
fingerprint the peer folders; load the target; write what the peers read (the target in the
layout their transformers reads, our drafter weights in their official layout); run OUR methods
with the peers' settings on those same weights (`run_grid`, the path of every run); then each
peer and its own plain decoding in its own environment (harness/peers/worker.py), turn by turn:
turn 1 from our templated prompt ids, turn 2 from the peer's own turn-1 answer, templated by us
(as our runner continues each method from its own answer). The peers' answers become `Record`s
(`implementation` set, so their speedups pair with the peer's own AR) in the same folder, under
labels like "EAGLE-2 (Spec-Bench)"; meta.json's `peers` says which folder, commit, fingerprint
and package versions made them. A peer folder whose fingerprint changed during the run is an
error: the peers are run, never edited.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

from rich.console import Console

from harness.core.errors import SpecbenchError
from harness.core.hashing import config_hash
from harness.core.paths import REPO_ROOT
from harness.peers.catalog import SHIM_NOTES, Peer, get_peer, implementation
from harness.runs.config import RunConfig
from harness.runs.record import AR_METHOD, Record, Steps, record_key

DEFAULT_PEER_ROOT = Path("../shared/peers")
SETUP = "bash scripts/setup_peers.sh"


# ----------------------------------------------------------------------------- the peers' side of the machine
def peer_venvs() -> Path:
    """Where scripts/setup_peers.sh put the peers' environments ($PEER_VENVS, default .peers/)."""
    return Path(os.environ.get("PEER_VENVS") or REPO_ROOT / ".peers")


def peer_python(peer: Peer) -> Path:
    """The interpreter of the environment `peer` runs in; a missing one names the setup command."""
    exe = peer_venvs() / f"transformers-{peer.transformers}" / "bin" / "python"
    if not exe.exists():
        raise SpecbenchError(f"peer '{peer.name}' needs its environment (transformers {peer.transformers}) at "
                             f"{exe.parent.parent}: run `{SETUP}`")
    return exe


def peer_folder(root: Path, peer: Peer) -> Path:
    folder = Path(root) / peer.folder
    if not folder.is_dir():
        raise SpecbenchError(f"peer '{peer.name}': {folder} not found; pass --peer-root (the folder holding "
                             f"{peer.folder}/, e.g. ../shared/peers)")
    return folder


def folder_fingerprint(folder: Path) -> str:
    """SHA-256 over every file of `folder` (relative path and content), in path order."""
    h = hashlib.sha256()
    for path in sorted(p for p in folder.rglob("*") if p.is_file() and "__pycache__" not in p.parts):
        h.update(str(path.relative_to(folder)).encode() + b"\0")
        h.update(hashlib.sha256(path.read_bytes()).digest())
    return h.hexdigest()


def peer_commit(root: Path, peer: Peer) -> str | None:
    """The commit the peer folder holds, as the peer root's README table says: the third cell of
    the line of `folder/` (`| \\`folder/\\` | source | abc1234 (date) | ... |`)."""
    readme = Path(root) / "README.md"
    if not readme.exists():
        return None
    for line in readme.read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= 3 and cells[0].strip("`").rstrip("/") == peer.folder:
            m = re.match(r"([0-9a-f]{7,40})\b", cells[2])
            return m.group(1) if m else None
    return None


# ----------------------------------------------------------------------------- records
def peer_config(peer: Peer, impl: str) -> dict[str, Any]:
    """A peer row's method config: the implementation that answered and its own settings."""
    return {"implementation": impl, **peer.settings}


def ar_config(impl: str) -> dict[str, Any]:
    return {"implementation": impl}


def trim(output_ids: list[int], accept: list[int], max_new_tokens: int, eos: set[int],
         prefill_step: bool) -> tuple[list[int], list[int]]:
    """A peer's answer cut as ours are (at the first EOS, kept, and at the token limit), and its
    per-step new tokens counted as ours count them: the first token comes from the prefill, then
    each verify step's accepted drafts + bonus, the last step cut to what was kept.

    EAGLE's code prefills apart and then appends each step's root with its accepted drafts (not
    its bonus): the same counts, one token on. A transformers-style loop (`prefill_step`) feeds the
    prompt with its first drafts, so its first step's first token is our prefill's: that step
    counts one token less, and is no verify step of ours when that was all it made."""
    out = list(output_ids[:max_new_tokens])
    for i, t in enumerate(out):
        if t in eos:
            out = out[: i + 1]
            break
    accept = list(accept)
    if prefill_step and accept:
        accept[0] -= 1
        if accept[0] <= 0:
            accept = accept[1:]
    steps, room = [], len(out) - 1
    for a in accept:
        if room <= 0:
            break
        steps.append(min(a, room))
        room -= steps[-1]
    return out, steps


def peer_record(result: dict, probe: dict[str, Any], config: dict[str, Any], impl: str, prompt_len: int,
                cfg: RunConfig, target, max_new_tokens: int) -> Record:
    """The `Record` of one peer answer (the worker's result line) to the prompt `probe` keys."""
    out, steps = trim(result["output_ids"], result["accept_lengths"], max_new_tokens, set(target.eos_token_ids),
                      bool(result.get("prefill_step")))
    is_ar = probe["method"] == AR_METHOD
    stop = "eos" if out and out[-1] in target.eos_token_ids else "length"
    return Record(method=probe["method"], method_config=config, config_hash=probe["config_hash"],
                  target=cfg.target, dtype=str(target.dtype).replace("torch.", ""), device="cpu",
                  benchmark=probe["benchmark"], question_id=probe["question_id"], category=probe.get("category", ""),
                  question_sha256=probe.get("question_sha256"),
                  turn=probe["turn"], temperature=probe["temperature"], top_p=float(cfg.top_p),
                  acceptance=probe["acceptance"], seed=probe["seed"], prompt_tokens=prompt_len,
                  new_tokens=len(out), output_ids=out, stop_reason=stop, wall_s=float(result["wall_s"]),
                  first_token_from_prefill=True,
                  steps=Steps(tokens=steps, accepted=[max(0, s - 1) for s in steps]),
                  implementation=impl, key="")


# ----------------------------------------------------------------------------- one peer run
@contextmanager
def checkpoints_from(folder: Path | None):
    """Our methods read their weights from `folder` (the exported official layouts) meanwhile."""
    old = os.environ.get("SPECBENCH_CHECKPOINTS")
    if folder is not None:
        os.environ["SPECBENCH_CHECKPOINTS"] = str(folder)
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("SPECBENCH_CHECKPOINTS", None)
        else:
            os.environ["SPECBENCH_CHECKPOINTS"] = old


def answered(out: Path) -> list[dict]:
    """The result lines of a worker's output file (a torn last line, from a kill, is left out)."""
    results = []
    for line in (out.read_text().splitlines() if out.exists() else []):
        try:
            results.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return results


def run_worker(python: Path, job: dict, job_file: Path, console: Console, label: str) -> list[dict]:
    """Run the worker on `job` in the peer's environment; returns its result lines (resumed ones too).
    When every prompt is answered already (a resumed run), no environment is started."""
    out = Path(job["out"])
    if {p["key"] for p in job["prompts"]} <= {r.get("key") for r in answered(out)}:
        return answered(out)
    job_file.parent.mkdir(parents=True, exist_ok=True)
    Path(job["out"]).parent.mkdir(parents=True, exist_ok=True)
    job_file.write_text(json.dumps(job))
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "OMP_NUM_THREADS": str(job["threads"]),
           "TRANSFORMERS_VERBOSITY": "error", "HF_HUB_OFFLINE": "1"}
    proc = subprocess.Popen([str(python), "-m", "harness.peers.worker", str(job_file)], cwd=REPO_ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    done = 0
    for line in proc.stdout:
        if line.startswith('{"done"'):
            done += 1
            console.print(f"  {label}: {done} answered", end="\r")
    err = proc.stderr.read() if proc.stderr else ""
    if proc.wait() != 0:
        tail = "\n".join(err.strip().splitlines()[-12:])
        raise SpecbenchError(f"peer '{label}' failed (exit {proc.returncode}); its last lines:\n{tail}")
    return answered(out)


def peer_prompt_ids(target, question, turn: int, history: list[dict]) -> tuple[list[int], list[dict]]:
    """Prompt ids of `turn` of `question` after `history` (the peer's own earlier turns), and the
    messages they hold: templated once, by us, exactly as our runner templates them."""
    messages = history + [{"role": "user", "content": question.turns[turn]}]
    return target.encode_chat(messages), messages


def run_peer_side(peer: Peer, adapter: str, method: str, config: dict[str, Any], impl: str, questions: dict,
                  cfg: RunConfig, target, files: dict[str, Path | None], work: Path, answers: Path,
                  console: Console, existing: set[str], threads: int, peer_root: Path) -> list[Record]:
    """One peer (or its AR: `adapter`/`method`) on every question, turn by turn; returns the new
    records. The worker's raw answers stay in `answers` (the run folder's peer-answers/: what the
    peer printed, and what a killed run resumes from); its job file, which names this machine's
    paths, in `work`."""
    from harness.runs.executor import answer_seed

    chash = config_hash({"method": method, **config})
    temperature = cfg.temperature
    acceptance = "none" if method == AR_METHOD else cfg.rule(temperature)
    histories: dict[tuple[str, int], list[dict]] = {}
    records: list[Record] = []
    turns = max((len(q.turns) for qs in questions.values() for q in qs), default=0)
    tag = config_hash({"adapter": adapter, "impl": impl, **config, "T": temperature})[:12]
    for turn in range(turns):
        prompts, probes = [], {}
        for bench, qs in questions.items():
            for q in qs:
                if turn >= len(q.turns):
                    continue
                ids, messages = peer_prompt_ids(target, q, turn, histories.get((bench, q.question_id), []))
                probe = {"method": method, "config_hash": chash, "benchmark": bench, "question_id": q.question_id,
                         "category": q.category, "question_sha256": q.sha256 or None, "turn": turn,
                         "temperature": float(temperature), "acceptance": acceptance,
                         "seed": answer_seed(cfg.seed, bench, q.question_id, turn)}
                key = record_key({k: v for k, v in probe.items() if k not in ("category", "question_sha256")})
                probes[key] = (probe, ids, messages)
                prompts.append({"key": key, "ids": ids, "max_new_tokens": cfg.max_new_tokens,
                                "temperature": float(temperature), "seed": probe["seed"]})
        if not prompts:
            break
        job = {"adapter": adapter, "peer_dir": str(peer_folder(peer_root, peer).resolve()),
               "base": str(files["base"]), "drafter": str(files["drafter"]) if files.get("drafter") else None,
               "settings": peer.settings, "shims": {k: list(v) for k, v in peer.shims.items()},
               "dtype": str(target.dtype).replace("torch.", ""), "threads": threads,
               "prompts": prompts, "out": str((answers / f"{tag}-turn{turn}.jsonl").resolve()),
               **(files.get("datastore") or {})}
        label = f"{peer.label if method != AR_METHOD else 'AR (' + peer.source + ')'} turn {turn + 1}"
        results = run_worker(peer_python(peer), job, work / f"{tag}-turn{turn}.json", console, label)
        for res in results:
            if res["key"] not in probes:
                continue
            probe, ids, messages = probes[res["key"]]
            rec = peer_record(res, probe, config, impl, len(ids), cfg, target, cfg.max_new_tokens)
            histories[(probe["benchmark"], probe["question_id"])] = messages + [
                {"role": "assistant", "content": target.decode(rec.output_ids).strip()}]
            if rec.key not in existing:
                records.append(rec)
    return records


def run_peers(names: list[str], cfg: RunConfig, out: Path, data_dir: str | Path | None = None,
              peer_root: Path = DEFAULT_PEER_ROOT, console: Console | None = None, threads: int = 1,
              ours: bool = True, target=None) -> Path:
    """Ours and the official implementations of `names` on the same prompts into the run folder
    `out` (resumes); `cfg` holds the benchmarks, limit, token limit, dtype and ONE temperature.
    `ours`: also run our methods with the peers' settings (the comparison; off: peers only).
    `target`: the loaded target of cfg.target (default: loaded here)."""
    from harness.core.target import Target, cache_root
    from harness.runs.benchmarks import load_questions, resolve_data_dir
    from harness.runs.executor import run_grid
    from harness.runs.results import RunDir

    console = console or Console(stderr=True)
    peers = [get_peer(n) for n in dict.fromkeys(names)]
    if len(cfg.temperatures) != 1:
        raise SpecbenchError("peers run at one temperature per run folder: pass one -t")
    for p in peers:  # everything a user can get wrong, before the target loads
        peer_python(p)
        peer_folder(peer_root, p)
    before = {p.folder: folder_fingerprint(peer_folder(peer_root, p)) for p in peers}
    data_dir = resolve_data_dir(data_dir)
    questions = {b: load_questions(b, data_dir, cfg.limit, cfg.ids, cfg.files()) for b in cfg.benchmarks}
    target = target or Target.load(cfg.target, cfg.device, cfg.dtype, cfg.chat_template, cfg.system_prompt)
    work = cache_root() / "peers" / target.name
    checkpoints = work / "checkpoints"
    base = base_view(cfg.target, work)
    drafters = {p.layout: export_official(p.layout, target, checkpoints, console, base) for p in peers if p.layout}
    # Ours: the peers' methods with the peers' settings, on the exported weights.
    settings = {f"{p.method}.{k}": v for p in peers for k, v in p.ours.items()}
    methods = list(dict.fromkeys(p.method for p in peers))
    ours_cfg = replace(cfg, methods=methods, settings={**cfg.settings, **settings})
    if ours:
        with checkpoints_from(checkpoints if drafters else None):
            run_grid(ours_cfg, out, data_dir, console, target=target, command="peers")
    run_dir = RunDir(Path(out))
    if run_dir.read_meta() is None:
        run_dir.open({**ours_cfg.to_dict("peers"), "peers_only": True})
    existing = run_dir.done_keys()
    provenance = dict((run_dir.read_meta() or {}).get("peers") or {})
    for p in peers:
        commit = peer_commit(peer_root, p)
        impl = implementation(p, commit)
        files = {"base": base, "drafter": drafters.get(p.layout), "datastore": peer_datastore(p, target, work)}
        for adapter, method, config, label in (
                (p.ar_adapter, AR_METHOD, ar_config(impl), f"AR ({p.folder})"),
                (p.adapter, p.method, peer_config(p, impl), p.label)):
            recs = run_peer_side(p, adapter, method, config, impl, questions, cfg, target, files, work / "jobs",
                                 Path(out) / "peer-answers", console, existing, threads, peer_root)
            for rec in recs:
                run_dir.append(rec)
                existing.add(rec.key)
            provenance[label] = {"config_hash": config_hash({"method": method, **config}), "method": method,
                                 "peer": p.name, "folder": p.folder, "commit": commit,
                                 "fingerprint": before[p.folder], "transformers": p.transformers,
                                 "settings": p.settings if method != AR_METHOD else {},
                                 "shims": {name: {"modules": list(mods), "what": SHIM_NOTES[name]}
                                           for name, mods in p.shims.items()}}
        console.print(f"{p.label}: done")
    changed = [f for f, h in before.items() if folder_fingerprint(peer_root / f) != h]
    if changed:
        raise SpecbenchError(f"peer folder(s) {', '.join(changed)} changed during the run: the peers must be "
                             f"run unmodified; restore them")
    run_dir.write_extra({"peers": provenance})
    return Path(out)


# ----------------------------------------------------------------------------- what the peers read
def peer_datastore(peer: Peer, target, work: Path) -> dict[str, str]:
    """For a retrieval peer (settings name a `datastore`): our datastore's tokens, which the worker
    writes once into the peer's own index format, at a path keyed by the datastore's meta.json (a
    rebuilt datastore gets a new index). A missing or corrupt datastore stops here, in one line."""
    name = peer.settings.get("datastore")
    if not name:
        return {}
    from methods.common.token_index import datastore_dir, load_datastore

    load_datastore(name, target)
    folder = datastore_dir(name, target.name)
    key = hashlib.sha256((folder / "meta.json").read_bytes()).hexdigest()[:16]
    return {"datastore_tokens": str(folder / "tokens.npy"),
            "datastore_index": str(work / "datastores" / f"{peer.source}-{name}-{key}.idx")}


def base_view(target_spec: str, work: Path) -> Path:
    """The target as the peers' transformers read it (harness/peers/base_view.py), written once."""
    from harness.peers.base_view import base_folder, write_base_view

    view = work / "base"
    if not (view / "config.json").exists():
        write_base_view(base_folder(target_spec), view)
    return view


def export_official(method: str, target, root: Path, console: Console, base: Path) -> Path:
    """Our committed drafter of `method` in its official layout, under root/<target>/<weights name>
    (where our loaders find it through $SPECBENCH_CHECKPOINTS, so both sides read one file), its
    config naming the base view `base` where the layout names a base model (FasterDecoding's
    Medusa loads the base model from there); the export's departures are printed."""
    from harness.peers.export import export_drafter
    from methods.registry import get_method

    folder = root / target.name / get_method(method).weights_name()
    done = export_drafter(method, target, folder, base_model=str(base))
    for line in done.departures:
        console.print(f"[yellow]{method} export[/]: {line}", soft_wrap=True)
    return folder
