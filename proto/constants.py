"""What the server and the gateway must agree on, defined once for both."""

from __future__ import annotations

# The largest gRPC message either side takes or sends (gRPC's default, 4 MiB, failed a chat
# request of a few MB through the gateway as RESOURCE_EXHAUSTED, which clients read as
# "overloaded" and retry): past the gateway's body limit; Triton's server allows 2 GiB.
MAX_MESSAGE_BYTES = 256 * 1024 * 1024
GRPC_MESSAGE_OPTIONS = (("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
                        ("grpc.max_send_message_length", MAX_MESSAGE_BYTES))
# A forced stop (MindIE's /stopService?mode=Force, which kills its processes after 5 s) lets
# the requests in flight run this long at most, in the gateway and in the server that its
# StopService call tells.
FORCED_STOP_S = 5.0
# Triton's header asking ModelStreamInfer for stream errors as gRPC statuses rather than
# in-band messages (inference_protocols.md): the gateway sends it so that each status maps
# to its HTTP status.
GRPC_ERROR_HEADER = "triton_grpc_error"
