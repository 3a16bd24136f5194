"""What the server and the gateway must agree on, defined once for both."""

from __future__ import annotations

# The largest gRPC message either side takes or sends. gRPC refuses a larger one as it arrives
# (RESOURCE_EXHAUSTED), before anything is parsed, and parsing costs several times a message's
# size in memory; no valid request comes near it (the longest prompt is `max_prompt_bytes`, in
# the model's config parameters). gRPC's own default, 4 MiB, failed chat requests of a few MB.
MAX_MESSAGE_BYTES = 16 * 2**20
# A JSON body becomes a message of at most twice its size (KServe's token ids: "1," as four
# bytes of UINT32), so the gateway takes bodies of at most half a message.
MAX_BODY_BYTES = MAX_MESSAGE_BYTES // 2
GRPC_MESSAGE_OPTIONS = (("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
                        ("grpc.max_send_message_length", MAX_MESSAGE_BYTES))
# A forced stop (MindIE's /stopService?mode=Force, which kills its processes after 5 s) lets
# the requests in flight run this long at most, in the gateway and in the server that its
# StopService call tells.
FORCED_STOP_S = 5.0
