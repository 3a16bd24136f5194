"""`python -m bench`: throughput and latency of the real server over gRPC (mutual TLS) at
several concurrency levels, against plain transformers `generate` on the same model."""
