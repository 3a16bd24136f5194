"""The REST gateway (Tornado, HTTPS): transcodes REST routes into gRPC calls. Filled in by later issues."""
