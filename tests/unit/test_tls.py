"""The tls package: certificate generation, the dev PKI on disk, loading, and real mTLS handshakes."""

from __future__ import annotations

import ipaddress
import socket
import ssl
import stat
import threading
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.x509.oid import ExtendedKeyUsageOID
from cryptography.x509.verification import DNSName, IPAddress, PolicyBuilder, Store, VerificationError

from switchboard.tls import (
    CertificateAuthority,
    Credential,
    DevPKIPaths,
    TLSConfigError,
    TLSFiles,
    TLSMaterial,
    create_ca,
    create_crl,
    dev_files,
    issue_certificate,
    write_dev_pki,
)
from switchboard.tls.__main__ import main as cli_main
from switchboard.tls.revocation import revocations

MINDIE_NAMES = {"ca.pem", "ca.key.pem", "server.pem", "server.key.pem", "client.pem", "client.key.pem",
                "gateway.pem", "gateway.key.pem"}


@pytest.fixture(scope="module")
def dev_pki(tmp_path_factory: pytest.TempPathFactory) -> DevPKIPaths:
    """One dev PKI shared by the tests that only read it."""
    return write_dev_pki(tmp_path_factory.mktemp("pki") / "dev")


@pytest.fixture(scope="module")
def other_pki(tmp_path_factory: pytest.TempPathFactory) -> DevPKIPaths:
    """A second, unrelated dev PKI: its certificates must not be trusted by the first."""
    return write_dev_pki(tmp_path_factory.mktemp("pki") / "other")


def _cert(path: Path) -> x509.Certificate:
    return x509.load_pem_x509_certificate(path.read_bytes())


def _store(paths: DevPKIPaths) -> Store:
    return Store([_cert(paths.ca_cert)])


def _eku(certificate: x509.Certificate) -> list[x509.ObjectIdentifier]:
    return list(certificate.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value)


# --- dev PKI on disk --------------------------------------------------------------------


def test_dev_pki_writes_mindie_file_names_with_private_keys_0600(dev_pki: DevPKIPaths) -> None:
    assert {path.name for path in dev_pki.folder.iterdir()} == MINDIE_NAMES
    for key in (dev_pki.ca_key, dev_pki.server_key, dev_pki.client_key):
        assert stat.S_IMODE(key.stat().st_mode) == 0o600, key
        assert key.read_bytes().startswith(b"-----BEGIN PRIVATE KEY-----"), "unencrypted PKCS8 PEM expected"
    for cert in (dev_pki.ca_cert, dev_pki.server_cert, dev_pki.client_cert):
        assert not stat.S_IMODE(cert.stat().st_mode) & 0o022, "certificates must not be group/world writable"


def test_dev_server_certificate_covers_localhost_and_loopback_for_server_auth(dev_pki: DevPKIPaths) -> None:
    server = _cert(dev_pki.server_cert)
    san = server.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.DNSName) == ["localhost"]
    assert san.get_values_for_type(x509.IPAddress) == [
        ipaddress.ip_address("127.0.0.1"),
        ipaddress.ip_address("::1"),
    ]
    assert _eku(server) == [ExtendedKeyUsageOID.SERVER_AUTH]

    builder = PolicyBuilder().store(_store(dev_pki))
    loopback = [IPAddress(ipaddress.ip_address(ip)) for ip in ("127.0.0.1", "::1")]
    for subject in (DNSName("localhost"), *loopback):
        chain = builder.build_server_verifier(subject).verify(server, [])
        assert chain[-1] == _cert(dev_pki.ca_cert)
    with pytest.raises(VerificationError):
        builder.build_server_verifier(DNSName("example.com")).verify(server, [])


def test_dev_client_certificate_verifies_for_client_auth_only(dev_pki: DevPKIPaths) -> None:
    client = _cert(dev_pki.client_cert)
    assert _eku(client) == [ExtendedKeyUsageOID.CLIENT_AUTH]
    builder = PolicyBuilder().store(_store(dev_pki))
    verified = builder.build_client_verifier().verify(client, [])
    assert verified.chain[-1] == _cert(dev_pki.ca_cert)
    client_name = client.extensions.get_extension_for_class(x509.SubjectAlternativeName).value.get_values_for_type(
        x509.DNSName
    )[0]
    with pytest.raises(VerificationError, match="EKU"):
        builder.build_server_verifier(DNSName(client_name)).verify(client, [])
    with pytest.raises(VerificationError, match="EKU"):
        builder.build_client_verifier().verify(_cert(dev_pki.server_cert), [])


def test_certificate_of_another_ca_does_not_verify(dev_pki: DevPKIPaths, other_pki: DevPKIPaths) -> None:
    builder = PolicyBuilder().store(_store(dev_pki))
    with pytest.raises(VerificationError):
        builder.build_client_verifier().verify(_cert(other_pki.client_cert), [])
    with pytest.raises(VerificationError):
        builder.build_server_verifier(DNSName("localhost")).verify(_cert(other_pki.server_cert), [])


def test_write_dev_pki_keeps_existing_files_unless_asked(tmp_path: Path) -> None:
    paths = write_dev_pki(tmp_path / "pki")
    before = {path: path.read_bytes() for path in paths.files()}

    assert write_dev_pki(tmp_path / "pki") == paths
    assert {path: path.read_bytes() for path in paths.files()} == before

    write_dev_pki(tmp_path / "pki", overwrite=True)
    assert all(path.read_bytes() != before[path] for path in paths.files())


def test_write_dev_pki_regenerates_everything_when_a_file_is_missing(tmp_path: Path) -> None:
    paths = write_dev_pki(tmp_path)
    old_ca = paths.ca_cert.read_bytes()
    paths.client_key.unlink()

    write_dev_pki(tmp_path)

    assert paths.client_key.is_file()
    assert paths.ca_cert.read_bytes() != old_ca
    PolicyBuilder().store(_store(paths)).build_client_verifier().verify(_cert(paths.client_cert), [])


def test_cli_writes_dev_pki_and_prints_where(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli_main(["--out", str(tmp_path / "dev")]) == 0
    assert {path.name for path in (tmp_path / "dev").iterdir()} == MINDIE_NAMES
    out = capsys.readouterr().out
    assert str(tmp_path / "dev") in out and "server.key.pem" in out


def test_ca_written_to_disk_can_issue_more_client_certificates(dev_pki: DevPKIPaths) -> None:
    ca = CertificateAuthority.from_pem(dev_pki.ca_cert.read_bytes(), dev_pki.ca_key.read_bytes())
    extra = issue_certificate(ca, "extra-client", kind="client", hosts=["extra-client"])
    PolicyBuilder().store(_store(dev_pki)).build_client_verifier().verify(extra.certificate, [])
    with pytest.raises(ValueError, match="not a CA"):
        CertificateAuthority.from_pem(dev_pki.server_cert.read_bytes(), dev_pki.server_key.read_bytes())


# --- issuing ---------------------------------------------------------------------------


def test_expired_certificate_is_reported_as_expired(tmp_path: Path) -> None:
    ca = create_ca("test CA")
    now = datetime.now(timezone.utc)
    expired = issue_certificate(
        ca,
        "expired",
        kind="server",
        hosts=["localhost"],
        not_before=now - timedelta(days=10),
        not_after=now - timedelta(days=1),
    )
    assert expired.certificate.not_valid_after_utc < now
    builder = PolicyBuilder().store(Store([ca.certificate]))
    with pytest.raises(VerificationError, match="not valid at validation time"):
        builder.build_server_verifier(DNSName("localhost")).verify(expired.certificate, [])

    # OpenSSL, which gRPC and the ssl module use, says so in a handshake too.
    paths = DevPKIPaths.in_folder(tmp_path)
    paths.ca_cert.write_bytes(ca.certificate_pem())
    paths.server_cert.write_bytes(expired.certificate_pem())
    paths.server_key.write_bytes(expired.private_key_pem())
    server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server.load_cert_chain(paths.server_cert, paths.server_key)
    _, client_error = _exchange(server, _client_context(paths.ca_cert, None))
    assert isinstance(client_error, ssl.SSLCertVerificationError), client_error
    assert client_error.verify_message == "certificate has expired"


@pytest.mark.parametrize(("days_from", "days_to"), [(-10, -1), (1, 10)],
                         ids=["expired", "not yet valid"])
def test_a_certificate_outside_its_validity_loads_with_a_warning(
        tmp_path: Path, caplog: pytest.LogCaptureFixture, days_from: int, days_to: int) -> None:
    """An operator sees why every peer refuses the server (the files load: a rotation may
    be on its way)."""
    ca = create_ca("test CA")
    now = datetime.now(timezone.utc)
    credential = issue_certificate(ca, "server", kind="server", hosts=["localhost"],
                                   not_before=now + timedelta(days=days_from),
                                   not_after=now + timedelta(days=days_to))
    paths = DevPKIPaths.in_folder(tmp_path)
    paths.ca_cert.write_bytes(ca.certificate_pem())
    paths.server_cert.write_bytes(credential.certificate_pem())
    paths.server_key.write_bytes(credential.private_key_pem())
    with caplog.at_level("WARNING", logger="switchboard.tls.files"):
        dev_files(tmp_path, "server").load()
    [record] = caplog.records
    assert record.getMessage().startswith(f"certificate {paths.server_cert} is valid from ")
    assert record.getMessage().endswith(" only: peers refuse it now")


def test_a_certificate_within_its_validity_loads_without_a_warning(
        dev_pki: DevPKIPaths, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level("WARNING", logger="switchboard.tls.files"):
        dev_files(dev_pki.folder, "server").load()
    assert caplog.records == []


def test_rsa_certificates_add_key_encipherment() -> None:
    ca = create_ca("rsa CA", key_type="rsa")
    leaf = issue_certificate(ca, "rsa server", kind="server", hosts=["localhost"], key_type="rsa")
    usage = leaf.certificate.extensions.get_extension_for_class(x509.KeyUsage).value
    assert usage.digital_signature and usage.key_encipherment
    verifier = PolicyBuilder().store(Store([ca.certificate])).build_server_verifier(DNSName("localhost"))
    verifier.verify(leaf.certificate, [])


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"hosts": []}, "at least one host"),
        ({"hosts": ["bad host"]}, "neither an IP address nor a DNS name"),
        ({"hosts": ["localhost"], "not_before": datetime(2020, 1, 1)}, "timezone-aware"),
        (
            {
                "hosts": ["localhost"],
                "not_before": datetime(2020, 1, 2, tzinfo=timezone.utc),
                "not_after": datetime(2020, 1, 1, tzinfo=timezone.utc),
            },
            "must be later",
        ),
    ],
)
def test_issue_certificate_rejects_bad_arguments(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        issue_certificate(create_ca("test CA"), "leaf", kind="server", **kwargs)  # type: ignore[arg-type]


def test_crl_lists_revoked_serials_and_is_signed_by_the_ca() -> None:
    ca = create_ca("test CA")
    revoked = issue_certificate(ca, "revoked", kind="client", hosts=["revoked"])
    kept = issue_certificate(ca, "kept", kind="client", hosts=["kept"])
    crl = x509.load_pem_x509_crl(create_crl(ca, [revoked.serial_number]))
    assert crl.is_signature_valid(ca.certificate.public_key())
    assert crl.issuer == ca.certificate.subject
    assert crl.get_revoked_certificate_by_serial_number(revoked.serial_number) is not None
    assert crl.get_revoked_certificate_by_serial_number(kept.serial_number) is None


def chain_refusal(crls: list[bytes], authorities: list[CertificateAuthority],
                  *presented: Credential) -> str | None:
    """Why Revocations built from `crls` refuses a peer presenting `presented`, or None."""
    loaded = [x509.load_pem_x509_crl(crl) for crl in crls]
    checks = revocations(loaded, [ca.certificate for ca in authorities])
    return checks.refusal(b"".join(credential.certificate_pem() for credential in presented))


def test_revocation_covers_every_certificate_of_the_chain_as_openssl_crl_check_all() -> None:
    root = create_ca("root CA")
    intermediate = create_ca("intermediate CA", issuer=root)
    leaf = issue_certificate(intermediate, "leaf", kind="client", hosts=["leaf"])
    direct = issue_certificate(root, "direct", kind="client", hosts=["direct"])
    cas = [root, intermediate]
    assert chain_refusal([create_crl(root, []), create_crl(intermediate, [])], cas, leaf) is None
    assert chain_refusal([create_crl(root, [intermediate.serial_number]),
                          create_crl(intermediate, [])], cas, leaf, intermediate) == \
        "the certificate of CN=intermediate CA has been revoked"
    assert chain_refusal([create_crl(root, []), create_crl(intermediate, [leaf.serial_number])],
                         cas, leaf) == "the certificate of CN=leaf has been revoked"
    # A serial number revoked by another issuer's CRL is not this certificate's.
    assert chain_refusal([create_crl(root, [leaf.serial_number]), create_crl(intermediate, [])],
                         cas, leaf) is None
    assert chain_refusal([create_crl(root, [])], cas, leaf) == \
        "no CRL of CN=intermediate CA is loaded"
    assert chain_refusal([create_crl(root, [])], cas, direct) is None


# --- loading ---------------------------------------------------------------------------


@pytest.mark.parametrize("role", ["server", "client"])
def test_dev_files_load_the_role_pem_bytes(dev_pki: DevPKIPaths, role: str) -> None:
    files = dev_files(dev_pki.folder, role)  # type: ignore[arg-type]
    assert files.cert_file.name == f"{role}.pem" and files.key_file.name == f"{role}.key.pem"
    material = files.load()
    assert material == TLSMaterial(
        ca_pem=dev_pki.ca_cert.read_bytes(),
        cert_pem=files.cert_file.read_bytes(),
        key_pem=files.key_file.read_bytes(),
    )
    assert b"PRIVATE KEY" not in repr(material).encode()


@pytest.mark.parametrize(
    ("missing", "what"),
    [("ca_file", "CA certificate"), ("cert_file", "certificate"), ("key_file", "private key")],
)
def test_load_names_the_missing_file(dev_pki: DevPKIPaths, tmp_path: Path, missing: str, what: str) -> None:
    paths = {"ca_file": dev_pki.ca_cert, "cert_file": dev_pki.server_cert, "key_file": dev_pki.server_key}
    paths[missing] = tmp_path / "nope.pem"
    with pytest.raises(TLSConfigError, match=rf"^{what} file .*nope\.pem does not exist"):
        TLSFiles(**paths).load()


def test_load_rejects_a_key_that_does_not_match_the_certificate(dev_pki: DevPKIPaths) -> None:
    files = TLSFiles(ca_file=dev_pki.ca_cert, cert_file=dev_pki.server_cert, key_file=dev_pki.client_key)
    with pytest.raises(TLSConfigError, match=r"client\.key\.pem does not match the certificate in .*server\.pem"):
        files.load()


def _encrypted_copy(key_file: Path, folder: Path, password: bytes) -> Path:
    encrypted = folder / "encrypted.key.pem"
    key = serialization.load_pem_private_key(key_file.read_bytes(), password=None)
    encrypted.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                            serialization.PrivateFormat.PKCS8,
                                            serialization.BestAvailableEncryption(password)))
    return encrypted


def test_an_encrypted_key_loads_with_its_password_and_is_handed_on_decrypted(
        dev_pki: DevPKIPaths, tmp_path: Path) -> None:
    encrypted = _encrypted_copy(dev_pki.server_key, tmp_path, b"s3cret")
    files = TLSFiles(dev_pki.ca_cert, dev_pki.server_cert, encrypted, key_password=b"s3cret")
    material = files.load()
    assert serialization.load_pem_private_key(material.key_pem, password=None)
    assert "s3cret" not in repr(files) and "s3cret" not in repr(material)


def test_a_wrong_key_password_is_named_and_an_unencrypted_key_needs_none(
        dev_pki: DevPKIPaths, tmp_path: Path) -> None:
    encrypted = _encrypted_copy(dev_pki.server_key, tmp_path, b"s3cret")
    with pytest.raises(TLSConfigError, match="cannot be decrypted with the key password"):
        TLSFiles(dev_pki.ca_cert, dev_pki.server_cert, encrypted, key_password=b"wrong").load()
    plain = TLSFiles(dev_pki.ca_cert, dev_pki.server_cert, dev_pki.server_key,
                     key_password=b"s3cret").load()
    assert plain.key_pem == dev_pki.server_key.read_bytes()


def test_a_crl_of_the_ca_gives_its_revoked_serial_numbers(dev_pki: DevPKIPaths,
                                                           tmp_path: Path) -> None:
    ca = CertificateAuthority.from_pem(dev_pki.ca_cert.read_bytes(), dev_pki.ca_key.read_bytes())
    crl = tmp_path / "ca.crl.pem"
    crl.write_bytes(create_crl(ca, [7, 11]))
    files = TLSFiles(dev_pki.ca_cert, dev_pki.server_cert, dev_pki.server_key, crl_file=crl)
    issuer = ca.certificate.subject
    assert files.load().revocations.revoked == {(issuer, 7), (issuer, 11)}


def test_a_crl_of_another_ca_or_not_a_crl_is_refused(dev_pki: DevPKIPaths,
                                                     tmp_path: Path) -> None:
    crl = tmp_path / "other.crl.pem"
    crl.write_bytes(create_crl(create_ca("another CA"), [7]))
    with pytest.raises(TLSConfigError, match="is not signed by the CA"):
        TLSFiles(dev_pki.ca_cert, dev_pki.server_cert, dev_pki.server_key, crl_file=crl).load()
    crl.write_bytes(b"garbage")
    with pytest.raises(TLSConfigError, match="is not a PEM CRL"):
        TLSFiles(dev_pki.ca_cert, dev_pki.server_cert, dev_pki.server_key, crl_file=crl).load()


def test_load_rejects_files_that_are_not_pem(dev_pki: DevPKIPaths, tmp_path: Path) -> None:
    garbage = tmp_path / "garbage.pem"
    garbage.write_bytes(b"not a pem file\n")
    with pytest.raises(TLSConfigError, match=r"^certificate file .*garbage\.pem is not a PEM certificate"):
        TLSFiles(dev_pki.ca_cert, garbage, dev_pki.server_key).load()
    with pytest.raises(TLSConfigError, match=r"^private key file .*garbage\.pem is not a PEM private key"):
        TLSFiles(dev_pki.ca_cert, dev_pki.server_cert, garbage).load()
    encrypted = tmp_path / "encrypted.key.pem"
    key = serialization.load_pem_private_key(dev_pki.server_key.read_bytes(), password=None)
    encrypted.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.BestAvailableEncryption(b"secret"),
        )
    )
    with pytest.raises(TLSConfigError, match="is encrypted"):
        TLSFiles(dev_pki.ca_cert, dev_pki.server_cert, encrypted).load()


# --- real handshakes -------------------------------------------------------------------


def _server_context(paths: DevPKIPaths, crl_file: Path | None = None) -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.verify_mode = ssl.CERT_REQUIRED
    context.load_cert_chain(paths.server_cert, paths.server_key)
    material = TLSFiles(paths.ca_cert, paths.server_cert, paths.server_key).load()
    context.load_verify_locations(cadata=material.ca_pem.decode())
    if crl_file is not None:
        context.load_verify_locations(cafile=crl_file)
        context.verify_flags |= ssl.VERIFY_CRL_CHECK_LEAF
    return context


def _client_context(ca_file: Path, client: tuple[Path, Path] | None) -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.load_verify_locations(cafile=ca_file)
    if client is not None:
        context.load_cert_chain(*client)
    return context


def _exchange(server: ssl.SSLContext, client: ssl.SSLContext) -> tuple[Exception | None, Exception | None]:
    """Handshake over a loopback socket pair and echo one byte; return (server error, client error)."""
    server_sock, client_sock = socket.socketpair()
    server_sock.settimeout(5)
    client_sock.settimeout(5)
    errors: dict[str, Exception] = {}

    def serve() -> None:
        try:
            with server.wrap_socket(server_sock, server_side=True) as tls:
                tls.sendall(tls.recv(1))
        except (ssl.SSLError, OSError) as exc:
            errors["server"] = exc

    thread = threading.Thread(target=serve)
    thread.start()
    try:
        with client.wrap_socket(client_sock, server_hostname="localhost") as tls:
            tls.sendall(b"x")
            if tls.recv(1) != b"x":
                errors["client"] = ConnectionError("no echo from the server")
    except (ssl.SSLError, OSError) as exc:
        errors["client"] = exc
    finally:
        thread.join(5)
        server_sock.close()
        client_sock.close()
    return errors.get("server"), errors.get("client")


def test_mutual_tls_handshake_succeeds_with_dev_certificates(dev_pki: DevPKIPaths) -> None:
    client = _client_context(dev_pki.ca_cert, (dev_pki.client_cert, dev_pki.client_key))
    assert _exchange(_server_context(dev_pki), client) == (None, None)


def test_mutual_tls_rejects_a_client_certificate_of_another_ca(dev_pki: DevPKIPaths, other_pki: DevPKIPaths) -> None:
    client = _client_context(dev_pki.ca_cert, (other_pki.client_cert, other_pki.client_key))
    server_error, client_error = _exchange(_server_context(dev_pki), client)
    assert isinstance(server_error, ssl.SSLCertVerificationError), server_error
    assert client_error is not None


def test_mutual_tls_rejects_a_client_without_certificate(dev_pki: DevPKIPaths) -> None:
    server_error, client_error = _exchange(_server_context(dev_pki), _client_context(dev_pki.ca_cert, None))
    assert isinstance(server_error, ssl.SSLError) and "certificate" in str(server_error).lower(), server_error
    assert client_error is not None


def test_mutual_tls_rejects_a_revoked_client_certificate(dev_pki: DevPKIPaths, tmp_path: Path) -> None:
    ca = CertificateAuthority.from_pem(dev_pki.ca_cert.read_bytes(), dev_pki.ca_key.read_bytes())
    revoked: Credential = issue_certificate(ca, "revoked", kind="client", hosts=["revoked"])
    (tmp_path / "revoked.pem").write_bytes(revoked.certificate_pem())
    (tmp_path / "revoked.key.pem").write_bytes(revoked.private_key_pem())
    crl_file = tmp_path / "crl.pem"
    crl_file.write_bytes(create_crl(ca, [revoked.serial_number]))
    server = _server_context(dev_pki, crl_file)

    trusted = _client_context(dev_pki.ca_cert, (dev_pki.client_cert, dev_pki.client_key))
    assert _exchange(server, trusted) == (None, None)
    server_error, _ = _exchange(
        server, _client_context(dev_pki.ca_cert, (tmp_path / "revoked.pem", tmp_path / "revoked.key.pem"))
    )
    assert isinstance(server_error, ssl.SSLCertVerificationError) and "revoked" in str(server_error), server_error
