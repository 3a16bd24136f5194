"""TLS material for Switchboard's mutually authenticated gRPC server and HTTPS gateway.

``tls.pki`` creates a CA, server and client certificates and CRLs, and writes a dev PKI
with MindIE's file names (``ca.pem``, ``server.pem``, ``server.key.pem``, ``client.pem``,
``client.key.pem``, and the gateway's ``gateway.pem``, ``gateway.key.pem``);
``python -m tls --out tls/dev`` does that from the command line.
``tls.files`` loads a role's CA, certificate and key as PEM bytes and checks they parse
and belong together, raising :class:`TLSConfigError` with the file at fault. This package
depends only on ``cryptography``.
"""

from __future__ import annotations

from switchboard.tls.files import TLSConfigError, TLSFiles, TLSMaterial, dev_files
from switchboard.tls.pki import (
    CertificateAuthority,
    Credential,
    DevPKIPaths,
    create_ca,
    create_crl,
    issue_certificate,
    write_dev_pki,
)

__all__ = [
    "CertificateAuthority",
    "Credential",
    "DevPKIPaths",
    "TLSConfigError",
    "TLSFiles",
    "TLSMaterial",
    "create_ca",
    "create_crl",
    "dev_files",
    "issue_certificate",
    "write_dev_pki",
]
