"""The tensors of Triton's vLLM backend interface beside `text_input` (vllm_backend's model
config), each of shape [1], by name with their KServe v2 datatypes. Shared by the server, which
serves that interface, and the gateway, whose generate routes send a JSON field named as one of
these inputs as that tensor, as Triton does with a model's inputs."""

from __future__ import annotations

SAMPLING_INPUT = "sampling_parameters"
CONTROL_INPUTS = {"stream": "BOOL", "exclude_input_in_output": "BOOL", SAMPLING_INPUT: "BYTES",
                  "return_finish_reason": "BOOL", "return_num_input_tokens": "BOOL",
                  "return_num_output_tokens": "BOOL"}
# Each extra output: the input that asks for it, and its datatype.
EXTRA_OUTPUTS = {"finish_reason": ("return_finish_reason", "BYTES"),
                 "num_input_tokens": ("return_num_input_tokens", "UINT32"),
                 "num_output_tokens": ("return_num_output_tokens", "UINT32")}
