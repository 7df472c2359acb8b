"""TLS material for an etcd cluster and its clients: one CA, a certificate per member, one per client user.

The members run with ``--client-cert-auth``: a client without a certificate signed by the CA cannot even
connect. Which keys a client may touch is decided by the etcd user it logs in as (:mod:`.members`). The
private keys are written 0600.

    ca = CertificateAuthority.create(directory)             # ca.crt / ca.key
    ca.issue("member0", directory, hosts=["127.0.0.1"])      # member0.crt / member0.key (server and peer)
    ca.issue("client", directory)                            # a client certificate

The clusters' deployment gets its material from the stack (see docs/failover.md); this module makes it for
the local launcher, the chaos harness, the Slurm lab and the tests.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
from dataclasses import dataclass

#: Member and client certificates: a year (the clusters renew them from the same CA before they expire).
VALID_DAYS = 365
#: A cluster's CA: ten years, so that renewing member and client certificates never needs a new trust root within
#: a cluster's life (a CA rollover would need a trust bundle of the old and the new CA on every member and client).
CA_VALID_DAYS = 3650


@dataclass(frozen=True)
class CertPaths:
    """Where one identity's certificate and key are."""

    cert: str
    key: str


def _write_private(path: str, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)


def _new_key():
    from cryptography.hazmat.primitives.asymmetric import ec

    return ec.generate_private_key(ec.SECP256R1())


def _pem_key(key) -> bytes:
    from cryptography.hazmat.primitives import serialization

    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


@dataclass(frozen=True)
class CertificateAuthority:
    """A self-signed CA whose key signs member and client certificates."""

    paths: CertPaths

    @classmethod
    def create(
        cls, directory: str, name: str = "t5-failover etcd CA", valid_days: int = CA_VALID_DAYS
    ) -> "CertificateAuthority":
        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.x509.oid import NameOID

        os.makedirs(directory, mode=0o700, exist_ok=True)
        key = _new_key()
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
        now = datetime.datetime.now(datetime.timezone.utc)
        cert = (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=valid_days))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    key_cert_sign=True,
                    crl_sign=True,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .sign(key, hashes.SHA256())
        )
        paths = CertPaths(os.path.join(directory, "ca.crt"), os.path.join(directory, "ca.key"))
        with open(paths.cert, "wb") as f:
            f.write(cert.public_bytes(serialization.Encoding.PEM))
        _write_private(paths.key, _pem_key(key))
        return cls(paths)

    def issue(
        self, common_name: str, directory: str, hosts: list[str] | tuple[str, ...] = (), valid_days: int = VALID_DAYS
    ) -> CertPaths:
        """A certificate for ``common_name`` signed by this CA, usable as TLS client and, with ``hosts`` (IP
        addresses or DNS names), as server; written as ``<common_name>.crt`` / ``.key`` in ``directory``."""
        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.x509.oid import ExtendedKeyUsageOID

        with open(self.paths.cert, "rb") as f:
            ca_cert = x509.load_pem_x509_certificate(f.read())
        with open(self.paths.key, "rb") as f:
            ca_key = serialization.load_pem_private_key(f.read(), password=None)
        key = _new_key()
        now = datetime.datetime.now(datetime.timezone.utc)
        usages = [ExtendedKeyUsageOID.CLIENT_AUTH] + ([ExtendedKeyUsageOID.SERVER_AUTH] if hosts else [])
        builder = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([_subject(common_name, server=bool(hosts))]))
            .issuer_name(ca_cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=valid_days))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
        )
        if hosts:
            builder = builder.add_extension(x509.SubjectAlternativeName([_san(h) for h in hosts]), critical=False)
        cert = builder.sign(ca_key, hashes.SHA256())
        paths = CertPaths(os.path.join(directory, f"{common_name}.crt"), os.path.join(directory, f"{common_name}.key"))
        with open(paths.cert, "wb") as f:
            f.write(cert.public_bytes(serialization.Encoding.PEM))
        _write_private(paths.key, _pem_key(key))
        return paths


def _subject(name: str, server: bool):
    """A member's certificate names it as its common name. A client's carries its name as the organization and
    no common name: etcd refuses gateway (JSON) requests whose certificate has a common name once auth is on,
    as it cannot use it there; clients log in as an etcd user instead (:mod:`.client`)."""
    from cryptography import x509
    from cryptography.x509.oid import NameOID

    return x509.NameAttribute(NameOID.COMMON_NAME if server else NameOID.ORGANIZATION_NAME, name)


def _san(host: str):
    from cryptography import x509

    try:
        return x509.IPAddress(ipaddress.ip_address(host))
    except ValueError:
        return x509.DNSName(host)


def jwt_key_pair(directory: str) -> tuple[str, str]:
    """An ES256 key pair that signs the members' auth tokens (``--auth-token jwt,...``): any member then accepts
    a token another issued. Returns the public and the private key's PEM paths (the private one 0600)."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    key = ec.generate_private_key(ec.SECP256R1())
    public, private = os.path.join(directory, "jwt.pub"), os.path.join(directory, "jwt.key")
    with open(public, "wb") as f:
        f.write(
            key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
        )
    _write_private(private, _pem_key(key))
    return public, private
