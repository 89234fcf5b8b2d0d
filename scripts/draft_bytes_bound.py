"""Is drafting bound by the weight bytes it reads? A timed microbenchmark of the matmuls one EAGLE
draft cycle makes (issue 17), in three weight formats and two cache states.

  python scripts/draft_bytes_bound.py [--target smollm2-135m] [--rows 1,4,10] [--draft-vocab 8192]
      [--threads 2] [--out bytes.json]

For the linear maps of one draft layer of the target's shape (attention qkv and o, MLP gate_up and
down, EAGLE's fc) and the LM head over the draft vocabulary, it times x[rows, in] @ W.T with W stored as
float32, bf16 (packed for oneDNN, the drafting path) and int8 weight-only (per-row scales,
`aten._weight_int8pack_mm`), each
  hot:  the same W again and again (it stays in the caches), and
  cold: W rotated through copies that together exceed the last-level cache, as in a decode cycle,
        where the target's forward streams its weights through the caches between two draft calls.
If the time follows bytes (int8 ~ half of bf16 ~ half of float32, cold well above hot) drafting is
bytes-bound, and its floor is bytes per cycle / cold bandwidth. The per-cycle sum uses the cycle
EAGLE-2 runs: observe (fc + layer), the root top-k (LM head), `--levels` expansion levels (fc +
layer + LM head each). Run it alone on the cores.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch
from torch.nn import functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from harness.core.allocator import keep_freed_memory  # noqa: E402
from harness.core.machine_meta import collect_meta  # noqa: E402
from harness.core.packed_linear import PackedLinear, packable, quantize_int8  # noqa: E402
from harness.core.target import Target  # noqa: E402

FORMATS = ("float32", "bf16", "int8")


def layer_shapes(cfg, draft_vocab: int) -> dict[str, tuple[int, int]]:
    """(out, in) of each weight a draft cycle multiplies by, fused as the decode path fuses them
    (harness/core/layer_math.py: q/k/v one map, gate/up one map)."""
    h, inter = cfg.hidden_size, cfg.intermediate_size
    head_dim = getattr(cfg, "head_dim", None) or h // cfg.num_attention_heads
    q, kv = cfg.num_attention_heads * head_dim, cfg.num_key_value_heads * head_dim
    return {"fc": (h, 2 * h), "qkv": (q + 2 * kv, h), "o": (h, q), "gate_up": (2 * inter, h),
            "down": (h, inter), "lm_head": (draft_vocab, h)}


def make_op(weight: torch.Tensor, fmt: str):
    """x -> x @ weight.T with the weight stored in `fmt`; returns (op, input dtype, weight bytes)."""
    if fmt == "float32":
        w = weight.float().contiguous()
        return (lambda x: F.linear(x, w)), torch.float32, w.numel() * 4
    if fmt == "bf16":
        lin = PackedLinear(weight.bfloat16().contiguous())
        return lin, torch.bfloat16, weight.numel() * 2
    q, s = quantize_int8(weight.bfloat16())
    return (lambda x: torch.ops.aten._weight_int8pack_mm(x, q, s)), torch.bfloat16, q.numel() + s.numel() * 2


def build_ops(shape: tuple[int, int], fmt: str, cold_bytes: int) -> list:
    """Copies of a random weight of `shape` in `fmt`, together spanning at least `cold_bytes`."""
    torch.manual_seed(0)
    first = make_op(torch.randn(shape) * 0.02, fmt)
    copies = max(2, -(-cold_bytes // first[2]))
    return [first] + [make_op(torch.randn(shape) * 0.02, fmt) for _ in range(copies - 1)]


def time_us(ops: list, shape: tuple[int, int], rows: int, repeats: int) -> dict[str, float]:
    """Median microseconds per call, hot (the first copy again and again) and cold (rotating
    through all copies, so each call's weight was evicted since its last use)."""
    first = ops[0]
    x = torch.randn(rows, shape[1]).to(first[1])
    with torch.inference_mode():
        for op, _, _ in ops:
            op(x)  # warm: page faults, oneDNN primitive creation
        hot = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            first[0](x)
            hot.append(time.perf_counter() - t0)
        cold = []
        for i in range(max(repeats, len(ops))):
            op = ops[i % len(ops)][0]
            t0 = time.perf_counter()
            op(x)
            cold.append(time.perf_counter() - t0)
    nbytes = first[2]
    hot_us, cold_us = statistics.median(hot) * 1e6, statistics.median(cold) * 1e6
    return {"weight_bytes": nbytes, "hot_us": hot_us, "cold_us": cold_us,
            "hot_gb_s": nbytes / hot_us / 1e3, "cold_gb_s": nbytes / cold_us / 1e3}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", default="smollm2-135m")
    ap.add_argument("--rows", default="1,4,10", help="draft rows per call (tree nodes per level)")
    ap.add_argument("--draft-vocab", type=int, default=8192)
    ap.add_argument("--levels", type=int, default=3, help="expansion levels per cycle, for the sum")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=200)
    ap.add_argument("--cold-mb", type=int, default=1024, help="bytes the cold copies span (> last-level cache)")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    keep_freed_memory()  # the CLI's heap settings, so figures compare with a run's
    cfg = Target.load(args.target, "cpu", "float32").config  # only its shapes are used
    shapes = layer_shapes(cfg, args.draft_vocab)
    fmts = [f for f in FORMATS if f != "bf16" or packable(torch.empty(1, dtype=torch.bfloat16))]
    meta = collect_meta()
    print(f"CPU: {meta['cpu_model']} ({meta['cpu_kind']})  threads: {torch.get_num_threads()}  "
          f"bf16 packed: {'bf16' in fmts}")
    rows_list = [int(r) for r in args.rows.split(",")]
    results = []
    for name, shape in shapes.items():
        for fmt in fmts:
            ops = build_ops(shape, fmt, args.cold_mb << 20)
            for rows in rows_list:
                r = time_us(ops, shape, rows, args.repeats)
                results.append({"weight": name, "out": shape[0], "in": shape[1], "rows": rows, "format": fmt, **r})
                print(f"{name:8s} {shape[0]:5d}x{shape[1]:<5d} rows {rows:2d} {fmt:8s} "
                      f"hot {r['hot_us']:7.1f} us ({r['hot_gb_s']:5.1f} GB/s)  "
                      f"cold {r['cold_us']:7.1f} us ({r['cold_gb_s']:5.1f} GB/s)")
    # One EAGLE-2 cycle: observe = fc + layer, the root's top-k = LM head, each level = fc + layer + LM head.
    layer = [n for n in shapes if n not in ("fc", "lm_head")]
    summary = {}
    for fmt in fmts:
        for rows in rows_list:
            def cost(names, key):
                return sum(r[key] for r in results if r["format"] == fmt and r["rows"] == rows
                           and r["weight"] in names)
            for key in ("hot_us", "cold_us"):
                per_cycle = (cost(layer + ["fc"], key) + cost(["lm_head"], key)
                             + args.levels * cost(layer + ["fc", "lm_head"], key))
                summary[f"{fmt} rows {rows} {key[:-3]}"] = per_cycle / 1e3
    print("\nlinear-map time of one EAGLE-2 cycle (observe + root + "
          f"{args.levels} levels), ms, by weight format / rows / cache state:")
    for k, v in summary.items():
        print(f"  {k:24s} {v:6.2f}")
    if args.out:
        args.out.write_text(json.dumps({"meta": meta, "args": {k: str(v) for k, v in vars(args).items()},
                                        "results": results, "cycle_ms": summary}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
