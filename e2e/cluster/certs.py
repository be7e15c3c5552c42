"""Certificates for the local control plane, made on the spot.

One throwaway CA signs the API server's serving certificate and an admin
client certificate in `system:masters`; a separate key signs service-account
tokens. EC P-256 keeps generation instant.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

SERVICE_IP = "10.96.0.1"
SERVICE_CIDR = "10.96.0.0/16"


@dataclass(frozen=True, slots=True)
class CertPaths:
    ca_cert: Path
    ca_key: Path
    server_cert: Path
    server_key: Path
    admin_cert: Path
    admin_key: Path
    sa_key: Path
    sa_pub: Path


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _name(cn: str, org: str | None = None) -> x509.Name:
    attrs = [x509.NameAttribute(NameOID.COMMON_NAME, cn)]
    if org:
        attrs.append(x509.NameAttribute(NameOID.ORGANIZATION_NAME, org))
    return x509.Name(attrs)


def _sign(
    subject: x509.Name,
    key: ec.EllipticCurvePrivateKey,
    issuer: x509.Name,
    issuer_key: ec.EllipticCurvePrivateKey,
    extensions: list[tuple[x509.ExtensionType, bool]],
) -> x509.Certificate:
    now = dt.datetime.now(dt.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=30))
    )
    for ext, critical in extensions:
        builder = builder.add_extension(ext, critical=critical)
    return builder.sign(issuer_key, hashes.SHA256())


def _write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    path.chmod(0o600)
    return path


def client_cert(
    paths: CertPaths, directory: Path, name: str, user: str, group: str
) -> tuple[Path, Path]:
    """A client certificate for `user` in `group`, signed by the cluster CA: how a kubelet
    proves it is `system:node:<name>`. Returns the certificate and key paths."""
    ca = x509.load_pem_x509_certificate(paths.ca_cert.read_bytes())
    ca_key = serialization.load_pem_private_key(paths.ca_key.read_bytes(), None)
    key = _key()
    cert = _sign(
        _name(user, group),
        key,
        ca.subject,
        ca_key,
        [(x509.ExtendedKeyUsage([x509.ExtendedKeyUsageOID.CLIENT_AUTH]), False)],
    )
    directory.mkdir(parents=True, exist_ok=True)
    pem = serialization.Encoding.PEM
    return (
        _write(directory / f"{name}.crt", cert.public_bytes(pem)),
        _write(directory / f"{name}.key", _pem_key(key)),
    )


def generate(directory: Path) -> CertPaths:
    """Writes a fresh CA, serving, admin and service-account key pair."""
    directory.mkdir(parents=True, exist_ok=True)
    pem = serialization.Encoding.PEM
    ca_key, server_key, admin_key, sa_key = _key(), _key(), _key(), _key()
    ca_name = _name("infergrid-local-ca")
    ca = _sign(ca_name, ca_key, ca_name, ca_key, [(x509.BasicConstraints(True, None), True)])
    sans = x509.SubjectAlternativeName(
        [x509.IPAddress(ipaddress.ip_address(ip)) for ip in ("127.0.0.1", SERVICE_IP)]
        + [
            x509.DNSName(n)
            for n in ("localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc")
        ]
    )
    server = _sign(
        _name("kube-apiserver"),
        server_key,
        ca_name,
        ca_key,
        [(sans, False), (x509.ExtendedKeyUsage([x509.ExtendedKeyUsageOID.SERVER_AUTH]), False)],
    )
    admin = _sign(
        _name("infergrid-admin", "system:masters"),
        admin_key,
        ca_name,
        ca_key,
        [(x509.ExtendedKeyUsage([x509.ExtendedKeyUsageOID.CLIENT_AUTH]), False)],
    )
    sa_pub = sa_key.public_key().public_bytes(pem, serialization.PublicFormat.SubjectPublicKeyInfo)
    return CertPaths(
        ca_cert=_write(directory / "ca.crt", ca.public_bytes(pem)),
        ca_key=_write(directory / "ca.key", _pem_key(ca_key)),
        server_cert=_write(directory / "apiserver.crt", server.public_bytes(pem)),
        server_key=_write(directory / "apiserver.key", _pem_key(server_key)),
        admin_cert=_write(directory / "admin.crt", admin.public_bytes(pem)),
        admin_key=_write(directory / "admin.key", _pem_key(admin_key)),
        sa_key=_write(directory / "sa.key", _pem_key(sa_key)),
        sa_pub=_write(directory / "sa.pub", sa_pub),
    )
