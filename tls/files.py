"""Loading TLS material from PEM files, with errors that say which file is wrong and why."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Literal

from cryptography import x509
from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa

from switchboard.tls.pki import DevPKIPaths, key_matches
from switchboard.tls.revocation import Revocations, pem_crl_blocks, revocations

logger = logging.getLogger(__name__)


class TLSConfigError(ValueError):
    """A TLS file is missing, unreadable, malformed, or does not fit the others."""


@dataclass(frozen=True, slots=True)
class TLSMaterial:
    """PEM bytes as grpc.ssl_server_credentials / ssl_channel_credentials take them (the key
    decrypted, in memory only), and what the CRLs revoke (None: no CRL file)."""

    ca_pem: bytes
    cert_pem: bytes
    key_pem: bytes = field(repr=False)
    revocations: Revocations | None = None


@dataclass(frozen=True, slots=True)
class TLSFiles:
    """Paths of one side's TLS files: the CA bundle that verifies the peer, our certificate and
    its key (encrypted with `key_password`, or not), and optionally a file of CRLs (the CA's,
    and those of intermediate CAs the CA file holds) listing peer certificates to refuse.

    Nothing is checked at construction, the files may be created later; :meth:`load`
    reads and checks them.
    """

    ca_file: Path
    cert_file: Path
    key_file: Path
    crl_file: Path | None = None
    key_password: bytes | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        for name in ("ca_file", "cert_file", "key_file"):
            object.__setattr__(self, name, Path(getattr(self, name)))
        if self.crl_file is not None:
            object.__setattr__(self, "crl_file", Path(self.crl_file))

    def load(self) -> TLSMaterial:
        ca_pem = _read(self.ca_file, "CA certificate")
        cert_pem = _read(self.cert_file, "certificate")
        key_pem = _read(self.key_file, "private key")
        authorities = _parse_certificates(ca_pem, self.ca_file, "CA certificate")
        leaf = _parse_certificates(cert_pem, self.cert_file, "certificate")[0]
        _warn_outside_validity(leaf, self.cert_file)
        key = _parse_private_key(key_pem, self.key_file, self.key_password)
        if not key_matches(leaf, key):
            raise TLSConfigError(
                f"private key file {self.key_file} does not match the certificate in {self.cert_file}"
            )
        if b"ENCRYPTED" in key_pem:
            key_pem = key.private_bytes(serialization.Encoding.PEM,
                                        serialization.PrivateFormat.PKCS8,
                                        serialization.NoEncryption())
        return TLSMaterial(ca_pem=ca_pem, cert_pem=cert_pem, key_pem=key_pem,
                           revocations=None if self.crl_file is None
                           else _revocations(self.crl_file, authorities))


def dev_files(folder: Path, role: Literal["server", "client", "gateway"]) -> TLSFiles:
    """The files of a dev PKI folder (see :func:`tls.pki.write_dev_pki`) that ``role`` uses
    (the gateway's: its client certificate for its calls to the gRPC server)."""
    paths = DevPKIPaths.in_folder(folder)
    if role == "server":
        return TLSFiles(ca_file=paths.ca_cert, cert_file=paths.server_cert, key_file=paths.server_key)
    if role == "client":
        return TLSFiles(ca_file=paths.ca_cert, cert_file=paths.client_cert, key_file=paths.client_key)
    if role == "gateway":
        return TLSFiles(ca_file=paths.ca_cert, cert_file=paths.gateway_cert,
                        key_file=paths.gateway_key)
    raise ValueError(f"role must be 'server', 'client' or 'gateway', got {role!r}")


def _warn_outside_validity(certificate: x509.Certificate, path: Path) -> None:
    """Loaded all the same (a rotation may be on its way), but peers will refuse it."""
    start, end = certificate.not_valid_before_utc, certificate.not_valid_after_utc
    if not start <= datetime.now(timezone.utc) <= end:
        logger.warning("certificate %s is valid from %s to %s only: peers refuse it now",
                       path, start.isoformat(), end.isoformat())


def _read(path: Path, what: str) -> bytes:
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise TLSConfigError(f"{what} file {path} does not exist") from None
    except OSError as exc:
        raise TLSConfigError(f"{what} file {path} cannot be read: {exc.strerror or exc}") from exc
    if not data.strip():
        raise TLSConfigError(f"{what} file {path} is empty")
    return data


def _parse_certificates(pem: bytes, path: Path, what: str) -> list[x509.Certificate]:
    """All certificates of a PEM file; a certificate file may carry its intermediates after the leaf."""
    try:
        certificates = x509.load_pem_x509_certificates(pem)
    except ValueError as exc:
        raise TLSConfigError(f"{what} file {path} is not a PEM certificate: {exc}") from exc
    if not certificates:
        raise TLSConfigError(f"{what} file {path} holds no PEM certificate")
    return certificates


def _parse_private_key(pem: bytes, path: Path, password: bytes | None
                       ) -> ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey:
    """`password` decrypts an encrypted key; an unencrypted key needs none (one password may
    serve a process whose keys are not all encrypted)."""
    encrypted = b"ENCRYPTED" in pem
    try:
        key = serialization.load_pem_private_key(pem, password=password if encrypted else None)
    except TypeError as exc:
        raise TLSConfigError(f"private key file {path} is encrypted and no key password was "
                             "given") from exc
    except ValueError as exc:
        if encrypted and password is not None:
            raise TLSConfigError(f"private key file {path} cannot be decrypted with the key "
                                 "password given") from None
        raise TLSConfigError(f"private key file {path} is not a PEM private key: {exc}") from exc
    except UnsupportedAlgorithm as exc:
        raise TLSConfigError(f"private key file {path} uses an unsupported algorithm: {exc}") from exc
    if not isinstance(key, ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey):
        raise TLSConfigError(f"private key file {path} holds a {type(key).__name__}; EC or RSA is needed")
    return key


def _revocations(path: Path, authorities: list[x509.Certificate]) -> Revocations:
    """What the file's PEM CRLs revoke, once each one's signature checks out against a CA."""
    blocks = pem_crl_blocks(_read(path, "CRL"))
    if not blocks:
        raise TLSConfigError(f"CRL file {path} is not a PEM CRL: it holds no X509 CRL block")
    crls = []
    for block in blocks:
        try:
            crl = x509.load_pem_x509_crl(block)
        except ValueError as exc:
            raise TLSConfigError(f"CRL file {path} is not a PEM CRL: {exc}") from exc
        if not any(crl.issuer == authority.subject
                   and crl.is_signature_valid(authority.public_key())
                   for authority in authorities):
            raise TLSConfigError(f"CRL file {path}: the CRL of {crl.issuer.rfc4514_string()} "
                                 "is not signed by the CA file's certificates")
        crls.append(crl)
    return revocations(crls, authorities)
