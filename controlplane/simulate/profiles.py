"""Hardware/model profiles of the serving simulator: ``Profile``, the built-ins, files.

Owns what one engine instance is: a model (its shape, the bytes of its weights and of
one token's KV), the accelerator it runs on (dense peak FLOP/s at the weights' precision,
HBM bandwidth and size, all GPUs of the instance together), three efficiencies that turn
peaks into time, and the engine's batch limits. ``controlplane.simulate.cost`` turns a
profile into step times. The built-in numbers and the public measurements they are
calibrated on are listed, with their sources, in docs/simulate.md ("Profiles"); a
profile of one's own is a JSON or TOML file of the same fields (``load_profile``).

It must never read anything but the one file it is given, or know about traces.
"""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

GIB = 1 << 30


class ProfileError(ValueError):
    """A profile file that cannot be read or does not describe a valid profile."""


class Profile(BaseModel):
    """One engine instance: model x accelerator x engine limits (docs/simulate.md)."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    name: str = Field(min_length=1, description="Profile name, shown in reports")
    description: str = Field(default="", description="What it models, in a line")
    params_billion: float = Field(gt=0, description="Dense parameters (billions)")
    layers: int = Field(ge=1, description="Transformer layers")
    attention_dim: int = Field(ge=1, description="Query heads x head dim")
    kv_heads: int = Field(ge=1, description="Key/value heads (grouped-query attention)")
    head_dim: int = Field(ge=1, description="Dimension of one head")
    weight_bytes: float = Field(gt=0, description="Bytes per weight (2 bf16, 1 fp8)")
    kv_bytes: float = Field(gt=0, description="Bytes per cached K or V value")
    peak_tflops: float = Field(gt=0, description="Dense peak at the weights' precision")
    hbm_tb_s: float = Field(gt=0, description="HBM bandwidth (TB/s, all GPUs)")
    hbm_gb: float = Field(gt=0, description="HBM size (GB, all GPUs)")
    prefill_mfu: float = Field(gt=0, le=1, description="Share of peak FLOP/s reached")
    bandwidth_efficiency: float = Field(gt=0, le=1, description="Share of HBM bandwidth")
    step_overhead_ms: float = Field(ge=0, description="Fixed cost of every engine step")
    memory_utilization: float = Field(
        default=0.9, gt=0, le=1, description="Share of HBM the engine takes (vLLM's default)"
    )
    max_batch_tokens: int = Field(
        default=8192, ge=1, description="Token budget of one step (max_num_batched_tokens)"
    )
    max_running: int = Field(
        default=1024, ge=1, description="Requests running at once (max_num_seqs)"
    )

    @model_validator(mode="after")
    def _fits(self) -> Profile:
        if self.max_batch_tokens < self.max_running:
            raise ValueError(
                f"max_batch_tokens ({self.max_batch_tokens}) must be >= max_running "
                f"({self.max_running}): every running request decodes one token a step"
            )
        if self.kv_pool_bytes <= 0:
            raise ValueError(
                f"the weights ({self.weights_gb:.1f} GB: params_billion x weight_bytes) "
                f"leave no KV cache in {self.memory_utilization:.0%} (memory_utilization) "
                f"of {self.hbm_gb} GB (hbm_gb)"
            )
        return self

    @property
    def weights_gb(self) -> float:
        return self.params_billion * self.weight_bytes

    @property
    def kv_bytes_per_token(self) -> float:
        """K and V of every layer for one token."""
        return 2.0 * self.layers * self.kv_heads * self.head_dim * self.kv_bytes

    @property
    def kv_pool_bytes(self) -> float:
        """HBM left for the KV cache once the weights are loaded."""
        return (self.hbm_gb * self.memory_utilization - self.weights_gb) * 1e9

    def kv_pool_blocks(self, block_tokens: int) -> int:
        """Blocks of ``block_tokens`` tokens the KV pool holds."""
        return int(self.kv_pool_bytes // (self.kv_bytes_per_token * block_tokens))

    def blocks_for_gib(self, gib: float, block_tokens: int) -> int:
        """Blocks of ``block_tokens`` tokens in ``gib`` GiB of KV cache."""
        return int(gib * GIB // (self.kv_bytes_per_token * block_tokens))


_LLAMA3_8B = {
    "params_billion": 8.03,
    "layers": 32,
    "attention_dim": 4096,
    "kv_heads": 8,
    "head_dim": 128,
    "weight_bytes": 2.0,
    "kv_bytes": 2.0,
}
_LLAMA3_70B_FP8 = {
    "params_billion": 70.6,
    "layers": 80,
    "attention_dim": 8192,
    "kv_heads": 8,
    "head_dim": 128,
    "weight_bytes": 1.0,
    "kv_bytes": 2.0,
}
# Dense peaks (NVIDIA's sparse figures halved) and HBM of one SXM GPU.
_H100 = {"hbm_tb_s": 3.35, "hbm_gb": 80.0}
_H200 = {"hbm_tb_s": 4.8, "hbm_gb": 141.0}
_BF16_TFLOPS = 989.0
_FP8_TFLOPS = 1979.0
# Calibrated on public measurements (docs/simulate.md, "Profiles").
_EFFICIENCY = {"prefill_mfu": 0.46, "bandwidth_efficiency": 0.61, "step_overhead_ms": 1.0}

BUILTIN: dict[str, Profile] = {
    p.name: p
    for p in (
        Profile(
            name="llama3-8b-h200",
            description="Llama-3.1-8B, bf16, one H200 SXM",
            peak_tflops=_BF16_TFLOPS,
            **_LLAMA3_8B,
            **_H200,
            **_EFFICIENCY,
        ),
        Profile(
            name="llama3-8b-h100",
            description="Llama-3.1-8B, bf16, one H100 SXM",
            peak_tflops=_BF16_TFLOPS,
            **_LLAMA3_8B,
            **_H100,
            **_EFFICIENCY,
        ),
        Profile(
            name="llama3-70b-fp8-h200",
            description="Llama-3.1-70B, fp8 weights, bf16 KV, one H200 SXM",
            peak_tflops=_FP8_TFLOPS,
            **_LLAMA3_70B_FP8,
            **_H200,
            **_EFFICIENCY,
        ),
    )
}
DEFAULT_PROFILE = "llama3-8b-h200"


def load_profile(name_or_path: str) -> Profile:
    """A built-in profile by name, or a ``.json``/``.toml`` file of ``Profile`` fields."""
    if name_or_path in BUILTIN:
        return BUILTIN[name_or_path]
    path = Path(name_or_path)
    if path.suffix not in (".json", ".toml"):
        raise ProfileError(
            f"unknown profile {name_or_path!r}; built-in profiles: {', '.join(BUILTIN)} "
            "(or give a .json or .toml file)"
        )
    try:
        text = path.read_text(encoding="utf-8")
        data = json.loads(text) if path.suffix == ".json" else tomllib.loads(text)
    except OSError as exc:  # "p.toml: No such file or directory", not "[Errno 2] ..."
        raise ProfileError(f"{path}: {exc.strerror or exc}") from None
    except (UnicodeDecodeError, ValueError) as exc:
        raise ProfileError(f"{path}: {exc}") from None
    if not isinstance(data, dict):
        raise ProfileError(f"{path}: expected an object of profile fields")
    try:
        return Profile.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        reason = first["msg"].removeprefix("Value error, ")
        if first["type"] == "extra_forbidden":  # pydantic's "Extra inputs are not permitted"
            reason = f"not a profile field (the fields: {', '.join(Profile.model_fields)})"
        where = ".".join(str(p) for p in first["loc"])  # none: a check across fields
        field = f" field {where!r}:" if where else ""
        raise ProfileError(f"{path}:{field} {reason}") from None
