"""Switchboard: an LLM inference endpoint. Many protocols come in, one engine answers.

The repository's top-level folders are this package's subpackages (`switchboard.engine`,
`switchboard.server`, `switchboard.gateway`, `switchboard.proto`, `switchboard.tls`); the
command line and the supervisor of `switchboard run` live here, above the server and the gateway.
"""
