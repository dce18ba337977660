"""Runner configuration, validated once and frozen; start-up values live in ``RuntimeInfo``."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class ConfigError(ValueError):
    """A runner setting that cannot be honoured; the message names the field."""


@dataclass(frozen=True)
class ModelSpec:
    """Where the weights come from: a preset (random weights by ``seed``) or a local HF dir."""

    preset: str | None = "llama-tiny"
    path: str | None = None
    dtype: str | None = None  # None: float32 on CPU, bfloat16 on CUDA
    seed: int = 0

    def __post_init__(self) -> None:
        if (self.preset is None) == (self.path is None):
            raise ConfigError("model: give exactly one of 'preset' or 'path'")
        if self.dtype is not None and self.dtype not in DTYPES:
            raise ConfigError(f"model.dtype: {self.dtype!r} is not one of {sorted(DTYPES)}")


@dataclass(frozen=True)
class RunnerConfig:
    """The runner section of a scenario (DESIGN §5b)."""

    device: str = "auto"  # auto | cuda | cpu
    max_num_reqs: int = 1024
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    max_model_len: int = 4096
    block_size: int = 16
    num_kv_blocks: int | None = None  # None: derived from gpu_memory_utilization (CUDA only)
    gpu_memory_utilization: float = 0.8
    enable_prefix_caching: bool = True
    kernels: str = "torch"  # torch | triton
    async_scheduling: bool = False
    staged_writes: bool = True
    uva: bool = False
    cudagraph_mode: str = "none"  # full | piecewise | full_and_piecewise | none
    cudagraph_capture_sizes: tuple[int, ...] | None = None  # None: vLLM's default sizes
    strict: bool = False
    seed: int = 0

    def __post_init__(self) -> None:
        positive = (
            "max_num_reqs",
            "max_num_seqs",
            "max_num_batched_tokens",
            "max_model_len",
            "block_size",
        )
        for name in positive:
            if getattr(self, name) < 1:
                raise ConfigError(f"runner.{name}: must be >= 1, got {getattr(self, name)}")
        if self.device not in ("auto", "cuda", "cpu"):
            raise ConfigError(f"runner.device: {self.device!r} is not one of auto, cuda, cpu")
        if self.num_kv_blocks is not None and self.num_kv_blocks < 1:
            raise ConfigError(f"runner.num_kv_blocks: must be >= 1, got {self.num_kv_blocks}")
        if self.num_kv_blocks is not None and self.num_kv_blocks * self.block_size < (
            self.max_model_len
        ):
            raise ConfigError(
                f"runner.num_kv_blocks: {self.num_kv_blocks} blocks of {self.block_size} tokens "
                f"cannot hold one request of max_model_len {self.max_model_len}"
            )
        if not 0.0 < self.gpu_memory_utilization <= 1.0:
            raise ConfigError("runner.gpu_memory_utilization: must be in (0, 1]")
        if self.max_num_seqs > self.max_num_reqs:
            raise ConfigError(
                f"runner.max_num_seqs: {self.max_num_seqs} exceeds max_num_reqs {self.max_num_reqs}"
            )
        if self.async_scheduling and self.max_num_reqs < 2 * self.max_num_seqs:
            raise ConfigError(
                f"runner.max_num_reqs: {self.max_num_reqs} is too small for async scheduling with "
                f"max_num_seqs {self.max_num_seqs}: a finished request keeps its slot one more "
                f"step, so at least 2 x max_num_seqs = {2 * self.max_num_seqs} are needed"
            )
        if self.cudagraph_mode not in ("full", "piecewise", "full_and_piecewise", "none"):
            raise ConfigError(
                f"runner.cudagraph_mode: {self.cudagraph_mode!r} is not one of full, piecewise, "
                "full_and_piecewise, none"
            )
        if self.cudagraph_capture_sizes is not None:
            bad = [s for s in self.cudagraph_capture_sizes if s < 1]
            if bad or not self.cudagraph_capture_sizes:
                raise ConfigError(
                    "runner.cudagraph_capture_sizes: must be positive integers, got "
                    f"{list(self.cudagraph_capture_sizes)}"
                )
        if self.kernels not in ("torch", "triton"):
            raise ConfigError(f"runner.kernels: {self.kernels!r} is not one of torch, triton")

    @property
    def max_num_blocks_per_req(self) -> int:
        return -(-self.max_model_len // self.block_size)

    def resolve_device(self) -> torch.device:
        if self.device == "cpu":
            return torch.device("cpu")
        if self.device == "cuda" or torch.cuda.is_available():
            if not torch.cuda.is_available():
                raise ConfigError("runner.device: 'cuda' requested but no CUDA device is available")
            return torch.device("cuda", torch.cuda.current_device())
        return torch.device("cpu")


@dataclass
class RuntimeInfo:
    """What the runner derived at start-up (never written back into the config)."""

    device: str = "cpu"
    dtype: str = "float32"
    num_kv_blocks: int = 0
    kv_cache_bytes: int = 0
    model_params: int = 0
    weight_load_s: float = 0.0
    profile_run_s: float = 0.0
    kv_alloc_s: float = 0.0
    warmup_s: float = 0.0  # compiling the Triton kernels before the first step
    capture_s: float = 0.0  # capturing the CUDA graphs
    graph_memory_bytes: int = 0  # reserved memory the graphs' pool grew by
    num_graphs: int = 0  # captured keys (a PIECEWISE key is one graph per segment)
    peak_activation_bytes: int = 0
    notes: list[str] = field(default_factory=list)
