"""The largest gRPC message the server and the gateway take or send, shared by both.

gRPC refuses a larger message as it arrives (RESOURCE_EXHAUSTED), before anything is parsed:
parsing a message costs several times its size in memory before any of its fields can be
checked (a 60 MB prompt cost the server 300 MB). No valid request comes near it: the longest
prompt is `maxInputTokenLen` tokens' worth of bytes (`max_prompt_bytes` in the model's config
parameters). gRPC's own default, 4 MiB, failed chat requests of a few MB through the gateway.
"""

from __future__ import annotations

MAX_MESSAGE_BYTES = 16 * 2**20
# A JSON body becomes a message of at most twice its size (KServe's token ids: "1," as four
# bytes of UINT32), so the gateway takes bodies of at most half a message.
MAX_BODY_BYTES = MAX_MESSAGE_BYTES // 2
