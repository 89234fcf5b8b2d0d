"""Reading drafter checkpoints from disk: folders, config.json, weight files.

Every way a checkpoint can be broken (missing, truncated, not JSON, tensors of the wrong shape)
ends here as one SpecbenchError line that names the file and the fix, never a traceback from
safetensors, json or torch.
"""
from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import torch

from harness.core.errors import SpecbenchError


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
