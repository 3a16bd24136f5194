"""TLS hardening, end to end with real clients: expired and revoked client certificates, TLS
below 1.2, encrypted private keys, and certificate rotation on SIGHUP without a restart."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import ssl
import subprocess
import sys
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from conftest import ClientFiles, own_service
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from gateway_clients import MODEL, curl_with, open_stream, poll, slot_count
from test_gateway_tls import PLANE_PATHS, PLANES, assert_handshake_refused
from test_tritonclient_grpc import generate_text, make_client
from tritonclient.utils import InferenceServerException

from switchboard.cli import KEY_PASSWORD_ENV
from switchboard.process import GatewayProcess, ServerProcess
from switchboard.tls import (CertificateAuthority, Credential, DevPKIPaths, create_ca, create_crl,
                 issue_certificate, write_dev_pki)
from switchboard.tls.pki import DEV_HOSTS, GATEWAY_IDENTITY

PASSWORD = "correct-horse-battery-7f3a9c"
RELOADED, NOT_RELOADED = "TLS files reloaded", "TLS files not reloaded"
BROKEN_KEY = b"-----BEGIN PRIVATE KEY-----\nbroken\n-----END PRIVATE KEY-----\n"
TCP_ESTABLISHED = "01"  # the state column of /proc/net/tcp
STREAM_TOKENS = 80  # long enough to be in flight across the rotation
GENERATE = {"text_input": "The capital of France is",
            "parameters": {"max_new_tokens": 4, "do_sample": False}}


@contextlib.contextmanager
def service(tls_dir: Path, *args: str) -> Iterator[tuple[ServerProcess, GatewayProcess]]:
    """A server and a gateway in front of it, both given `args`; both must stop cleanly."""
    with own_service(tls_dir, *args) as (server, gateway):
        yield server, gateway
        assert gateway.stop() == 0, gateway.log_text()
        assert server.stop() == 0, server.log_text()


def load_ca(pki: DevPKIPaths) -> CertificateAuthority:
    return CertificateAuthority.from_pem(pki.ca_cert.read_bytes(), pki.ca_key.read_bytes())


def write_client_files(trusted_ca: Path, folder: Path, credential: Credential) -> ClientFiles:
    """A test client presenting `credential` (written under `folder`) and trusting the CA
    certificates of the file `trusted_ca`."""
    cert, key = folder / "client.pem", folder / "client.key.pem"
    cert.write_bytes(credential.certificate_pem())
    key.write_bytes(credential.private_key_pem())
    return ClientFiles(ca=trusted_ca, cert=cert, key=key)


def replace_file(path: Path, data: bytes) -> None:
    """Atomically, as a rotation tool would: readers see the old file or the new one."""
    temporary = path.with_name(f".{path.name}.new")
    temporary.write_bytes(data)
    os.replace(temporary, path)


def netloc(url: str) -> str:
    return urlsplit(url).netloc


def tls_client(files: ClientFiles, version: ssl.TLSVersion) -> ssl.SSLContext:
    """A client that offers exactly `version` (old ones need OpenSSL's security level 0)."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.load_verify_locations(files.ca)
    context.load_cert_chain(files.cert, files.key)
    context.minimum_version = context.maximum_version = version
    context.set_ciphers("DEFAULT:@SECLEVEL=0")
    context.set_alpn_protocols(["h2", "http/1.1"])  # gRPC wants h2
    return context


@contextlib.contextmanager
def handshake(address: str, context: ssl.SSLContext) -> Iterator[ssl.SSLSocket]:
    host, port = address.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10) as raw, \
            context.wrap_socket(raw, server_hostname=host) as tls:
        yield tls


def served_serial(address: str, files: ClientFiles) -> int:
    """The serial number of the certificate a new TLS connection to `address` is shown."""
    with handshake(address, tls_client(files, ssl.TLSVersion.TLSv1_3)) as tls:
        return x509.load_der_x509_certificate(tls.getpeercert(binary_form=True)).serial_number


def assert_gateway_generates(gateway: GatewayProcess, files: ClientFiles) -> None:
    reply = curl_with(files, f"{gateway.url('business')}/v2/models/{MODEL}/generate", body=GENERATE)
    assert (reply.exit_code, reply.status) == (0, 200), (reply.stderr, reply.body)
    assert reply.json()["text_output"]


def assert_grpc_generates(address: str, files: ClientFiles) -> None:
    with make_client(address, files) as triton:
        assert triton.is_server_live()
        assert generate_text(triton, "Hi", max_new_tokens=2)


def assert_grpc_handshake_refused(address: str, files: ClientFiles) -> None:
    """The gRPC server ends the TLS handshake of a client presenting `files`: UNAVAILABLE."""
    with make_client(address, files) as triton, \
            pytest.raises(InferenceServerException) as raised:
        triton.is_server_live()
    assert raised.value.status() == "StatusCode.UNAVAILABLE"


def wait_for_new_line(process: ServerProcess | GatewayProcess, text: str,
                      before: set[str]) -> str:
    """Wait for a log line saying `text` that is not among the lines `before`; returns it."""
    lines, _ = poll(lambda: [line for line in list(process.log)
                             if text in line and line not in before], bool, deadline_s=10)
    assert lines, f"no new {text!r} line:\n{process.log_text()}"
    return lines[0]


def reload_tls(process: ServerProcess | GatewayProcess, expected: str) -> str:
    """SIGHUP, then wait for a new log line saying `expected`; returns it."""
    before = set(process.log)
    process.process.send_signal(signal.SIGHUP)
    return wait_for_new_line(process, expected, before)


def reload_tls_everywhere(server: ServerProcess, gateway: GatewayProcess) -> None:
    """SIGHUP to the server first: the gateway's new upstream channel then meets the server's
    new files."""
    for process in (server, gateway):
        reload_tls(process, RELOADED)


# Expired and revoked client certificates


@pytest.fixture(scope="module")
def expired_files(pki, tmp_path_factory) -> ClientFiles:
    now = datetime.now(timezone.utc)
    expired = issue_certificate(load_ca(pki), "expired-client", kind="client",
                                hosts=["expired-client"], not_before=now - timedelta(days=2),
                                not_after=now - timedelta(days=1))
    return write_client_files(pki.ca_cert, tmp_path_factory.mktemp("expired"), expired)


@pytest.mark.parametrize("plane", PLANES)
def test_an_expired_client_certificate_fails_the_gateway_handshake(gateway, expired_files,
                                                                   plane) -> None:
    assert_handshake_refused(curl_with(expired_files, gateway.url(plane) + PLANE_PATHS[plane]))


def test_an_expired_client_certificate_is_refused_by_the_grpc_server(grpc_server,
                                                                     expired_files) -> None:
    assert_grpc_handshake_refused(grpc_server.address, expired_files)


@pytest.fixture(scope="module")
def revoked_files(pki, tmp_path_factory) -> ClientFiles:
    revoked = issue_certificate(load_ca(pki), "revoked-client", kind="client",
                                hosts=["revoked-client"])
    return write_client_files(pki.ca_cert, tmp_path_factory.mktemp("revoked"), revoked)


@pytest.fixture(scope="module")
def crl_service(pki, revoked_files, tmp_path_factory
                ) -> Iterator[tuple[ServerProcess, GatewayProcess]]:
    """A server and a gateway with a CRL that revokes `revoked_files` (not the gateway's own
    upstream certificate, the PKI's gateway.pem)."""
    serial = x509.load_pem_x509_certificate(revoked_files.cert.read_bytes()).serial_number
    crl = tmp_path_factory.mktemp("crl") / "crl.pem"
    crl.write_bytes(create_crl(load_ca(pki), [serial]))
    with service(pki.folder, "--tls-crl", str(crl)) as pair:
        yield pair


@pytest.mark.parametrize("plane", PLANES)
def test_a_revoked_client_certificate_fails_the_gateway_handshake(crl_service, revoked_files,
                                                                  plane) -> None:
    _, gateway = crl_service
    assert_handshake_refused(curl_with(revoked_files, gateway.url(plane) + PLANE_PATHS[plane]))


def test_a_server_refusing_the_gateways_own_certificate_is_503_for_clients(
        pki, client_files, tmp_path) -> None:
    """The server's CRL revokes the gateway's upstream certificate (the client's is fine, the
    gateway has no CRL): clients get 503, not the server's 401 about a certificate that is
    not theirs, and the gateway's log says what to replace."""
    serial = x509.load_pem_x509_certificate(pki.gateway_cert.read_bytes()).serial_number
    crl = tmp_path / "crl.pem"
    crl.write_bytes(create_crl(load_ca(pki), [serial]))
    with own_service(pki.folder, server_args=("--tls-crl", str(crl))) as (_, gateway):
        business = gateway.url("business")
        ready = curl_with(client_files, business + "/v2/health/ready")
        generate = curl_with(client_files, business + f"/v2/models/{MODEL}/generate",
                             body=GENERATE)
        log = gateway.log_text()
    assert (ready.status, generate.status) == (503, 503), (ready.body, generate.body)
    assert generate.json() == {"error": "the inference server is unavailable; retry later"}
    assert "the server refused the gateway's client certificate (UNAUTHENTICATED" in log


def test_a_revoked_client_certificate_is_unauthenticated_on_grpc(crl_service,
                                                                 revoked_files) -> None:
    server, _ = crl_service
    with make_client(server.address, revoked_files) as triton, \
            pytest.raises(InferenceServerException) as raised:
        triton.is_server_live()
    assert raised.value.status() == "StatusCode.UNAUTHENTICATED"
    assert "revoked" in raised.value.message()


def test_with_a_crl_a_valid_client_certificate_is_served(crl_service, client_files) -> None:
    server, gateway = crl_service
    ready = curl_with(client_files, gateway.url("business") + "/v2/health/ready")
    assert (ready.exit_code, ready.status) == (0, 200), ready.stderr
    assert_gateway_generates(gateway, client_files)
    assert_grpc_generates(server.address, client_files)


@pytest.fixture(scope="module")
def intermediate_pki(tmp_path_factory) -> tuple[DevPKIPaths, dict[str, ClientFiles]]:
    """A PKI of its own with two intermediate CAs, whose CRLs (crls.pem) revoke the first;
    clients {"revoked": a leaf under it, "valid": a leaf under the other}, each
    presenting its intermediate after its own certificate. The CA file holds the root and both
    intermediates (their CRLs are checked against them); the gateway's upstream certificate,
    issued by the root, is not revoked."""
    pki = write_dev_pki(tmp_path_factory.mktemp("intermediates"))
    root = load_ca(pki)
    revoked, valid = (create_ca(f"{name} intermediate CA", issuer=root)
                      for name in ("revoked", "valid"))
    pki.ca_cert.write_bytes(b"".join(ca.certificate_pem() for ca in (root, revoked, valid)))
    (pki.folder / "crls.pem").write_bytes(create_crl(root, [revoked.serial_number])
                                          + create_crl(revoked, []) + create_crl(valid, []))
    clients = {}
    for name, ca in (("revoked", revoked), ("valid", valid)):
        leaf = issue_certificate(ca, f"leaf-under-{name}", kind="client",
                                 hosts=[f"leaf-under-{name}"])
        files = write_client_files(pki.ca_cert, tmp_path_factory.mktemp(name), leaf)
        files.cert.write_bytes(leaf.certificate_pem() + ca.certificate_pem())
        clients[name] = files
    return pki, clients


def test_a_leaf_under_a_revoked_intermediate_is_refused_on_both_ports(intermediate_pki) -> None:
    pki, clients = intermediate_pki
    with service(pki.folder, "--tls-crl", str(pki.folder / "crls.pem")) as (server, gateway):
        with make_client(server.address, clients["revoked"]) as triton, \
                pytest.raises(InferenceServerException) as raised:
            triton.is_server_live()
        assert raised.value.status() == "StatusCode.UNAUTHENTICATED"
        assert "CN=revoked intermediate CA has been revoked" in raised.value.message()
        assert_handshake_refused(curl_with(clients["revoked"],
                                           gateway.url("business") + "/v2/health/ready"))
        assert_grpc_generates(server.address, clients["valid"])
        assert_gateway_generates(gateway, clients["valid"])


# TLS versions


@pytest.mark.filterwarnings("ignore:ssl.TLSVersion.TLSv1_1 is deprecated:DeprecationWarning")
@pytest.mark.parametrize("target", ["gateway", "grpc"])
def test_tls_below_1_2_is_refused_and_1_2_is_accepted(gateway, grpc_server, client_files,
                                                      target) -> None:
    assert ssl.HAS_TLSv1_1, "this OpenSSL cannot offer TLS 1.1: the refusal cannot be tested"
    address = netloc(gateway.url("business")) if target == "gateway" else grpc_server.address
    before = set(grpc_server.log)
    with pytest.raises(ssl.SSLError) as raised, \
            handshake(address, tls_client(client_files, ssl.TLSVersion.TLSv1_1)):
        pass
    # Proof that the client did offer TLS 1.1 (no local refusal): the gateway answers with a
    # protocol_version alert; gRPC hangs up and logs why.
    if target == "gateway":
        assert raised.value.reason == "TLSV1_ALERT_PROTOCOL_VERSION", raised.value
    else:
        wait_for_new_line(grpc_server, "UNSUPPORTED_PROTOCOL", before)
    with handshake(address, tls_client(client_files, ssl.TLSVersion.TLSv1_2)) as tls:
        assert tls.version() == "TLSv1.2"


# Encrypted private keys


@pytest.fixture(scope="module")
def encrypted_pki(tmp_path_factory) -> tuple[DevPKIPaths, ClientFiles]:
    """A PKI whose server, client and gateway keys are encrypted with PASSWORD, and client
    files with the client key in clear (for the test's own clients)."""
    folder = tmp_path_factory.mktemp("encrypted")
    pki = write_dev_pki(folder / "pki")
    plain_key = folder / "client.key.pem"
    plain_key.write_bytes(pki.client_key.read_bytes())
    for key_file in (pki.server_key, pki.client_key, pki.gateway_key):
        key = serialization.load_pem_private_key(key_file.read_bytes(), password=None)
        key_file.write_bytes(key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
            serialization.BestAvailableEncryption(PASSWORD.encode())))
    return pki, ClientFiles(ca=pki.ca_cert, cert=pki.client_cert, key=plain_key)


@pytest.fixture(scope="module")
def encrypted_service(encrypted_pki) -> Iterator[tuple[ServerProcess, GatewayProcess]]:
    """Started with the password in the environment (which they inherit)."""
    with contextlib.ExitStack() as stack:
        with pytest.MonkeyPatch.context() as patch:
            patch.setenv(KEY_PASSWORD_ENV, PASSWORD)
            pair = stack.enter_context(service(encrypted_pki[0].folder))
        yield pair


def test_encrypted_keys_with_the_password_in_the_environment(encrypted_pki,
                                                             encrypted_service) -> None:
    server, gateway = encrypted_service
    assert_gateway_generates(gateway, encrypted_pki[1])
    assert_grpc_generates(server.address, encrypted_pki[1])
    for process in encrypted_service:
        assert PASSWORD not in process.log_text()


def test_encrypted_keys_with_a_password_file(encrypted_pki, tmp_path, monkeypatch) -> None:
    monkeypatch.delenv(KEY_PASSWORD_ENV, raising=False)
    password_file = tmp_path / "key-password"
    password_file.write_text(PASSWORD + "\n")
    server = ServerProcess("--tls-dir", str(encrypted_pki[0].folder),
                           "--tls-key-password-file", str(password_file))
    try:
        server.wait_ready()
        assert_grpc_generates(server.address, encrypted_pki[1])
    finally:
        assert server.stop() == 0, server.log_text()
    assert PASSWORD not in server.log_text()


@pytest.mark.parametrize(("password", "says"), [
    (None, "is encrypted and no key password was given"),
    ("wrong-password-1b2c", "cannot be decrypted with the key password given"),
])
def test_an_encrypted_key_without_its_password_stops_the_server(encrypted_pki, password,
                                                                says) -> None:
    env = {name: value for name, value in os.environ.items() if name != KEY_PASSWORD_ENV}
    if password is not None:
        env[KEY_PASSWORD_ENV] = password
    ran = subprocess.run([sys.executable, "-m", "switchboard", "server", "--tls-dir",
                          str(encrypted_pki[0].folder), "--grpc-port", "0"],
                         env=env, capture_output=True, text=True, timeout=120)
    assert ran.returncode == 2, ran.stderr
    assert f"private key file {encrypted_pki[0].server_key} {says}" in ran.stderr
    assert password is None or password not in ran.stderr


# Certificate rotation

RunningService = tuple[DevPKIPaths, ServerProcess, GatewayProcess]
LONG_STREAM = {"text_input": "Write a long story about a dragon.",
               "parameters": {"max_new_tokens": STREAM_TOKENS, "ignore_eos": True,
                              "do_sample": False}}


def service_with_its_own_pki(tmp_path_factory: pytest.TempPathFactory,
                             name: str) -> Iterator[RunningService]:
    """A dev PKI in a new folder `name` and a server and gateway using it: a test may rewrite
    its files without disturbing the services of other tests."""
    pki = write_dev_pki(tmp_path_factory.mktemp(name))
    with service(pki.folder) as (server, gateway):
        yield pki, server, gateway


@pytest.fixture(scope="module")
def rotating(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningService]:
    yield from service_with_its_own_pki(tmp_path_factory, "rotating")


@pytest.fixture(scope="module")
def ca_rotating(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningService]:
    """Apart from `rotating`: a CA rotation retires the CA that its tests' clients trust."""
    yield from service_with_its_own_pki(tmp_path_factory, "ca-rotating")


def own_files(pki: DevPKIPaths) -> ClientFiles:
    return ClientFiles(ca=pki.ca_cert, cert=pki.client_cert, key=pki.client_key)


@contextlib.contextmanager
def stream_across(gateway: GatewayProcess, streaming: ClientFiles,
                  checking: ClientFiles) -> Iterator[None]:
    """A long stream through the gateway, opened by `streaming` and generating while the body
    runs (a rotation). Once the body is done the stream must still be in flight (as seen by
    `checking`, a client the gateway serves then), and then complete: all its tokens, ended by
    length."""
    with open_stream(gateway.url("business"), streaming, LONG_STREAM) as stream:
        events = stream.events()
        received = [next(events)]
        yield
        slots = slot_count(gateway, checking)
        assert slots["free_slots"] < slots["total_slots"], \
            "the stream was no longer in flight after the rotation"
        received += events
    assert len(received) == STREAM_TOKENS
    details = received[-1]["details"]
    assert (details["generated_tokens"], details["finish_reason"]) == (STREAM_TOKENS, "length")


def test_a_rotated_server_certificate_is_served_without_a_restart(rotating: RunningService) -> None:
    """New connections get the new certificate; the stream in flight completes."""
    pki, server, gateway = rotating
    files, business = own_files(pki), netloc(gateway.url("business"))
    old_serial = served_serial(business, files)
    with stream_across(gateway, files, files):
        new = issue_certificate(load_ca(pki), "rotated-server", kind="server", hosts=DEV_HOSTS)
        assert new.serial_number != old_serial
        replace_file(pki.server_key, new.private_key_pem())
        replace_file(pki.server_cert, new.certificate_pem())
        reload_tls_everywhere(server, gateway)
        assert served_serial(business, files) == new.serial_number
        assert served_serial(server.address, files) == new.serial_number
    assert_gateway_generates(gateway, files)
    assert_grpc_generates(server.address, files)


def test_a_broken_key_on_sighup_is_not_reloaded_and_the_current_one_stays(
        rotating: RunningService) -> None:
    pki, server, gateway = rotating
    files, business = own_files(pki), netloc(gateway.url("business"))
    serving = served_serial(business, files)
    good_key = pki.server_key.read_bytes()
    replace_file(pki.server_key, BROKEN_KEY)
    try:
        for process in (server, gateway):
            assert str(pki.server_key) in reload_tls(process, NOT_RELOADED)
        assert served_serial(business, files) == serving
        assert served_serial(server.address, files) == serving
        assert_gateway_generates(gateway, files)
        assert_grpc_generates(server.address, files)
    finally:
        replace_file(pki.server_key, good_key)


def client_files_issued_by(ca: CertificateAuthority, name: str, trusted_ca: Path) -> ClientFiles:
    """A client certificate for `name` issued by `ca`, in a new folder `name` beside
    `trusted_ca`, the CA file the client trusts."""
    folder = trusted_ca.parent / name
    folder.mkdir()
    credential = issue_certificate(ca, name, kind="client", hosts=[name])
    return write_client_files(trusted_ca, folder, credential)


def upstream_connections(gateway: GatewayProcess, server: ServerProcess) -> set[str]:
    """The socket inodes of the gateway's established TCP connections to the server (from
    /proc): a connection opened anew has a new inode."""
    proc = Path(f"/proc/{gateway.process.pid}")
    sockets: set[str] = set()
    for fd in (proc / "fd").iterdir():
        with contextlib.suppress(FileNotFoundError):  # closed since it was listed
            link = os.readlink(fd)
            if link.startswith("socket:["):
                sockets.add(link.removeprefix("socket:[").removesuffix("]"))
    server_port = int(server.address.rsplit(":", 1)[1])
    connections: set[str] = set()
    for table in ("tcp", "tcp6"):
        for row in (proc / "net" / table).read_text().splitlines()[1:]:
            # sl local_address rem_address st tx:rx tr:when retrnsmt uid timeout inode ...
            fields = row.split()
            remote, state, inode = fields[2], fields[3], fields[9]
            if inode in sockets and state == TCP_ESTABLISHED \
                    and int(remote.rsplit(":", 1)[1], 16) == server_port:
                connections.add(inode)
    return connections


def assert_served_on_both_hops(server: ServerProcess, gateway: GatewayProcess,
                               files: ClientFiles) -> None:
    """Every gateway plane answers a client presenting `files`, and both hops generate."""
    for plane in PLANES:
        reply = curl_with(files, gateway.url(plane) + PLANE_PATHS[plane])
        assert (reply.exit_code, reply.status) == (0, 200), (plane, reply.stderr)
    assert_gateway_generates(gateway, files)
    assert_grpc_generates(server.address, files)


def assert_refused_on_both_hops(server: ServerProcess, gateway: GatewayProcess,
                                files: ClientFiles) -> None:
    """Every gateway plane and the gRPC server end the handshake of a client presenting
    `files`."""
    for plane in PLANES:
        assert_handshake_refused(curl_with(files, gateway.url(plane) + PLANE_PATHS[plane]))
    assert_grpc_handshake_refused(server.address, files)


def test_a_ca_rotation_trusts_both_cas_then_only_the_new_one_without_a_restart(
        ca_rotating: RunningService, tmp_path: Path) -> None:
    """A CA rotation as an operator does it, with a SIGHUP after each step and no restart:
    the CA file becomes a bundle of the old and the new CA (clients of either are served),
    then the server and upstream client certificates are reissued by the new CA and the CA
    file holds the new CA only (clients of the old one are refused). Streams in flight across
    either step complete, and the gateway keeps reaching the server: it reloads its upstream
    certificate and the CA it verifies the server's new certificate with. Over a connection
    opened after the retirement, that is: the connection it had before still works, as
    established connections are not verified again.

    The test's clients trust both CAs, so that a refusal is the services' and not the
    client's own distrust of the server certificate."""
    pki, server, gateway = ca_rotating
    old_ca, new_ca = load_ca(pki), create_ca("Switchboard rotated CA")
    old_ca_pem, new_ca_pem = old_ca.certificate_pem(), new_ca.certificate_pem()
    trusting_both = tmp_path / "old-and-new-ca.pem"
    trusting_both.write_bytes(old_ca_pem + new_ca_pem)
    old_client = client_files_issued_by(old_ca, "old-ca-client", trusting_both)
    new_client = client_files_issued_by(new_ca, "new-ca-client", trusting_both)

    # Before: only the old CA is trusted.
    assert_served_on_both_hops(server, gateway, old_client)
    assert_refused_on_both_hops(server, gateway, new_client)

    # The new CA is added beside the old one.
    with stream_across(gateway, old_client, new_client):
        replace_file(pki.ca_cert, old_ca_pem + new_ca_pem)
        reload_tls_everywhere(server, gateway)
    assert_served_on_both_hops(server, gateway, new_client)
    assert_served_on_both_hops(server, gateway, old_client)

    # The old CA is retired: certificates reissued by the new CA, which alone is trusted.
    new_server = issue_certificate(new_ca, "rotated-ca-server", kind="server", hosts=DEV_HOSTS)
    new_upstream_client = issue_certificate(new_ca, GATEWAY_IDENTITY, kind="client",
                                            hosts=[GATEWAY_IDENTITY])
    opened_before_the_retirement = upstream_connections(gateway, server)
    with stream_across(gateway, old_client, new_client):
        for credential, cert_file, key_file in (
                (new_server, pki.server_cert, pki.server_key),
                (new_upstream_client, pki.gateway_cert, pki.gateway_key)):
            replace_file(key_file, credential.private_key_pem())
            replace_file(cert_file, credential.certificate_pem())
        replace_file(pki.ca_cert, new_ca_pem)
        reload_tls_everywhere(server, gateway)
    for address in (netloc(gateway.url("business")), server.address):
        assert served_serial(address, new_client) == new_server.serial_number
    assert_refused_on_both_hops(server, gateway, old_client)
    assert_served_on_both_hops(server, gateway, new_client)
    assert upstream_connections(gateway, server) - opened_before_the_retirement, \
        "the gateway reached the server only over connections opened before the CA retirement"
