"""A run folder read for its statistics: its records (deduplicated, divergences from AR attached)
grouped into table rows, with meta.json beside them. `load_run` is where tables, plots, the run
folder's README and the τ baselines all start.

Rows are (temperature, method or ablation variant, acceptance rule), in the methods' declared
order; AR is the reference every speedup is measured against and has rows of its own
(`ar_rows`). How a row is named in every table and plot (`row_label`) is decided here too.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from harness.core.errors import SpecbenchError
from harness.core.hardware import cpu_kind
from harness.runs.metrics import attach_divergences, dedupe
from harness.runs.record import AR_METHOD, Record
from harness.runs.results import RunDir
from harness.runs.method_display import method_display

MEAN = "mean"   # the column after the benchmarks: their arithmetic mean


def fmt_temperature(t: float) -> str:
    return f"{t:g}"


def display_label(name: str, method: str | None = None) -> str:
    """`name` (a method, `method [hash]`, or an ablation variant's label) as tables and plots print
    it: a method's display name (harness/runs/method_display.py), a variant's own label."""
    method = method or name
    shown = method_display(method).display_name
    if name == method:
        return shown
    if name.startswith(f"{method} ["):  # one method under several unlabelled configs
        return shown + name[len(method):]
    return name


def row_label(name: str, acceptance: str, lossy: bool, method: str | None = None,
              departures: tuple[str, ...] = ()) -> str:
    """How a row is named in every table and plot: the display name, then what the row changes of
    the paper's algorithm (`Drafter.departures`); lossy rows say so."""
    shown = display_label(name, method)
    notes = [*departures, *((acceptance, "lossy") if lossy else ())]
    return f"{shown} ({', '.join(notes)})" if notes else shown


@dataclass(frozen=True)
class Row:
    """One table row: a method (or ablation variant) at one temperature under one acceptance rule."""

    temperature: float
    method: str
    config_hash: str
    acceptance: str
    name: str  # method name, or the variant's label in an ablation
    lossy: bool = False
    departures: tuple[str, ...] = ()  # how its config departs from the paper's algorithm

    @property
    def label(self) -> str:
        return row_label(self.name, self.acceptance, self.lossy, self.method, self.departures)


@dataclass
class RunData:
    path: Path
    records: list[Record]
    meta: dict
    benchmarks: list[str]
    rows: list[Row]        # AR excluded; temperature ascending, then the run's method order
    ar_rows: list[Row]
    parameters: dict[str, int]  # config hash -> drafter parameters (meta.json)
    ablation: dict | None = None
    _by_row: dict[Row, list[Record]] = field(default_factory=dict)
    skipped: int = 0       # invalid records left out (--skip-invalid); the captions count them

    @property
    def columns(self) -> list[str]:
        """Benchmarks, then the Mean (left out when there is a single benchmark)."""
        return [*self.benchmarks, MEAN] if len(self.benchmarks) > 1 else list(self.benchmarks)

    @property
    def temperatures(self) -> list[float]:
        return sorted({r.temperature for r in self.rows + self.ar_rows})

    def row_records(self, row: Row, benchmark: str | None = None) -> list[Record]:
        recs = self._by_row.get(row, [])
        return recs if benchmark is None else [r for r in recs if r.benchmark == benchmark]

    def setting(self) -> tuple[str, str, str]:
        """(target, dtype, machine) the records were measured with, from the records and meta.json:
        the machine is the GPU's name, else the CPU kind (derived from the CPU model and flags for
        folders written before meta.json stored it) and the torch threads."""
        def values(found: list[str | None], key: str) -> str:
            shown = dict.fromkeys(str(v) for v in found if v)
            return ", ".join(shown) or str(self.meta.get("config", {}).get(key) or "?")

        meta = self.meta
        if meta.get("gpu"):
            machine = str(meta["gpu"])
        else:
            machine = meta.get("cpu_kind") or (cpu_kind(meta.get("cpu_model") or "", meta["cpu_flags"])
                                               if meta.get("cpu_flags") else meta.get("cpu_model")) or "CPU not recorded"
            threads = meta.get("torch_threads")
            if threads:
                machine += f", {threads} thread{'s' if threads != 1 else ''}"
        return (values([r.target for r in self.records], "target"), values([r.dtype for r in self.records], "dtype"),
                machine)

    def multi_variant(self) -> bool:
        """True when one method appears in several configs (an ablation): colour by variant."""
        configs: dict[str, set[str]] = {}
        for r in self.rows:
            configs.setdefault(r.method, set()).add(r.config_hash)
        return any(len(c) > 1 for c in configs.values())


def _departures(method: str, config: dict) -> tuple[str, ...]:
    """How a record's config departs from its paper's algorithm (`Drafter.departures`): code of the
    method's class, so this (not the module's import) imports the method and torch."""
    from methods.registry import method_departures

    return tuple(method_departures(method, config))


def _row_of(rec: Record, names: dict[str, str]) -> Row:
    chash = rec.config_hash or ""
    name = names.get(chash, rec.method)
    # A labelled variant (an ablation's, a peer's) says what it is itself.
    departures = _departures(rec.method, rec.method_config) if name == rec.method else ()
    return Row(rec.temperature, rec.method, chash, rec.acceptance, name, rec.lossy, departures)


def load_run(path: Path, skip_invalid: bool = False) -> RunData:
    """Records (deduplicated by key) and meta of a run folder, with its rows in table order. A
    record whose fields disagree (harness/runs/record.py:record_problem) is refused, naming its
    line; with `skip_invalid` it is left out and counted (`RunData.skipped`)."""
    rd = RunDir(Path(path))
    if not rd.records_path.exists():
        raise SpecbenchError(f"{path} has no records.jsonl: not a run directory")
    meta = rd.read_meta() or {}
    checked, skipped = rd.checked_records(skip_invalid)
    records = attach_divergences(dedupe(checked))
    if not records:
        raise SpecbenchError(f"{rd.records_path} holds no records yet")
    config = meta.get("config", {})
    resolved = config.get("methods_resolved") or {}
    # Names by config hash: the method, or the variant label that keyed it in meta.json.
    names: dict[str, str] = {}
    parameters: dict[str, int] = {}
    for label, entry in resolved.items():
        if isinstance(entry, dict) and entry.get("config_hash"):
            names[entry["config_hash"]] = label
            parameters[entry["config_hash"]] = int(entry.get("parameters") or 0)
    # Official implementations run beside ours (harness/peers): their rows by their own labels.
    for label, entry in (meta.get("peers") or {}).items():
        names[entry["config_hash"]] = label
    # The same method name under several unlabelled configs: tell them apart by hash.
    hashes_per_method: dict[str, set[str]] = {}
    for rec in records:
        hashes_per_method.setdefault(rec.method, set()).add(rec.config_hash or "")
    for rec in records:
        chash = rec.config_hash or ""
        if chash not in names and len(hashes_per_method[rec.method]) > 1:
            names[chash] = f"{rec.method} [{chash[:6]}]"

    by_row: dict[Row, list[Record]] = {}
    for rec in records:
        by_row.setdefault(_row_of(rec, names), []).append(rec)
    label_order = {label: i for i, label in enumerate(resolved)}
    first_seen: dict[str, int] = {}
    for rec in records:
        first_seen.setdefault(_row_of(rec, names).name, len(first_seen))
    accept_seen: dict[str, int] = {}
    for rec in records:
        accept_seen.setdefault(rec.acceptance, len(accept_seen))

    def order(row: Row) -> tuple:  # methods in their declared order; a method's variants as the run listed them
        return (row.temperature, method_display(row.method).order,
                label_order.get(row.name, len(label_order) + first_seen[row.name]), accept_seen[row.acceptance])

    rows = sorted((r for r in by_row if r.method != AR_METHOD), key=order)
    ar_rows = sorted((r for r in by_row if r.method == AR_METHOD), key=order)
    present = list(dict.fromkeys(r.benchmark for r in records))
    wanted = [b for b in config.get("benchmarks", []) if b in present]
    benchmarks = wanted + [b for b in present if b not in wanted]
    return RunData(Path(path), records, meta, benchmarks, rows, ar_rows, parameters,
                   config.get("ablation"), by_row, skipped)
