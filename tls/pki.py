"""Certificate generation: a CA, server and client certificates, CRLs, and the dev PKI on disk."""

from __future__ import annotations

import ipaddress
import os
import re
import tempfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Literal

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

PrivateKey = ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey
KeyType = Literal["ec", "rsa"]
CertificateKind = Literal["server", "client"]

DEV_HOSTS: tuple[str, ...] = ("localhost", "127.0.0.1", "::1")
DEV_CLIENT_NAME = "switchboard-dev-client"
# The common name of the gateway's own client certificate (gateway.pem), which the gRPC server
# takes as a management identity by default: its StopService relays MindIE's /stopService.
GATEWAY_IDENTITY = "switchboard-gateway"

# Letters, digits, '-' and '_' labels, optionally a leading wildcard label: catches typos
# such as a space or a URL passed as a host, which would yield an unusable certificate.
_DNS_NAME = re.compile(r"(\*\.)?[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*\.?")

# Default start of validity is slightly in the past so that a peer whose clock runs a
# little behind ours does not reject a certificate issued a moment ago.
_CLOCK_SKEW = timedelta(minutes=5)


@dataclass(frozen=True, slots=True)
class Credential:
    """A certificate and its private key."""

    certificate: x509.Certificate
    private_key: PrivateKey

    @property
    def serial_number(self) -> int:
        return self.certificate.serial_number

    def certificate_pem(self) -> bytes:
        return self.certificate.public_bytes(serialization.Encoding.PEM)

    def private_key_pem(self) -> bytes:
        """The key as unencrypted PKCS8 PEM, the form gRPC and Python's ssl module load."""
        return self.private_key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )


@dataclass(frozen=True, slots=True)
class CertificateAuthority(Credential):
    """A credential whose certificate is a CA certificate, able to sign others."""

    @classmethod
    def from_pem(cls, certificate_pem: bytes, private_key_pem: bytes) -> CertificateAuthority:
        """Load a CA written earlier (e.g. the dev PKI's ``ca.pem`` and ``ca.key.pem``)."""
        certificate = x509.load_pem_x509_certificate(certificate_pem)
        private_key = serialization.load_pem_private_key(private_key_pem, password=None)
        if not isinstance(private_key, ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey):
            raise ValueError(f"unsupported CA key type {type(private_key).__name__}")
        try:
            is_ca = certificate.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
        except x509.ExtensionNotFound:
            is_ca = False
        if not is_ca:
            raise ValueError("the certificate is not a CA certificate (basicConstraints CA=true missing)")
        if not key_matches(certificate, private_key):
            raise ValueError("the private key does not belong to the CA certificate")
        return cls(certificate, private_key)


@dataclass(frozen=True, slots=True)
class DevPKIPaths:
    """Where the dev PKI lives; file names follow MindIE's TLS documentation."""

    folder: Path
    ca_cert: Path
    ca_key: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    gateway_cert: Path
    gateway_key: Path

    @classmethod
    def in_folder(cls, folder: Path) -> DevPKIPaths:
        folder = Path(folder)
        return cls(
            folder=folder,
            ca_cert=folder / "ca.pem",
            ca_key=folder / "ca.key.pem",
            server_cert=folder / "server.pem",
            server_key=folder / "server.key.pem",
            client_cert=folder / "client.pem",
            client_key=folder / "client.key.pem",
            gateway_cert=folder / "gateway.pem",
            gateway_key=folder / "gateway.key.pem",
        )

    def files(self) -> tuple[Path, ...]:
        return (
            self.ca_cert,
            self.ca_key,
            self.server_cert,
            self.server_key,
            self.client_cert,
            self.client_key,
            self.gateway_cert,
            self.gateway_key,
        )


def key_matches(certificate: x509.Certificate, private_key: PrivateKey) -> bool:
    """Whether ``private_key`` is the key of ``certificate``'s public key."""
    spki = serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    return certificate.public_key().public_bytes(*spki) == private_key.public_key().public_bytes(*spki)


def create_ca(common_name: str, *, valid_days: int = 3650, key_type: KeyType = "ec",
              issuer: CertificateAuthority | None = None) -> CertificateAuthority:
    """A CA: a self-signed root, or an intermediate signed by `issuer`."""
    if valid_days <= 0:
        raise ValueError(f"valid_days must be positive, got {valid_days}")
    key = _generate_key(key_type)
    name = _name(common_name)
    not_before = _now() - _CLOCK_SKEW
    ski = x509.SubjectKeyIdentifier.from_public_key(key.public_key())
    certificate = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name if issuer is None else issuer.certificate.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(not_before)
        .not_valid_after(not_before + timedelta(days=valid_days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            _key_usage(digital_signature=False, key_encipherment=False, ca=True),
            critical=True,
        )
        .add_extension(ski, critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ski) if issuer is None
            else _authority_key_identifier(issuer),
            critical=False,
        )
        .sign(key if issuer is None else issuer.private_key, hashes.SHA256())
    )
    return CertificateAuthority(certificate, key)


def issue_certificate(
    ca: CertificateAuthority,
    common_name: str,
    *,
    kind: CertificateKind,
    hosts: Sequence[str],
    not_before: datetime | None = None,
    not_after: datetime | None = None,
    valid_days: int = 825,
    key_type: KeyType = "ec",
    serial_number: int | None = None,
) -> Credential:
    """A leaf certificate signed by ``ca`` for a TLS server or client.

    ``hosts`` are DNS names or IP address strings for the subjectAltName. At least one
    is needed, for a client too (the name it is known by): RFC 5280 profile verifiers
    such as ``cryptography``'s reject a leaf without one. ``not_after`` overrides
    ``valid_days``; both bounds may lie in the past (to make an expired certificate for
    tests). Revoke a certificate by passing its ``serial_number`` to :func:`create_crl`.
    """
    if isinstance(hosts, str):
        raise TypeError("hosts must be a sequence of host names, not a single string")
    if kind not in ("server", "client"):
        raise ValueError(f"kind must be 'server' or 'client', got {kind!r}")
    if not hosts:
        raise ValueError("a certificate needs at least one host for its subjectAltName")
    start = _utc(not_before, "not_before") if not_before is not None else _now() - _CLOCK_SKEW
    if not_after is not None:
        end = _utc(not_after, "not_after")
    elif valid_days > 0:
        end = start + timedelta(days=valid_days)
    else:
        raise ValueError(f"valid_days must be positive, got {valid_days}")
    if end <= start:
        raise ValueError(f"not_after ({end}) must be later than not_before ({start})")

    key = _generate_key(key_type)
    eku = ExtendedKeyUsageOID.SERVER_AUTH if kind == "server" else ExtendedKeyUsageOID.CLIENT_AUTH
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(common_name))
        .issuer_name(ca.certificate.subject)
        .public_key(key.public_key())
        .serial_number(serial_number if serial_number is not None else x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(end)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            _key_usage(
                digital_signature=True,
                key_encipherment=isinstance(key, rsa.RSAPrivateKey),
                ca=False,
            ),
            critical=True,
        )
        .add_extension(x509.ExtendedKeyUsage([eku]), critical=False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .add_extension(_authority_key_identifier(ca), critical=False)
        .add_extension(
            x509.SubjectAlternativeName([_general_name(host) for host in hosts]),
            critical=False,
        )
    )
    return Credential(builder.sign(ca.private_key, hashes.SHA256()), key)


def create_crl(
    ca: CertificateAuthority,
    revoked_serial_numbers: Iterable[int],
    *,
    crl_number: int = 1,
    valid_days: int = 30,
    revocation_date: datetime | None = None,
) -> bytes:
    """A CRL signed by ``ca`` listing ``revoked_serial_numbers``, as PEM."""
    if valid_days <= 0:
        raise ValueError(f"valid_days must be positive, got {valid_days}")
    now = _now()
    revoked_at = _utc(revocation_date, "revocation_date") if revocation_date is not None else now
    builder = (
        x509.CertificateRevocationListBuilder()
        .issuer_name(ca.certificate.subject)
        .last_update(now - _CLOCK_SKEW)
        .next_update(now + timedelta(days=valid_days))
        .add_extension(x509.CRLNumber(crl_number), critical=False)
        .add_extension(_authority_key_identifier(ca), critical=False)
    )
    for serial in revoked_serial_numbers:
        builder = builder.add_revoked_certificate(
            x509.RevokedCertificateBuilder().serial_number(serial).revocation_date(revoked_at).build()
        )
    return builder.sign(ca.private_key, hashes.SHA256()).public_bytes(serialization.Encoding.PEM)


def write_dev_pki(
    folder: Path,
    *,
    hosts: Sequence[str] = DEV_HOSTS,
    overwrite: bool = False,
) -> DevPKIPaths:
    """Create a dev CA with one server certificate and two client certificates under
    ``folder``: an ordinary client's, and the gateway's own for its calls to the gRPC server
    (GATEWAY_IDENTITY, a management identity there).

    If every file already exists and ``overwrite`` is false, nothing is written. If
    only some exist, all are regenerated: a partial set may mix certificates of
    different CAs. Private keys are written with mode 0600.
    """
    paths = DevPKIPaths.in_folder(folder)
    if not overwrite and all(path.is_file() for path in paths.files()):
        return paths
    ca = create_ca("Switchboard dev CA")
    server = issue_certificate(ca, "switchboard-dev-server", kind="server", hosts=hosts)
    client = issue_certificate(ca, DEV_CLIENT_NAME, kind="client", hosts=(DEV_CLIENT_NAME,))
    gateway = issue_certificate(ca, GATEWAY_IDENTITY, kind="client", hosts=(GATEWAY_IDENTITY,))
    paths.folder.mkdir(parents=True, exist_ok=True)
    for credential, cert_path, key_path in (
        (ca, paths.ca_cert, paths.ca_key),
        (server, paths.server_cert, paths.server_key),
        (client, paths.client_cert, paths.client_key),
        (gateway, paths.gateway_cert, paths.gateway_key),
    ):
        _write_atomically(key_path, credential.private_key_pem(), mode=0o600)
        _write_atomically(cert_path, credential.certificate_pem(), mode=0o644)
    return paths


def _write_atomically(path: Path, data: bytes, *, mode: int) -> None:
    """Write through a temporary file so readers never see a partial file or a key with loose permissions."""
    fd, tmp_name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, mode)
        with os.fdopen(fd, "wb") as tmp:
            tmp.write(data)
        os.replace(tmp_name, path)
    except BaseException:
        Path(tmp_name).unlink(missing_ok=True)
        raise


def _authority_key_identifier(ca: CertificateAuthority) -> x509.AuthorityKeyIdentifier:
    """From the CA's subjectKeyIdentifier, or its public key for a CA loaded from elsewhere without one."""
    try:
        ski = ca.certificate.extensions.get_extension_for_class(x509.SubjectKeyIdentifier).value
    except x509.ExtensionNotFound:
        return x509.AuthorityKeyIdentifier.from_issuer_public_key(ca.certificate.public_key())
    return x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ski)


def _generate_key(key_type: KeyType) -> PrivateKey:
    if key_type == "ec":
        return ec.generate_private_key(ec.SECP256R1())
    if key_type == "rsa":
        return rsa.generate_private_key(public_exponent=65537, key_size=2048)
    raise ValueError(f"key_type must be 'ec' or 'rsa', got {key_type!r}")


def _key_usage(*, digital_signature: bool, key_encipherment: bool, ca: bool) -> x509.KeyUsage:
    return x509.KeyUsage(
        digital_signature=digital_signature,
        content_commitment=False,
        key_encipherment=key_encipherment,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=ca,
        crl_sign=ca,
        encipher_only=False,
        decipher_only=False,
    )


def _general_name(host: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(host))
    except ValueError:
        pass
    if not _DNS_NAME.fullmatch(host):
        raise ValueError(f"host {host!r} is neither an IP address nor a DNS name")
    return x509.DNSName(host)


def _name(common_name: str) -> x509.Name:
    if not common_name:
        raise ValueError("common_name must not be empty")
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _now() -> datetime:
    return datetime.now(timezone.utc)


def _utc(moment: datetime, what: str) -> datetime:
    """Reject naive datetimes: reading them as local time or as UTC would both surprise someone."""
    if moment.tzinfo is None or moment.utcoffset() is None:
        raise ValueError(f"{what} must be timezone-aware, got {moment!r}")
    return moment.astimezone(timezone.utc)
