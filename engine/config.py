"""EngineConfig: the knobs of one engine, plus pure helpers that turn them into run-time values.

Contract: `EngineConfig` is frozen and validated on construction; every rejection is a
`ValueError` naming the field and what to do instead. This module never imports torch and never
reads the environment: facts about the machine (is CUDA there, how much memory is free, what the
model's context length is) come in as arguments of the `resolve_*` helpers, and what they return
(device, dtype, max_model_len) is passed on by the engine, never written back into the config.
The KV pool's arithmetic from these knobs is engine/kv_sizing.py's.

KV cache budget: one block holds `block_size` tokens of K and V for every layer, KV heads only
(GQA caches are never repeated per query head). The budget is `kv_cache_memory_bytes` when given, else `kv_cache_memory_fraction` of the memory
free after the weights are loaded (default 0.3: room for activations and for a CPU host that
other processes share; raise it on a dedicated GPU).
"""

from __future__ import annotations

from dataclasses import dataclass

from engine.kv_tiers.config import KVTierConfig
from engine.lora_config import LoraConfig
from engine.parallel_config import check_parallel_sizes
from engine.speculative.config import SpeculativeConfig

DTYPE_BYTES: dict[str, int] = {"float32": 4, "bfloat16": 2, "float16": 2}
# models/kv_quant.py, models/kv_fp8.py, models/kv_half.py (kept torch-free here); "fp8_e4m3" is
# "fp8" (vLLM's name); "float16": a float32 model's K/V rounded to float16 (half the bytes);
# "int8v": a float32 model's K as float16 rows, V as int8 rows (0.38x float32's bytes)
KV_CACHE_DTYPES = ("auto", "int8", "fp8", "fp8_e4m3", "float16", "int8v")
# The names EngineConfig.dtype accepts ("auto": resolve_dtype_name picks one).
DTYPE_CHOICES = (*DTYPE_BYTES, "auto")


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


@dataclass(frozen=True)
class EngineConfig:
    block_size: int = 16  # tokens per KV block
    kv_cache_memory_bytes: int | None = None  # explicit KV budget; wins over the fraction
    kv_cache_memory_fraction: float = 0.3  # of the memory free after loading weights
    max_num_seqs: int = 64  # sequences (batch rows) running at once; n>1/beams count each
    # Upper bound on the tokens of one step (decodes + prefill chunks); a step in which no stream
    # receives a token (long prompts, whole-output requests) fills it. Below it, `target_itl_ms`
    # sizes the chunks.
    max_num_batched_tokens: int = 2048
    # Step-time target while streams decode: prefill chunks are sized by the fitted step cost
    # model (engine/scheduling/step_cost.py) so a step that delivers tokens to a streamed request
    # (SamplingParams.streamed) stays under it.
    # None: the token budget alone (every step may fill max_num_batched_tokens).
    target_itl_ms: float | None = 100.0
    max_model_len: int | None = None  # None: the model's own context length
    dtype: str = "auto"  # "float32" | "bfloat16" | "float16" | "auto"
    device: str = "auto"  # "auto" | "cpu" | "cuda" | "cuda:N"
    enable_prefix_caching: bool = True
    # Requests in flight (running + waiting) are bounded by max_num_seqs + this (see
    # `max_in_flight`: the one admission rule; beyond it QueueFullError, a 429 on the server).
    max_queued_requests: int = 256
    # Compiled grammars kept for reuse, by estimated bytes (engine/grammar/grammar_compiler.py).
    grammar_cache_bytes: int = 512 * 1024 * 1024
    seed: int = 0
    quantization: str | None = None  # None, or "int8": weight-only int8 linears (opt-in)
    # "auto": int16 where a GGUF's Q4_0 / Q4_1 / Q8_0 blocks are served as stored by an AVX2
    # build of the CPU kernels, float elsewhere (engine/activation_choice.py); "int8" / "int16":
    # activations quantised per row and block of 32 for integer dot products against those
    # blocks and int8 weights (models/activation_quant.py; CPU); None (or "none"): float.
    activation_quantization: str | None = "auto"
    # "auto": the KV cache holds the model's dtype; "int8": int8 rows with a float32 scale per
    # token and KV head (models/kv_quant.py; CPU, read by the C++ paged attention); "fp8" (alias
    # "fp8_e4m3", stored as "fp8"): e4m3 rows with a float32 scale per token and KV head
    # (models/kv_fp8.py; CUDA, read by the Triton paged kernels); "float16" / "int8v": a float32
    # model's K and V (K only, V int8 rows) as float16 rows (models/kv_half.py; CPU).
    kv_cache_dtype: str = "auto"
    compile: bool = False  # torch.compile the dense halves of each block (models/compiled_layers)
    cpu_kernels: bool = True  # on CPU: our C++ forward step + attention (models/forward_path)
    # On CPU, when the kernels are not built yet: serve on PyTorch ops at once while they build,
    # switch between requests once they load (engine/kernel_switch.py). `tgserve serve` sets it;
    # False waits for the build at start-up (offline runs, benchmarks, tests).
    cpu_kernels_background: bool = False
    # GGUF files: False keeps Q4_0..Q8_0 / K-quant matrices as stored (models/gguf/stored.py); True
    # dequantises every tensor to `dtype` (always so with quantization="int8").
    dequantize: bool = False
    # Ranks of one replica (torch.distributed; engine/parallel): tensor_parallel_size ranks in
    # each of pipeline_parallel_size stages (engine/parallel_config.py); 1 x 1: this process.
    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    # On CUDA: every step eager, no decode CUDA graphs (engine/cuda_graphs); CPU never captures.
    enforce_eager: bool = False
    # On CUDA: every linear through one fixed-tile Triton GEMM, so a request's tokens do not
    # depend on the batch (cuBLAS's tuned GEMMs do); CPU paths are batch-invariant already.
    batch_invariant: bool = False
    async_scheduling: bool = False  # the overlapped loop (step_pipeline.py)
    # Speculative decoding (engine/speculative/config.py): None decodes one token per step.
    speculative: SpeculativeConfig | None = None
    # K/V tiers behind the pool (engine/kv_tiers: RAM, disk); None: the pool alone.
    kv_tiers: KVTierConfig | None = None
    lora: LoraConfig | None = None  # LoRA adapters (engine/lora_config.py); None: the base alone

    def __post_init__(self) -> None:
        def positive_int(name: str, value: object, hint: str) -> None:
            if not _is_int(value) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}; {hint}")

        positive_int("block_size", self.block_size, "16 is a good default")
        if self.block_size > 1024:
            raise ValueError(
                f"block_size must be at most 1024, got {self.block_size}; use 16 or 32"
            )
        if self.kv_cache_memory_bytes is not None:
            positive_int(
                "kv_cache_memory_bytes",
                self.kv_cache_memory_bytes,
                "give a byte count, or leave it None to use kv_cache_memory_fraction",
            )
        fraction = self.kv_cache_memory_fraction
        if (
            isinstance(fraction, bool)
            or not isinstance(fraction, int | float)
            or not 0.0 < fraction <= 1.0
        ):
            raise ValueError(
                f"kv_cache_memory_fraction must be in (0, 1], got {fraction!r}; "
                "it is the share of free memory given to the KV cache"
            )
        positive_int("max_num_seqs", self.max_num_seqs, "it bounds the running batch")
        positive_int(
            "max_num_batched_tokens", self.max_num_batched_tokens, "it is the per-step token budget"
        )
        if self.max_num_batched_tokens < self.max_num_seqs:
            raise ValueError(
                f"max_num_batched_tokens ({self.max_num_batched_tokens}) must be >= max_num_seqs "
                f"({self.max_num_seqs}) so every running sequence can decode in each step; "
                "raise the token budget or lower max_num_seqs"
            )
        if self.max_model_len is not None:
            positive_int(
                "max_model_len", self.max_model_len, "or None for the model's context length"
            )
        if self.dtype not in DTYPE_CHOICES:
            raise ValueError(f"dtype must be one of {', '.join(DTYPE_CHOICES)}, got {self.dtype!r}")
        if not _valid_device(self.device):
            raise ValueError(
                f"device must be 'auto', 'cpu', 'cuda' or 'cuda:N', got {self.device!r}"
            )
        if not isinstance(self.enable_prefix_caching, bool):
            raise ValueError(
                f"enable_prefix_caching must be a bool, got {self.enable_prefix_caching!r}"
            )
        positive_int("max_queued_requests", self.max_queued_requests, "it bounds the waiting queue")
        positive_int("grammar_cache_bytes", self.grammar_cache_bytes, "e.g. 512 MiB")
        target = self.target_itl_ms
        if target is not None and (
            isinstance(target, bool)
            or not isinstance(target, int | float)
            or not 1.0 <= target <= 60_000.0
        ):
            raise ValueError(
                f"target_itl_ms must be a number of milliseconds in [1, 60000] or None, got "
                f"{target!r}; e.g. 100 (None: size steps by max_num_batched_tokens alone)"
            )
        if not isinstance(self.cpu_kernels, bool):
            raise ValueError(f"cpu_kernels must be a bool, got {self.cpu_kernels!r}")
        if not isinstance(self.cpu_kernels_background, bool):
            raise ValueError(
                f"cpu_kernels_background must be a bool, got {self.cpu_kernels_background!r}"
            )
        if not isinstance(self.dequantize, bool):
            raise ValueError(f"dequantize must be a bool, got {self.dequantize!r}")
        if not isinstance(self.enforce_eager, bool):
            raise ValueError(f"enforce_eager must be a bool, got {self.enforce_eager!r}")
        if not isinstance(self.batch_invariant, bool):
            raise ValueError(f"batch_invariant must be a bool, got {self.batch_invariant!r}")
        if not isinstance(self.compile, bool):
            raise ValueError(f"compile must be a bool, got {self.compile!r}")
        if self.quantization not in (None, "int8"):
            raise ValueError(f"quantization must be None or 'int8', got {self.quantization!r}")
        if self.activation_quantization not in (None, "none", "int8", "int16", "auto"):
            raise ValueError(
                "activation_quantization must be 'auto', 'int8', 'int16' or None ('none'), got "
                f"{self.activation_quantization!r}"
            )
        if self.activation_quantization == "none":  # one spelling inside
            object.__setattr__(self, "activation_quantization", None)
        if self.kv_cache_dtype not in KV_CACHE_DTYPES:
            raise ValueError(
                f"kv_cache_dtype must be one of {', '.join(KV_CACHE_DTYPES)}, got "
                f"{self.kv_cache_dtype!r}"
            )
        if self.kv_cache_dtype == "fp8_e4m3":  # one name inside: the alias is the same rows
            object.__setattr__(self, "kv_cache_dtype", "fp8")
        if not _is_int(self.seed) or self.seed < 0:
            raise ValueError(f"seed must be a non-negative integer, got {self.seed!r}")
        if self.speculative is not None and not isinstance(self.speculative, SpeculativeConfig):
            raise ValueError(f"speculative must be a SpeculativeConfig, got {self.speculative!r}")
        if self.kv_tiers is not None and not isinstance(self.kv_tiers, KVTierConfig):
            raise ValueError(f"kv_tiers must be a KVTierConfig, got {self.kv_tiers!r}")
        check_parallel_sizes(self)

    @property
    def parallel_world_size(self) -> int:
        """The ranks (processes) of one replica: tensor x pipeline parallel."""
        return self.tensor_parallel_size * self.pipeline_parallel_size

    @property
    def max_in_flight(self) -> int:
        """The one admission rule: requests admitted and unfinished (running + waiting) never
        exceed max_num_seqs + max_queued_requests. A burst of N requests on an idle engine gets
        exactly N - max_in_flight refusals, however the arrivals interleave with steps."""
        return self.max_num_seqs + self.max_queued_requests


def _valid_device(device: object) -> bool:
    if not isinstance(device, str):
        return False
    if device in ("auto", "cpu", "cuda"):
        return True
    prefix, _, index = device.partition(":")
    return prefix == "cuda" and index.isdigit()


def resolve_device(device: str, cuda_available: bool) -> str:
    """ "auto" -> "cuda" when CUDA is present, else "cpu"; an explicit CUDA device needs CUDA."""
    if device == "auto":
        return "cuda" if cuda_available else "cpu"
    if device.startswith("cuda") and not cuda_available:
        raise ValueError(
            f"device {device!r} was asked for but CUDA is not available; use 'cpu' or 'auto'"
        )
    return device


def resolve_dtype_name(
    dtype: str, device: str, bf16_supported: bool = True, blocks_as_stored: bool = False
) -> str:
    """The dtype name to load with: a concrete name is kept; "auto" ->
    - float32 on a CPU running GGUF blocks as stored through the float block kernels
      (`blocks_as_stored`; not with int8 activations, see runner_factory): the weight bytes read
      per token are the file's whichever the activations are, and the block kernels run their
      sums as float32 fmas either way, so bfloat16 saves no weight bytes and costs its
      conversions (and, at one row, `vdpbf16ps`, which issues at half the fma rate on Intel
      CPUs without AMX). Measured on an AVX512-BF16 host: float32 1.26x the bf16 decode, 1.33x
      offline (PERFORMANCE.md, #31); again on an AVX-512 + BF16 + AMX Xeon (tenth session: 1.26x
      decode, 1.6x prefill, one thread). The KV cache is float32 too (twice bf16's bytes);
      `--dtype bfloat16` keeps the bf16 cache;
    - else bfloat16 where the hardware computes it natively (CUDA with bf16; a CPU with
      AVX512-BF16 or AMX: half the bytes to stream per token, as vLLM's CPU default);
    - else float16 on CUDA and float32 on CPU.
    (models.loader.torch_dtype_for then turns the name into a torch dtype.)"""
    if dtype != "auto":
        return dtype
    on_cuda = device.startswith("cuda")
    if blocks_as_stored and not on_cuda:
        return "float32"
    if bf16_supported:
        return "bfloat16"
    return "float16" if on_cuda else "float32"


def dtype_bytes(dtype: str) -> int:
    if dtype not in DTYPE_BYTES:
        raise ValueError(
            f"dtype must be resolved to one of {', '.join(DTYPE_BYTES)}, got {dtype!r}"
        )
    return DTYPE_BYTES[dtype]


def resolve_max_model_len(config: EngineConfig, model_max_len: int) -> int:
    """The context length the engine admits requests against (prompt + max_tokens)."""
    if config.max_model_len is None:
        return model_max_len
    if config.max_model_len > model_max_len:
        raise ValueError(
            f"max_model_len ({config.max_model_len}) exceeds the model's context length "
            f"({model_max_len}); lower it or leave it None"
        )
    return config.max_model_len
