"""Engine configuration (static, from the CLI / config file) and limits computed at load time."""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path

from switchboard.engine.index_compiler import CompileLimits
from switchboard.engine.reasoning import REASONING_PARSERS
from switchboard.engine.tool_parsers import TOOL_CALL_PARSERS

logger = logging.getLogger(__name__)

DEVICES = ("auto", "cpu", "cuda", "npu")
DTYPES = ("auto", "float32", "bfloat16", "float16")
QUANTIZATION_SCHEMES = ("none", "int8", "int4", "gguf")
# "auto" resolves to one of the schemes once the model and device are known (see
# `quantization.resolve_scheme`).
QUANTIZATIONS = ("auto", *QUANTIZATION_SCHEMES)
CPU_STEP_TOKENS = 128
ACCELERATOR_STEP_TOKENS = 2048
# OpenAI's own bound on n, which the gateway's OpenAPI document states.
MAX_SEQUENCES = 128
# The structured-output cache by default: this share of the machine's memory, within bounds.
GUIDED_CACHE_SHARE = 64
GUIDED_CACHE_MIB_RANGE = (64, 1024)
# A compiling process needs room for itself (Python, outlines-core, the vocabulary) and for
# an ordinary pattern's index, a generic JSON object's included (figures: docs/limits.md).
MIN_GUIDED_COMPILE_MIB = 64
DEFAULT_GUIDED_COMPILE_MIB = 512
DEFAULT_GUIDED_COMPILE_CPU_SECONDS = 60
# The slots one request may hold by default: this share of maxBatchSize.
SLOTS_PER_REQUEST_SHARE = 8
# How long a prefill for another instance keeps its KV cache for that instance to read.
DEFAULT_KV_TRANSFER_LEASE_S = 120.0


@dataclass(frozen=True, slots=True)
class EngineConfig:
    """What the operator chose. Names follow MindIE's config.json where a concept matches.

    model: a Hugging Face folder or a .gguf file; None means the packaged SmolLM2.
    quantization: weight-only quantized linears on CPU (see `quantization.py`): int8, int4, or
    gguf (a GGUF file's own precision per matrix); none keeps the dtype's weights; auto is
    gguf for a .gguf file on a CPU unless a dtype is asked for (the file served in its own
    quantization, as llama.cpp serves it), none for anything else.
    cache_dir: where a GGUF file's one-time conversion to a Hugging Face folder is kept
    (parsing GGUF metadata is slow on a small CPU, the converted folder quick to load:
    docs/engine-measurements.md#start-up-and-loading).
    max_batched_tokens: prompt tokens computed per engine step, besides one token for each
    decoding request: a long prompt is prefilled in chunks of this size while running streams
    keep decoding. 0 picks by device (see `step_token_budget`): small on CPU, where a step's
    time grows with its tokens and a big prefill chunk would slow every decoding stream.
    max_prefill_tokens (MindIE's maxPrefillTokens) caps it too; while no request decodes, the
    first prompt in line is prefilled whole, up to max_prefill_tokens (see `scheduler.py`).
    The KV cache pool holds num_kv_blocks blocks of block_size tokens (MindIE's
    cacheBlockSize); num_kv_blocks 0 sizes the pool from kv_cache_mib.
    enable_deterministic_inference (SGLang's flag; vLLM's VLLM_BATCH_INVARIANT): every row's
    logits the same whatever else its step computes, so a seed reproduces its sequence alone,
    beside other requests, or with its prompt's start read from the prefix cache. By default
    products are computed the way measured fastest for each number of rows (see
    `measured_choice.py`), whose results differ in the last bits, enough to change a sampled
    token now and then; this keeps one way at every number of rows, one whose rows do not
    depend on each other, at some speed (docs/engine.md#deterministic-inference).
    enforce_eager (vLLM's name): no CUDA graphs; by default decode steps of up to
    max_batch_size sequences (at most 128) replay graphs on CUDA.
    num_speculative_tokens (TGI's --speculate): n-gram speculation, the tokens guessed and
    verified per decoding request and step (see `speculation.py`), in steps of at most
    speculative_max_batch decoding requests, beyond which a step's extra rows cost more than
    its guesses save; 0 turns it off.
    num_threads: torch's intra-op threads for the engine's thread; 0 keeps torch's default
    (every core), which batched faster than one thread even with the load generator on the
    same cores (docs/engine-measurements.md#threads); but a team as wide as the machine stalls
    at every op while another busy process holds a core, so lower it where other work shares
    the CPUs.
    chat_template (vLLM's --chat-template): a Jinja file replacing the model's chat template.
    tool_call_parser, enable_auto_tool_choice, reasoning_parser: vLLM's flags of those names
    (see `chat_output.py`): how the model writes tool calls and thinking, and whether a
    request may leave the choice of calling a tool to the model.
    kv_transfer_lease_s: how long a prefill done for another instance to decode keeps its KV
    cache when that instance neither reads nor releases it (see `kv_transfer.py`).
    """

    model: Path | None = None
    device: str = "auto"
    dtype: str = "auto"
    cache_dir: Path | None = None
    quantization: str = "auto"
    max_seq_len: int = 2560
    max_input_token_len: int = 2048
    max_iter_times: int = 512
    max_batch_size: int = 200
    max_prefill_tokens: int = 8192
    max_queue_len: int = 1000
    max_batched_tokens: int = 0
    block_size: int = 16
    num_kv_blocks: int = 0
    kv_cache_mib: int = 512
    enable_prefix_caching: bool = True
    num_threads: int = 0
    enforce_eager: bool = False
    enable_deterministic_inference: bool = False
    num_speculative_tokens: int = 0
    speculative_max_batch: int = 4
    chat_template: Path | None = None
    tool_call_parser: str | None = None
    enable_auto_tool_choice: bool = False
    reasoning_parser: str | None = None
    guided_cache_mib: int = 0
    guided_compile_mib: int = DEFAULT_GUIDED_COMPILE_MIB
    guided_compile_cpu_seconds: int = DEFAULT_GUIDED_COMPILE_CPU_SECONDS
    max_best_of: int = MAX_SEQUENCES
    max_slots_per_request: int = 0
    kv_transfer_lease_s: float = DEFAULT_KV_TRANSFER_LEASE_S

    def guided_cache_bytes(self) -> int:
        if self.guided_cache_mib:
            return self.guided_cache_mib * 2**20
        machine = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        low, high = GUIDED_CACHE_MIB_RANGE
        return min(max(machine // GUIDED_CACHE_SHARE, low * 2**20), high * 2**20)

    def compile_limits(self) -> CompileLimits:
        return CompileLimits(memory_bytes=self.guided_compile_mib * 2**20,
                             cpu_seconds=self.guided_compile_cpu_seconds)

    def slots_per_request(self) -> int:
        return self.max_slots_per_request or max(1, self.max_batch_size // SLOTS_PER_REQUEST_SHARE)

    def step_token_budget(self, device_type: str) -> int:
        """Prompt tokens per step. On a CPU a step's time grows with its tokens, so the chunk
        trades throughput for smooth streams: bigger chunks gave more throughput and rougher
        inter-token latency, and 128 also cut the time to first token at many streams
        (docs/engine-measurements.md#scheduling-and-chunked-prefill). Accelerators prefill big
        chunks almost free."""
        if self.max_batched_tokens:
            return self.max_batched_tokens
        return CPU_STEP_TOKENS if device_type == "cpu" else ACCELERATOR_STEP_TOKENS

    def __post_init__(self) -> None:
        if self.device not in DEVICES:
            raise ValueError(f"device must be one of {', '.join(DEVICES)}; got {self.device!r}")
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {', '.join(DTYPES)}; got {self.dtype!r}")
        if self.quantization not in QUANTIZATIONS:
            raise ValueError(f"quantization must be one of {', '.join(QUANTIZATIONS)}; "
                             f"got {self.quantization!r}")
        for name in ("max_seq_len", "max_input_token_len", "max_iter_times", "max_batch_size",
                     "max_prefill_tokens", "block_size", "kv_cache_mib",
                     "guided_compile_mib", "guided_compile_cpu_seconds", "max_best_of"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer; got {value!r}")
        for name in ("max_queue_len", "num_kv_blocks", "num_threads", "max_batched_tokens",
                     "num_speculative_tokens", "speculative_max_batch", "guided_cache_mib",
                     "max_slots_per_request"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"{name} must be a non-negative integer; got {value!r}")
        for name, known in (("tool_call_parser", tuple(TOOL_CALL_PARSERS)),
                            ("reasoning_parser", tuple(REASONING_PARSERS))):
            value = getattr(self, name)
            if value is not None and value not in known:
                raise ValueError(f"{name} must be one of {', '.join(known)}; got {value!r}")
        if self.enable_auto_tool_choice and self.tool_call_parser is None:
            raise ValueError("enable_auto_tool_choice needs a tool_call_parser")
        if self.guided_compile_mib < MIN_GUIDED_COMPILE_MIB:
            raise ValueError(f"guided_compile_mib must be at least {MIN_GUIDED_COMPILE_MIB} "
                             f"(the compiling process needs some itself); got "
                             f"{self.guided_compile_mib}")
        if self.max_best_of > MAX_SEQUENCES:
            raise ValueError(f"max_best_of must be at most {MAX_SEQUENCES}; got "
                             f"{self.max_best_of}")
        if self.max_slots_per_request > self.max_batch_size:
            raise ValueError(f"max_slots_per_request ({self.max_slots_per_request}) must not "
                             f"exceed max_batch_size ({self.max_batch_size})")
        if not self.kv_transfer_lease_s > 0:
            raise ValueError(f"kv_transfer_lease_s must be positive; got "
                             f"{self.kv_transfer_lease_s!r}")
        if self.max_iter_times > self.max_seq_len:
            raise ValueError(f"max_iter_times ({self.max_iter_times}) must not exceed "
                             f"max_seq_len ({self.max_seq_len})")


@dataclass(frozen=True, slots=True)
class EngineLimits:
    """Limits a request is validated against, fixed once the model is loaded.

    max_seq_len is the configured maxSeqLen capped by the model's position embeddings;
    max_input_len is maxInputTokenLen capped so at least one token can be generated; both
    are capped by the KV cache pool's capacity. max_token_bytes: the most bytes of text one
    token of the vocabulary stands for (see `loader.longest_token_bytes`). max_best_of: the
    most sequences one request may ask for (n, best_of).
    """

    vocab_size: int
    max_seq_len: int
    max_input_len: int
    max_iter_times: int
    max_token_bytes: int
    max_best_of: int = MAX_SEQUENCES

    @property
    def max_prompt_bytes(self) -> int:
        """The longest prompt text, in UTF-8 bytes, that max_input_len tokens can hold: one
        longer has more tokens than that whatever it says, so it is refused untokenized."""
        return self.max_input_len * self.max_token_bytes

    @classmethod
    def from_config(cls, config: EngineConfig, *, vocab_size: int, max_token_bytes: int,
                    max_position_embeddings: int, kv_capacity_tokens: int) -> EngineLimits:
        """A request must fit the KV pool alone, or it could never be scheduled. A limit
        configured above what is in force is logged, so the configuration a log shows is the
        one that holds."""
        max_seq_len = min(config.max_seq_len, max_position_embeddings, kv_capacity_tokens)
        if max_seq_len < config.max_seq_len:
            reason = ("the model's context (max_position_embeddings)"
                      if max_seq_len == max_position_embeddings
                      else "what the KV cache pool holds (kvCacheMiB / kvCacheBlocks)")
            logger.warning("maxSeqLen %d is above %s: %d tokens in force", config.max_seq_len,
                           reason, max_seq_len)
        if config.max_input_token_len > max_seq_len - 1:
            logger.warning("maxInputTokenLen %d leaves no room to generate within maxSeqLen "
                           "%d: %d tokens in force", config.max_input_token_len, max_seq_len,
                           max_seq_len - 1)
        return cls(
            vocab_size=vocab_size,
            max_seq_len=max_seq_len,
            max_input_len=min(config.max_input_token_len, max_seq_len - 1),
            max_iter_times=min(config.max_iter_times, max_seq_len),
            max_token_bytes=max_token_bytes,
            max_best_of=config.max_best_of,
        )
