"""The one config of a run: what `cli.py run`, `compare` or `ablate` was asked for, built once from
the command line and checked once (`RunConfig.__post_init__`), before any model loads.

`temperatures` is what a grid adds: `run` answers at one temperature, `compare` and `ablate` at
several, and `runs()` splits the config into what one `Runner` answers (one temperature and rule).
`to_dict` is the form meta.json stores (its hash names the default run folder); keys added after
run folders existed are stored only when set, so those folders keep their hash and resume.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from typing import Any

from harness.core.errors import SpecbenchError
from harness.core.rules import check_rule
from harness.core.verify import Sampling
from harness.runs.benchmarks import PromptFile

# Stored only when set (run folders made before these keys existed keep their config hash).
NEWER_KEYS = ("device_map", "compile", "prompt_files", "typical")


@dataclass
class RunConfig:
    """Everything that determines a run's numbers. Fields in the order meta.json stores them."""

    methods: list[str] | None      # beside AR; None (compare): pld + every method whose trained weights are found
    benchmarks: list[str]
    temperatures: list[float] = field(default_factory=lambda: [0.0])
    target: str = "smollm2-135m"
    dtype: str = "auto"
    device: str = "auto"
    device_map: str | None = None   # an accelerate strategy sharding the target over GPUs
    compile: bool = False           # the compiled target runtime (harness/core/runtime.py)
    limit: int | None = None
    ids: list[int] | None = None
    max_new_tokens: int = 128
    top_p: float = 1.0
    acceptance: str | None = None   # the rule at T > 0: lossless (None) or typical; T = 0 is greedy
    seed: int = 0
    checkpoint: str | None = None   # drafter weights (`run` only)
    settings: dict[str, Any] = field(default_factory=dict)   # --set: {key: v} or {"method.key": v}
    chat_template: str | None = None
    system_prompt: str | None = None
    # A user's prompt files among `benchmarks`: {name: {"path", "sha256"}} (harness.runs.benchmarks).
    prompt_files: dict[str, dict[str, str]] = field(default_factory=dict)
    typical: list[str] = field(default_factory=list)   # methods run again under Medusa's typical rule at each T > 0

    def __post_init__(self) -> None:
        self.temperatures = sorted({float(t) for t in self.temperatures}) or [0.0]
        if not self.benchmarks:
            raise SpecbenchError("--benchmarks is empty")
        if self.max_new_tokens < 1:
            raise SpecbenchError(f"--max-new-tokens must be >= 1, got {self.max_new_tokens}")
        if self.limit is not None and self.limit < 1:
            raise SpecbenchError(f"--limit must be >= 1, got {self.limit}")
        if self.acceptance is not None:  # a rule no temperature of the run takes is a mistake
            check_rule(self.acceptance, max(self.temperatures))
        for t in self.temperatures:
            Sampling(t, self.top_p, self.rule(t))  # temperature and top-p
        names = self.methods or []
        if len(set(names)) != len(names):
            raise SpecbenchError(f"--method lists a method twice: {','.join(names)}")
        if self.typical:
            if not any(t > 0 for t in self.temperatures):
                raise SpecbenchError("--typical runs Medusa's typical rule, which needs a --temperature > 0")
            stray = [m for m in self.typical if self.methods is not None and m not in self.methods]
            if stray:
                raise SpecbenchError(f"--typical {','.join(stray)}: not among --methods ({','.join(names)})")

    def rule(self, temperature: float) -> str:
        """The acceptance rule at `temperature`: greedy at 0, else the configured one (default lossless)."""
        return "greedy" if temperature == 0 else (self.acceptance or "lossless")

    @property
    def temperature(self) -> float:
        """The one temperature of a Runner's config (`runs()`)."""
        if len(self.temperatures) != 1:
            raise ValueError(f"a config of {len(self.temperatures)} temperatures has no single temperature")
        return self.temperatures[0]

    def sampling(self) -> Sampling:
        return Sampling(self.temperature, self.top_p, self.rule(self.temperature))

    def at(self, temperature: float, methods: list[str] | None = None, rule: str | None = None) -> RunConfig:
        """What one Runner answers: `temperature` alone, its rule resolved (or `rule`), `methods`
        (default: all of this config's)."""
        return replace(self, temperatures=[temperature], acceptance=rule or self.rule(temperature),
                       methods=self.methods if methods is None else list(methods), typical=[])

    def runs(self) -> list[RunConfig]:
        """One config per temperature, then the --typical methods under typical at each T > 0: a
        Runner each. AR's answers are keyed without the rule, so the two rules of one T share them."""
        runs = [self.at(t) for t in self.temperatures]
        return runs + [self.at(t, self.typical, "typical") for t in self.temperatures if t > 0 and self.typical]

    def files(self) -> dict[str, PromptFile]:
        return {name: PromptFile(name, f["path"], f["sha256"]) for name, f in self.prompt_files.items()}

    def to_dict(self, command: str = "run") -> dict[str, Any]:
        """The config as meta.json stores it. `run` (one temperature) stores the form it always has:
        `temperature` and its rule resolved, no `command`; `compare` and `ablate` store `command`,
        `temperatures` and the rule as given, and a checkpoint only when set (they never had one)."""
        fields_ = {k: v for k, v in asdict(self).items() if k not in NEWER_KEYS or v}
        if command != "run" or len(self.temperatures) != 1:
            if fields_["checkpoint"] is None:
                del fields_["checkpoint"]
            return {"command": command, **fields_}
        out: dict[str, Any] = {}
        for key, value in fields_.items():
            if key == "temperatures":
                continue
            if key == "top_p":
                out["temperature"] = self.temperature
            out[key] = self.rule(self.temperature) if key == "acceptance" else value
        return out
