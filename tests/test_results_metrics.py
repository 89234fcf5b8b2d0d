"""Run directories, record keys, metadata and metrics on hand-made records (no model loading)."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest

from harness.core import machine_meta
from harness.core.errors import SpecbenchError
from harness.core.hashing import config_hash
from harness.runs import metrics, results
from harness.runs.metrics import (
    SUMMARY_COLUMNS,
    bf16_ulp,
    first_divergence,
    is_near_tie,
    per_depth_acceptance,
    summarize,
    tau,
    write_summary,
)
from harness.runs.record import Record
from harness.runs.results import RunDir, default_run_dir, record_key


def rec(method="pld", qid=0, new_tokens=10, wall_s=1.0, tokens=(), accepted=(), *,
        benchmark="mt_bench", temperature=0.0, acceptance="greedy", turn=0, seed=0, top_p=1.0,
        draft_ms=None, verify_ms=None, divergence=None, from_prefill=True):
    """A minimal answer record with the schema's fields."""
    tokens, accepted = list(tokens), list(accepted)
    r = {
        "method": method, "method_config": {"name": method}, "config_hash": config_hash({"name": method}),
        "checkpoint_hash": None, "target": "tiny", "dtype": "float32", "device": "cpu",
        "benchmark": benchmark, "question_id": qid, "category": "writing", "turn": turn,
        "temperature": temperature, "top_p": top_p,
        "acceptance": "none" if method == "ar" else acceptance, "seed": seed,
        "prompt_tokens": 5, "new_tokens": new_tokens, "output_ids": list(range(new_tokens)),
        "wall_s": wall_s, "prefill_s": 0.1,
        "steps": {
            "tree_size": [4] * len(tokens), "accepted": accepted, "tokens": tokens,
            "draft_ms": list(draft_ms) if draft_ms is not None else [0.0] * len(tokens),
            "verify_ms": list(verify_ms) if verify_ms is not None else [1.0] * len(tokens),
        },
        "first_token_from_prefill": from_prefill,
        "divergence": divergence,
    }
    r["key"] = record_key(r)
    return r


def typed(records):
    """The metrics read Records: hand-made lines go through `Record.from_dict`, as a file's do."""
    return [Record.from_dict(r) for r in records]


def div(near_tie=False, inherited=False):
    return {"position": 3, "top1": 20.0, "gap": 0.1, "near_tie": near_tie, "inherited": inherited}


@pytest.fixture
def run_records():
    """AR and PLD on two greedy prompts; AR takes 5 s for 30 tokens, PLD 2.5 s."""
    return [
        rec("pld", 0, 10, 1.0, [3, 2, 4], [2, 1, 3], draft_ms=[1, 1, 1], verify_ms=[10, 10, 10],
            divergence=div(near_tie=True)),
        rec("pld", 1, 20, 1.5, [4, 4, 4, 4, 3], [3, 3, 3, 3, 2], draft_ms=[2] * 5,
            verify_ms=[20] * 5, divergence=div(inherited=True)),
        rec("ar", 0, 10, 2.0, [1] * 9, [0] * 9),
        rec("ar", 1, 20, 3.0, [1] * 19, [0] * 19),
    ]


# ----------------------------------------------------------------------------- metrics

def test_tau_and_per_depth(run_records):
    pld = typed(r for r in run_records if r["method"] == "pld")
    assert tau(pld) == 28 / 8
    # accepted = 2,1,3,3,3,3,3,2 -> >=1: 8/8, >=2: 7/8, >=3: 5/8
    assert per_depth_acceptance(pld) == [1.0, 0.875, 0.625]
    assert per_depth_acceptance(typed(r for r in run_records if r["method"] == "ar")) == []
    assert [metrics.depth_acceptance(d).of(pld) for d in (1, 3, 4)] == [1.0, 0.625, 0.0]


def test_ar_tau_is_one_with_or_without_steps(run_records):
    ar = typed(r for r in run_records if r["method"] == "ar")
    assert tau(ar) == 1.0
    bare = rec("ar", 2, 7, 1.0)
    del bare["steps"]
    assert tau(typed([bare])) == 1.0
    assert math.isnan(tau(typed([dict(bare, method="pld")])))  # a drafter's record without steps counts none


def test_summarize_exact_numbers(run_records):
    df = summarize(typed(run_records))
    assert list(df.columns) == SUMMARY_COLUMNS
    assert list(df["method"]) == ["ar", "pld"]  # ar first although it appears later
    ar, pld = df.iloc[0], df.iloc[1]
    assert ar["tau"] == 1.0 and ar["speedup"] == 1.0
    assert ar["tokens_per_s"] == 6.0 and ar["ar_tokens_per_s"] == 6.0
    assert pld["answers"] == 2 and pld["new_tokens"] == 30
    assert pld["tau"] == 3.5
    assert pld["tokens_per_s"] == 12.0 and pld["ar_tokens_per_s"] == 6.0
    assert pld["speedup"] == 2.0
    assert pld["draft_ms_per_step"] == 13 / 8 and pld["verify_ms_per_step"] == 130 / 8
    assert pld["mismatches"] == 1 and pld["mismatches_near_tie"] == 1  # the inherited one is not counted
    assert ar["mismatches"] == 0


def test_speedup_pairs_same_prompts_only(run_records):
    # An extra PLD answer without an AR answer stays out of the throughputs; a sampled run pairs
    # with the sampled AR of its temperature, whatever its acceptance rule.
    extra = [
        rec("pld", 9, 100, 1.0, [1] * 99, [0] * 99),
        rec("ar", 0, 10, 4.0, [1] * 9, [0] * 9, temperature=0.7),
        rec("pld", 0, 10, 1.0, [5, 4], [4, 3], temperature=0.7, acceptance="lossless"),
        rec("pld", 5, 10, 1.0, [5, 4], [4, 3], benchmark="gsm8k"),
    ]
    df = summarize(typed(run_records + extra)).set_index(["method", "benchmark", "temperature"])
    greedy = df.loc[("pld", "mt_bench", 0.0)]
    assert greedy["answers"] == 3 and greedy["speedup"] == 2.0 and greedy["tokens_per_s"] == 12.0
    sampled = df.loc[("pld", "mt_bench", 0.7)]
    assert sampled["acceptance"] == "lossless"
    assert sampled["ar_tokens_per_s"] == 2.5 and sampled["speedup"] == 4.0
    lonely = df.loc[("pld", "gsm8k", 0.0)]
    assert math.isnan(lonely["speedup"]) and lonely["tokens_per_s"] == 10.0


def test_answer_sums_pool_variants_with_ar_counted_once():
    """τ and speedup of summary.csv and of the tables are the named metrics TAU and SPEEDUP. Two
    variants of one method answering one prompt share one summary.csv row, in which AR's answer
    counts once; each variant alone is paired with it in full. Weights (a bootstrap) give one
    estimate per resample."""
    a = dict(rec("pld", 0, 10, 1.0, [5, 5], [4, 4]), config_hash="a")
    b = dict(rec("pld", 0, 30, 1.0, [10, 10, 10], [9, 9, 9]), config_hash="b")
    for r in (a, b):
        r["key"] = record_key(r)
    a, b, ar = typed([a, b, rec("ar", 0, 10, 2.0, [1] * 9, [0] * 9)])
    by_prompt = metrics.ar_by_prompt([a, b, ar])
    taus, pairs = metrics.TAU.rows([a, b]), metrics.SPEEDUP.rows([a, b], by_prompt)
    assert float(metrics.TAU.estimate(taus)) == metrics.TAU.of([a, b]) == 40 / 5
    assert metrics.SPEEDUP.sides(pairs) == (20.0, 5.0) and float(metrics.SPEEDUP.estimate(pairs)) == 4.0
    assert metrics.SPEEDUP.of([a], by_prompt) == 2.0
    assert metrics.TAU.estimate(taus, np.array([[1.0, 1.0], [2.0, 0.0], [0.0, 0.0]]))[:2].tolist() == [8.0, 5.0]
    assert math.isnan(metrics.TAU.estimate(taus, np.zeros((1, 2)))[0])  # a resample without a step
    assert math.isnan(metrics.SPEEDUP.of([a]))  # no AR answer to pair with
    reps = metrics.TAU.replicates(taus, ("cell",), resamples=50)
    assert reps.shape == (50,) and set(reps) <= {8.0, 10 / 2, 30 / 3}  # each resample: some mix of a and b
    assert np.array_equal(reps, metrics.TAU.replicates(taus, ("cell",), resamples=50))  # seeded by the cell
    row = summarize([a, b, ar]).set_index("method").loc["pld"]
    assert (row["tau"], row["speedup"], row["tokens_per_s"], row["ar_tokens_per_s"]) == (8.0, 4.0, 20.0, 5.0)


def test_summary_order_and_dedupe(run_records, tmp_path):
    recs = [rec("eagle2", 0, 10, 1.0, [2] * 5, [1] * 5, benchmark="gsm8k")] + run_records
    recs.append(dict(run_records[0]))  # same key again: counted once
    df = summarize(typed(recs))
    assert list(zip(df["method"], df["benchmark"])) == [
        ("ar", "mt_bench"), ("eagle2", "gsm8k"), ("pld", "mt_bench"),
    ]
    assert df.set_index("method").loc["pld", "answers"] == 2
    out = write_summary(typed(recs), tmp_path / "summary.csv")
    text = (tmp_path / "summary.csv").read_text().splitlines()
    assert text[0] == ",".join(SUMMARY_COLUMNS)
    assert out.set_index("method").loc["pld", "draft_ms_per_step"] == 1.62  # 1.625 rounded half-even
    assert summarize([]).columns.tolist() == SUMMARY_COLUMNS


def test_near_tie_rule():
    assert bf16_ulp(20.0) == 0.125
    assert bf16_ulp(-20.0) == 0.125
    assert bf16_ulp(16.0) == 0.125 and bf16_ulp(15.99) == 0.0625
    assert bf16_ulp(1.0) == 2**-7
    assert bf16_ulp(0.0) == 2.0**-133
    assert is_near_tie(20.0, 0.25)
    assert not is_near_tie(20.0, 0.3)
    assert is_near_tie(0.0, 0.0)
    assert not is_near_tie(None, 0.1)


def test_first_divergence():
    top1, gap = [20.0, 20.0, 20.0, 10.0], [1.0, 1.0, 0.2, 3.0]
    assert first_divergence([1, 2, 3], [1, 2, 3], top1, gap, False) is None
    d = first_divergence([1, 2, 9, 4], [1, 2, 3, 4], top1, gap, False)
    assert d == {"position": 2, "top1": 20.0, "gap": 0.2, "near_tie": True, "inherited": False}
    d = first_divergence([5, 2], [1, 2], top1, gap, True)
    assert d["position"] == 0 and d["near_tie"] is False and d["inherited"] is True
    # same tokens, method stopped earlier: position = common length, AR's values there
    d = first_divergence([1, 2, 3], [1, 2, 3, 4], top1, gap, False)
    assert d == {"position": 3, "top1": 10.0, "gap": 3.0, "near_tie": False, "inherited": False}
    # method ran longer than AR: AR has no logits there
    d = first_divergence([1, 2, 3, 4, 5], [1, 2, 3, 4], top1, gap, False)
    assert d == {"position": 4, "top1": None, "gap": None, "near_tie": False, "inherited": False}


# ----------------------------------------------------------------------------- hashes and keys

def test_config_hash_stable_and_order_independent():
    a = {"methods": ["ar", "pld"], "temperature": 0.0, "nested": {"x": 1, "y": [1.5, None]}}
    b = {"nested": {"y": [1.5, None], "x": 1}, "temperature": 0.0, "methods": ["ar", "pld"]}
    assert config_hash(a) == config_hash(b)
    assert len(config_hash(a)) == 12 and set(config_hash(a)) <= set("0123456789abcdef")
    # fixed value: a change here invalidates every existing run directory and record key
    assert config_hash({}) == "44136fa355b3"
    assert config_hash(a) == config_hash(json.loads(json.dumps(a)))
    assert config_hash({"t": 0.0}) != config_hash({"t": 0.7})
    assert default_run_dir(a) == default_run_dir(b)
    assert default_run_dir(a).parts[-3:-1] == ("results", "runs")


def test_record_key():
    r = rec("pld", 7, turn=1, temperature=0, seed=3)
    assert record_key(r) == f"pld|{config_hash({'name': 'pld'})}|mt_bench|7|1|0.0|greedy|3"
    assert record_key(dict(r, temperature=0.0)) == record_key(r)


# ----------------------------------------------------------------------------- metadata

def test_collect_meta_has_keys():
    meta = machine_meta.collect_meta()
    for key in ("commit", "dirty", "date", "python", "packages", "torch_threads", "platform",
                "cpu_model", "cpu_kind", "cpu_flags", "logical_cores", "memory_gib", "gpu", "load_avg_1m",
                "hostname"):
        assert key in meta
    assert set(meta["packages"]) >= {"torch", "transformers", "accelerate", "gguf", "pandas",
                                     "numpy", "specbench"}
    assert set(meta["cpu_flags"]) == {"avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile"}
    assert meta["date"].endswith("+00:00")
    json.dumps(meta)  # meta.json must be able to hold it
    from harness.core.hardware import cpu_flags, has_fast_bf16

    assert meta["cpu_flags"] == cpu_flags()
    # bf16 is fast with AMX or AVX512-BF16 kernels; plain AVX-512 or AVX2 emulate it; unknown flags count as absent
    flag_sets = [{"amx_bf16": True, "amx_tile": True}, {"avx512f": True, "avx512_bf16": True},
                 {"avx512f": True, "avx2": True}, {"avx2": True}, {}]
    assert [has_fast_bf16(f) for f in flag_sets] == [True, True, False, False, False]


def test_contention_warning_reads_other_processes_cpu_use(monkeypatch):
    monkeypatch.setattr(machine_meta.os, "cpu_count", lambda: 4)
    used = {"cores": 0.1}
    monkeypatch.setattr(machine_meta.OtherCpuUse, "__exit__", lambda self, *exc: setattr(self, "cores", used["cores"]))
    assert machine_meta.contention_warning(sample_s=0) is None
    used["cores"] = 1.2
    assert "1.20" in machine_meta.contention_warning(sample_s=0)
    assert machine_meta.contention_warning(cores=2, sample_s=0) is None  # 2 cores left free absorb it
    used["cores"] = None  # no /proc/stat: no check
    assert machine_meta.contention_warning(sample_s=0) is None


# ----------------------------------------------------------------------------- run directory

@pytest.fixture
def fake_meta(monkeypatch):
    # collect_meta imports torch and runs git: real once in test_collect_meta_has_keys is enough.
    monkeypatch.setattr(results, "collect_meta", lambda: {"commit": "abc", "dirty": False})


def test_rundir_open_resume_and_refuse(tmp_path, fake_meta, run_records):
    config = {"methods": ["ar", "pld"], "temperature": 0.0}
    run = RunDir(tmp_path / "run")
    run.open({"methods": ["ar"]})  # no record yet: the next config starts the folder anew
    run.open(config)
    meta = json.loads(run.meta_path.read_text())
    assert meta["config"] == config and meta["config_hash"] == config_hash(config)
    assert meta["commit"] == "abc" and len(meta["runs"]) == 1
    RunDir(tmp_path / "run").open({"temperature": 0.0, "methods": ["ar", "pld"]})  # resume
    assert len(json.loads(run.meta_path.read_text())["runs"]) == 2
    run.append(run_records[0])  # an answer binds the folder to its config
    with pytest.raises(SpecbenchError, match=r"another config .*temperature: 0\.0 vs 0\.7"):
        RunDir(tmp_path / "run").open({"methods": ["ar", "pld"], "temperature": 0.7})
    assert run.records_path.name == "records.jsonl" and run.summary_path.name == "summary.csv"


def test_rundir_records_append_and_done_keys(tmp_path, fake_meta, run_records):
    run = RunDir(tmp_path / "run")
    assert run.records() == [] and run.done_keys() == set()
    run.open({"a": 1})
    for r in run_records:
        run.append(r)
    assert run.records() == run_records
    assert list(run.records()[0]) == list(run_records[0])  # field order kept
    assert run.done_keys() == {r["key"] for r in run_records}


def test_rundir_survives_truncated_last_line(tmp_path, fake_meta, run_records):
    run = RunDir(tmp_path / "run")
    run.open({"a": 1})
    run.append(run_records[0])
    run.append(run_records[1])
    with open(run.records_path, "a") as f:  # a crash in the middle of a write
        f.write(json.dumps(run_records[2])[:40])
    assert run.records() == run_records[:2]
    resumed = RunDir(tmp_path / "run")
    resumed.append(run_records[2])
    resumed.append(run_records[3])
    lines = run.records_path.read_text().splitlines()
    assert [json.loads(line) for line in lines] == run_records  # every line valid again


def test_rundir_whole_last_record_without_newline_is_kept(tmp_path, fake_meta, run_records):
    run = RunDir(tmp_path / "run")
    run.open({"a": 1})
    run.records_path.write_text(json.dumps(run_records[0]))
    assert run.records() == run_records[:1]
    RunDir(tmp_path / "run").append(run_records[1])
    assert [json.loads(x) for x in run.records_path.read_text().splitlines()] == run_records[:2]


def test_rundir_malformed_middle_line_raises(tmp_path, fake_meta, run_records):
    run = RunDir(tmp_path / "run")
    run.open({"a": 1})
    run.records_path.write_text(
        json.dumps(run_records[0]) + "\n{not json\n" + json.dumps(run_records[1]) + "\n"
    )
    with pytest.raises(SpecbenchError, match=r"records\.jsonl:2: malformed"):
        run.records()


def test_rundir_refuses_records_without_meta(tmp_path, fake_meta, run_records):
    run = RunDir(tmp_path / "run")
    run.path.mkdir()
    run.append(run_records[0])
    with pytest.raises(SpecbenchError, match="no meta.json"):
        run.open({"a": 1})


def test_attach_divergences_marks_later_turns_inherited():
    from harness.runs.metrics import attach_divergences

    def rec(method, turn, out, seed):
        r = {"method": method, "config_hash": method, "benchmark": "mt_bench", "question_id": 81, "turn": turn,
             "temperature": 0.0, "top_p": 1.0, "seed": seed, "output_ids": out, "acceptance": "greedy"}
        if method == "ar":
            r.update(ar_top1=[20.0] * len(out), ar_gap=[0.1] * len(out))
        return r

    # Seeds differ per turn (as the runner derives them); turn 0 diverges, so turn 1 is inherited.
    recs = [rec("ar", 0, [1, 2, 3], 11), rec("ar", 1, [4, 5], 22), rec("pld", 0, [1, 9, 3], 11),
            rec("pld", 1, [7, 5], 22)]
    recs = attach_divergences(typed(recs))
    assert recs[2].divergence["position"] == 1 and not recs[2].divergence["inherited"]
    assert recs[3].divergence["inherited"] is True
    assert recs[0].divergence is None and recs[0].to_json_dict().get("divergence") is None


def test_summary_reports_what_other_processes_used(run_records):
    """other_cpu_cores: the mean over a cell's answers that measured it; NaN for runs before it existed."""
    import math

    recs = [dict(r) for r in run_records]
    pld = [r for r in recs if r["method"] == "pld"]
    pld[0]["other_cpu_cores"], pld[1]["other_cpu_cores"] = 0.1, 0.4
    df = summarize(typed(recs)).set_index("method")
    assert df.loc["pld", "other_cpu_cores"] == 0.25
    assert math.isnan(df.loc["ar", "other_cpu_cores"])
