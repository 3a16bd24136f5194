"""KServe v2 / Triton protocol definitions (`grpc_service.proto`, `model_config.proto`), our
own `switchboard.proto` (service `switchboard.v1.Management`), the BYTES tensor format, and
vLLM's sampling defaults (`vllm_sampling`), which the gateway and the server both apply.

The generated modules `proto.grpc_service_pb2`, `proto.grpc_service_pb2_grpc` and
`proto.model_config_pb2`, `proto.switchboard_pb2` (plus their `.pyi` stubs) are produced at install time by
`setup.py` (or on demand by `make proto` / `python -m proto.compile`) and are not committed.
"""
