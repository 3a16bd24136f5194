"""Where a listener may go without TLS: a loopback address only (a probe, a scraper or a mesh
sidecar on the same host), so that no one else on the network reads or drives it."""

from __future__ import annotations

import ipaddress


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_plaintext_host(host: str, what: str, override: str = "") -> None:
    """ValueError naming `what` (and the flag that would `override` the rule) unless `host` is
    a loopback address."""
    if not is_loopback(host):
        unless = f" unless {override} is given" if override else ""
        raise ValueError(f"{what} is allowed on a loopback address only{unless}; got {host!r}")
