"""Where Spec-Bench's Token Recycling and ours part (docs/peers.md, "Training-free peers"): the
official tree is always the whole template. `recycling_forward` reads a child of every node from
the adjacency matrix, written or not (evaluation/inference_recycling.py:86-92): a never-written
row is zeros, so an unseen token gets eight children of token 0, and those the row of token 0.
Every node's logits then write its token's row (L140-141), the filler nodes' too, so the matrix
learns rows for tokens the text has not reached, from contexts of filler tokens. Its first step
also verifies a tree under the last prompt token (its row, and token 0's, come from that step).
Ours gives a token with no row no children (methods/recycling.py `rank_children`).

Runs the official loop on one prompt for 1..N new tokens with a fresh zero matrix and prints, after
each, how many rows are written and which tokens have one although they are not in the text.
Run it in the peer's environment, from the checkout, on the base view `cli.py peers` writes:
  PYTHONPATH=. .peers/transformers-4.37.1/bin/python scripts/peer_recycling_rows.py \\
      --peer-dir ../shared/peers/spec-bench --base BASE --prompt-ids IDS.json [--steps 3]
Prints one JSON line per run; nothing in the peer folder is written.
"""
from __future__ import annotations

import argparse
import importlib
import json
import sys
from pathlib import Path

import torch

from harness.peers import worker


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--peer-dir", required=True)
    ap.add_argument("--base", required=True)
    ap.add_argument("--prompt-ids", required=True, help="a JSON list of prompt token ids (chat template applied)")
    ap.add_argument("--steps", type=int, default=3)
    args = ap.parse_args()
    sys.path.insert(0, str(Path(args.peer_dir).resolve()))
    worker.cpu_shims()
    worker.cuda_device_shim(["evaluation.inference_recycling"], {})
    runner = importlib.import_module("evaluation.inference_recycling")
    llama = importlib.import_module("model.recycling.modeling_llama_kv")
    from transformers import AutoTokenizer

    model = llama.LlamaForCausalLM.from_pretrained(args.base, torch_dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(args.base)
    ids = json.loads(Path(args.prompt_ids).read_text())
    for n in range(1, args.steps + 1):
        runner.adj_matrix = torch.zeros((model.vocab_size, 8), dtype=torch.long)
        with torch.no_grad():
            out, _new, _steps, accept = runner.recycling_forward(worker.Inputs(ids), model, tokenizer, n)
        text = set(ids) | set(out[0].tolist())
        rows = runner.adj_matrix.any(-1).nonzero().flatten().tolist()
        print(json.dumps({"max_new_tokens": n, "new_tokens": out[0, len(ids):].tolist(), "accept_lengths": accept,
                          "rows_written": len(rows), "rows_of_tokens_not_in_text": [t for t in rows if t not in text],
                          "row_of_0": runner.adj_matrix[0].tolist()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
