"""Other machines, simulated: the dtype `auto` picks and what `regress` refuses or only warns about,
with faked CPU flags (Sapphire Rapids with AMX, an AMD EPYC with AVX512-BF16 only, an AVX2-only
CPU) and GPUs, so CI on one kind of machine proves the behaviour on the others."""
from __future__ import annotations

import json

import pytest
import torch
from typer.testing import CliRunner

from cli import app
from harness.core import hardware
from harness.core.errors import SpecbenchError
from harness.core.machine_meta import collect_meta
from harness.core.target import resolve_dtype
from harness.runs import regress
from tests.test_regress import edit_json, edit_records
from tests.test_report import write_run

cli = CliRunner()

FLAGS = {
    "sapphire-rapids": {"avx2": True, "avx512f": True, "avx512_bf16": True, "amx_bf16": True, "amx_tile": True},
    "epyc": {"avx2": True, "avx512f": True, "avx512_bf16": True, "amx_bf16": False, "amx_tile": False},
    "skylake": {"avx2": True, "avx512f": True, "avx512_bf16": False, "amx_bf16": False, "amx_tile": False},
    "avx2": {"avx2": True, "avx512f": False, "avx512_bf16": False, "amx_bf16": False, "amx_tile": False},
}
MODELS = {"sapphire-rapids": "Intel(R) Xeon(R) Platinum 8488C", "epyc": "AMD EPYC", "skylake": "Intel Xeon Gold 6148",
          "avx2": "AMD Ryzen 7 3700X"}


def fake_cpu(monkeypatch, kind: str) -> None:
    """Make this process see the CPU `kind` (model name and /proc/cpuinfo flags)."""
    flags = frozenset(f for f, on in FLAGS[kind].items() if on) | {"sse2", "fma"}
    monkeypatch.setattr(hardware, "_cpuinfo", lambda: (MODELS[kind], flags))


@pytest.mark.parametrize("kind,dtype,cls", [
    ("sapphire-rapids", torch.bfloat16, "amx"), ("epyc", torch.bfloat16, "avx512-bf16"),
    ("skylake", torch.float32, "avx512"), ("avx2", torch.float32, "avx2"),
])
def test_auto_dtype_and_recorded_kind_follow_the_cpu_flags(monkeypatch, kind, dtype, cls):
    fake_cpu(monkeypatch, kind)
    assert resolve_dtype("auto", torch.device("cpu")) == dtype
    assert resolve_dtype("float32", torch.device("cpu")) == torch.float32  # an explicit dtype always wins
    assert hardware.bf16_class(hardware.cpu_flags()) == cls
    meta = collect_meta()
    assert meta["cpu_flags"] == FLAGS[kind] and meta["cpu_model"] == MODELS[kind]
    assert meta["cpu_kind"].startswith(MODELS[kind])


def test_cpu_kind_names_the_bf16_kernels():
    assert hardware.cpu_kind("AMD EPYC", FLAGS["epyc"]) == "AMD EPYC (AVX512-BF16, no AMX)"
    assert hardware.cpu_kind("X", FLAGS["sapphire-rapids"]) == "X (AMX-BF16)"
    assert hardware.cpu_kind("", {}) == "unknown CPU (no x86 SIMD flags)"  # None means this machine


def test_auto_dtype_on_gpus():
    assert hardware.auto_dtype("cuda", cuda_bf16=True) == "bfloat16"    # A100, H100
    assert hardware.auto_dtype("cuda", cuda_bf16=False) == "float16"    # V100, T4
    assert hardware.auto_dtype("cuda", FLAGS["avx2"], cuda_bf16=True) == "bfloat16"  # the host CPU is irrelevant


# ----------------------------------------------------------------------------- provenance

def prov(kind: str | None, dtype: str = "float32", gpu: str | None = None) -> dict:
    device = "cuda" if gpu else "cpu"
    return {"target": "smollm2-135m", "dtype": dtype, "device": device, "max_new_tokens": 32,
            "cpu_flags": None if gpu else FLAGS[kind], "cpu_model": None if gpu else MODELS[kind], "gpu": gpu,
            "prompts": {}, "checkpoints": {}}


CPUS = list(FLAGS)


@pytest.mark.parametrize("base", CPUS)
@pytest.mark.parametrize("run", CPUS)
def test_float32_tau_is_compared_across_cpu_kinds_with_a_warning(base, run):
    warnings = regress.check_provenance(prov(base), prov(run), set(), set())
    if base == run:
        assert warnings == []
    else:
        assert warnings and all("compared anyway" in w for w in warnings)
        differing = sorted(f for f in FLAGS[base] if FLAGS[base][f] != FLAGS[run][f])
        assert [w.split()[0] for w in warnings if w.startswith("cpu_flags")] == [f"cpu_flags.{f}" for f in differing]


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("base", CPUS)
@pytest.mark.parametrize("run", CPUS)
def test_half_precision_tau_is_refused_across_bf16_kernels(dtype, base, run):
    same_kernels = all(FLAGS[base][f] == FLAGS[run][f] for f in hardware.BF16_KERNEL_FLAGS)
    if same_kernels:
        regress.check_provenance(prov(base, dtype), prov(run, dtype), set(), set())
    else:
        with pytest.raises(SpecbenchError, match=r"refusing to compare: cpu_flags\.(amx|avx512_bf16)"):
            regress.check_provenance(prov(base, dtype), prov(run, dtype), set(), set())


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_gpus_are_compared_only_with_the_same_gpu(dtype):
    a, b = prov(None, dtype, gpu="NVIDIA H100 80GB HBM3"), prov(None, dtype, gpu="NVIDIA A100-SXM4-80GB")
    assert regress.check_provenance(a, dict(a), set(), set()) == []
    with pytest.raises(SpecbenchError, match="refusing to compare: gpu differs"):
        regress.check_provenance(a, b, set(), set())
    with pytest.raises(SpecbenchError, match="refusing to compare: device differs"):
        regress.check_provenance(a, prov("epyc", dtype), set(), set())


def _set_machine(run_dir, kind: str) -> None:
    edit_json(run_dir / "meta.json", lambda m: m.update(cpu_flags=FLAGS[kind], cpu_model=MODELS[kind]))


def test_regress_cli_float32_baseline_from_amx_passes_on_epyc(tmp_path):
    run = write_run(tmp_path / "run", methods=("pld", "eagle"))
    _set_machine(run, "sapphire-rapids")
    base = tmp_path / "base.json"
    assert cli.invoke(app, ["baseline", str(run), "--save", str(base)]).exit_code == 0
    _set_machine(run, "epyc")
    res = cli.invoke(app, ["regress", str(run), "--baseline", str(base), "--report", str(tmp_path / "v.json")])
    assert res.exit_code == 0, res.output
    assert "cpu_flags.amx_bf16 differs" in res.output and "warning:" in res.output
    assert "run machine: AMD EPYC (AVX512-BF16, no AMX)" in " ".join(res.output.split())
    verdict = json.loads((tmp_path / "v.json").read_text())
    assert verdict["machines"] == {"baseline": "Intel(R) Xeon(R) Platinum 8488C (AMX-BF16)",
                                   "run": "AMD EPYC (AVX512-BF16, no AMX)"}
    assert verdict["exit_code"] == 0 and len(verdict["warnings"]) == 3  # amx_bf16, amx_tile, cpu_model


def test_regress_cli_bf16_baseline_from_amx_is_refused_on_epyc(tmp_path):
    run = write_run(tmp_path / "run", methods=("pld", "eagle"))
    edit_records(run, lambda r: r.update(dtype="bfloat16"))
    _set_machine(run, "sapphire-rapids")
    base = tmp_path / "base.json"
    assert cli.invoke(app, ["baseline", str(run), "--save", str(base)]).exit_code == 0
    _set_machine(run, "epyc")
    res = cli.invoke(app, ["regress", str(run), "--baseline", str(base)])
    assert res.exit_code == 2 and "refusing to compare: cpu_flags.amx_bf16 differs" in " ".join(res.output.split())
