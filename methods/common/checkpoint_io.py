"""Drafter checkpoints on disk: where they are looked for, reading and writing folders,
config.json and weight files, and the checks that they fit a target.

Every way a checkpoint can be broken (missing, truncated, not JSON, tensors of the wrong shape)
ends here as one SpecbenchError line that names the file and the fix, never a traceback from
safetensors, json or torch.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path
from typing import Any

import torch

from harness.core.errors import SpecbenchError
from harness.core.paths import REPO_ROOT


def _refetch(method: str | None) -> str:
    train = f"python cli.py train --method {method}" if method else "python cli.py train"
    return f"copy the checkpoint again, or retrain it with `{train}`"


def resolve_checkpoint(path: str | Path) -> Path:
    """A local folder, or a hub id fetched with huggingface_hub (offline machines need it cached)."""
    p = Path(path).expanduser()
    if p.is_dir():
        return p
    if p.exists():
        return p.parent
    if re.fullmatch(r"[\w.-]+/[\w.-]+", str(path)):
        try:
            from huggingface_hub import snapshot_download

            return Path(snapshot_download(str(path)))
        except Exception as e:  # noqa: BLE001 - any hub failure is one user-facing line
            raise SpecbenchError(f"could not fetch checkpoint '{path}' ({str(e).splitlines()[0]}); "
                                 "download it first and pass the folder") from None
    raise SpecbenchError(f"checkpoint '{path}' not found: pass a folder with config.json + weights, or a hub id")


def read_config(folder: Path, method: str | None = None) -> dict[str, Any]:
    """`folder/config.json` as a dict ({} when absent: official layouts may have none)."""
    file = Path(folder) / "config.json"
    if not file.exists():
        return {}
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise SpecbenchError(f"{file} is not valid JSON ({str(e).splitlines()[0]}); {_refetch(method)}") from None
    if not isinstance(data, dict):
        raise SpecbenchError(f"{file} holds a JSON {type(data).__name__}, not an object; {_refetch(method)}")
    return data


def read_weights(file: Path, method: str | None = None) -> dict[str, torch.Tensor]:
    """One weight file (.safetensors, or a torch pickle of tensors) as a state dict."""
    file = Path(file)
    try:
        if file.suffix == ".safetensors":
            from safetensors.torch import load_file

            return load_file(str(file))
        return torch.load(file, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise SpecbenchError(f"{file} not found; {_refetch(method)}") from None
    except Exception as e:  # noqa: BLE001 - safetensors/pickle/zip errors: a corrupt or truncated file
        raise SpecbenchError(f"{file} is not a readable weight file ({type(e).__name__}: "
                             f"{str(e).splitlines()[0] if str(e) else 'unreadable'}); {_refetch(method)}") from None


WEIGHT_SUFFIXES = ("safetensors", "bin", "pt")  # what `read_state` reads


def read_state(folder: Path, method: str | None = None) -> dict[str, torch.Tensor]:
    """Every weight file of an official-layout folder merged: *.safetensors, else *.bin / *.pt."""
    folder = Path(folder)
    files = sorted(folder.glob("*.safetensors")) or sorted(folder.glob("*.bin")) + sorted(folder.glob("*.pt"))
    if not files:
        raise SpecbenchError(f"{folder} holds no weights (*.safetensors, pytorch_model.bin)")
    state: dict[str, torch.Tensor] = {}
    for f in files:
        state.update(read_weights(f, method))
    return state


def check_shapes(state: dict[str, torch.Tensor], expected: dict[str, torch.Tensor], file: Path, method: str,
                 target_name: str) -> None:
    """Refuse, naming the first tensor, weights whose shapes do not fit the drafter as built."""
    for k in sorted(set(state) & set(expected)):
        got, want = tuple(state[k].shape), tuple(expected[k].shape)
        if got != want:
            raise SpecbenchError(
                f"{file}: tensor '{k}' has shape {list(got)} but '{method}' on target '{target_name}' needs "
                f"{list(want)}: these weights are for another target or architecture; train them for this one "
                f"(`python cli.py train --method {method} --target {target_name}`) or pass the matching --set")


# ---- finding, writing and fingerprinting ---------------------------------------------------
def checkpoint_search_paths(target_name: str, method: str) -> list[Path]:
    """Where a drafter's weights are looked for, in order (after an explicit --checkpoint)."""
    from harness.core.target import cache_root

    paths = []
    if os.environ.get("SPECBENCH_CHECKPOINTS"):
        paths.append(Path(os.environ["SPECBENCH_CHECKPOINTS"]) / target_name / method)
    paths.append(REPO_ROOT / "checkpoints" / target_name / method)
    paths.append(cache_root() / "checkpoints" / target_name / method)
    return paths


def find_weights(target_name: str, folder_name: str, method: str, trains_as: str) -> Path:
    """The first search path of `folder_name` (a method, maybe with an architecture hash) on
    `target_name` that holds weights; a miss names the `cli.py train` command for `trains_as`."""
    paths = checkpoint_search_paths(target_name, folder_name)
    for p in paths:
        # ours (model.safetensors) or a released layout (pytorch_model.bin, medusa_lm_head.pt, ...)
        if any(any(p.glob(f"*.{ext}")) for ext in WEIGHT_SUFFIXES):
            return p
    raise SpecbenchError(
        f"no trained weights for '{method}' on target '{target_name}' (looked in "
        f"{', '.join(str(p) for p in paths)}); train them with "
        f"`python cli.py train --method {trains_as} --target {target_name}` or pass --checkpoint")


def write_checkpoint(path: str | Path, state: dict[str, torch.Tensor], meta: dict[str, Any]) -> None:
    """`model.safetensors` (floating tensors stored as bf16, integer ids as they are) + `config.json`."""
    from safetensors.torch import save_file

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    state = {k: (v.detach().to(torch.bfloat16) if v.is_floating_point() else v.detach()).contiguous()
             for k, v in state.items()}
    save_file(state, str(path / "model.safetensors"))
    (path / "config.json").write_text(json.dumps(meta, indent=2) + "\n")


def weights_hash(state: dict[str, torch.Tensor]) -> str:
    """12 hex digits identifying a state dict (keys, shapes and the first 4 KiB of each tensor),
    recorded with every answer as the checkpoint hash."""
    h = hashlib.sha256()
    for k in sorted(state):
        h.update(k.encode())
        h.update(state[k].float().numpy().tobytes()[:4096])
        h.update(str(tuple(state[k].shape)).encode())
    return h.hexdigest()[:12]


def check_meta(meta: dict[str, Any], folder: Path, target, method: str) -> None:
    """A specbench checkpoint's config.json must name `method` and fit `target` (sizes, tokenizer)."""
    if meta.get("method") != method:
        raise SpecbenchError(f"{folder} holds '{meta.get('method')}' weights, not '{method}'")
    if meta.get("hidden_size") != target.hidden_size or meta.get("vocab_size") != target.vocab_size:
        raise SpecbenchError(
            f"{folder} was trained for hidden {meta.get('hidden_size')} / vocab {meta.get('vocab_size')}, "
            f"target '{target.name}' has {target.hidden_size} / {target.vocab_size}: train one for this target")
    if meta.get("vocab_hash") not in (None, target.vocab_hash()):
        raise SpecbenchError(f"{folder} was trained with another tokenizer than target '{target.name}'")
