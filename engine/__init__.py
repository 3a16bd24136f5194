"""The model runtime: loads a causal LM, schedules requests and streams their tokens.

It knows nothing about gRPC or HTTP: callers build a `GenerationRequest` with
`validation.build_request` and consume `AsyncEngine.generate` as an async iterator of
`RequestOutput` events.
"""
