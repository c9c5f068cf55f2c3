"""Optional TLS for the project's three Arrow Flight services (masters, the driver's session
service, the resident tablet servers), layered under :mod:`pyspark_kudu.rpc.auth`.

**Configuration** (documented in ``docs/operations.md``, section 12, TLS): three PEM files.

=========================  ==================================================================
``PYSPARK_KUDU_TLS_CERT``  this process's server certificate (its chain may follow it)
``PYSPARK_KUDU_TLS_KEY``   that certificate's private key, unencrypted
``PYSPARK_KUDU_TLS_CA``    the CA certificate(s) every client verifies servers against
=========================  ==================================================================

The environment is how executors (``spark.executorEnv.*``), drivers and tools get them; a
standalone master also takes ``--tls-cert/--tls-key/--tls-ca`` (each overrides its
variable). Valid combinations: none (TLS off: ``grpc+tcp`` exactly as without this module),
the CA alone (a process that only connects, e.g. the CLI), or all three (a process that
serves and connects). Anything else -- a certificate without its key (or the reverse), a
certificate and key without a CA, a missing or unreadable file, a file that is not PEM, a
key that does not match its certificate, an encrypted key -- is an ``InvalidArgumentError``
naming the setting, raised before any server starts.

**What TLS adds, and what it does not replace**: with TLS every connection is encrypted and
integrity-protected, and the client checks that the server's certificate is signed by the
CA and names the address it dialled (subjectAltName), so an active man-in-the-middle can
neither read nor alter calls. Authentication stays the HMAC challenge-response of
:mod:`~pyspark_kudu.rpc.auth` (``PYSPARK_KUDU_SECRET`` / the masters' token), which still
runs inside the TLS connection: there are no client certificates.

**Mismatches** fail fast, within the caller's existing timeouts: a TLS client facing a
plain server, or a server whose certificate the CA did not sign (or that does not name the
address dialled), gets a ``TlsHandshakeError``, a ``CredentialError`` (:func:`tls_failure`);
a plain client facing a TLS server gets the usual ``NetworkError`` with a hint to set
``PYSPARK_KUDU_TLS_CA`` (:func:`plain_hint`).

Thread-safety: everything here is thread-safe (a small cache of loaded files, guarded by
``functools.lru_cache``'s own lock; :class:`TlsConfig` is immutable).
"""

from __future__ import annotations

import enum
import functools
import logging
import os
import ssl
import stat
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, TypeAlias

from pyspark_kudu.errors import InvalidArgumentError, TlsHandshakeError

__all__ = [
    "CA_ENV",
    "CERT_ENV",
    "ENV_NAMES",
    "FLAG_NAMES",
    "FROM_ENV",
    "KEY_ENV",
    "FromEnv",
    "TlsConfig",
    "TlsHandshakeError",
    "TlsNames",
    "TlsSetting",
    "client_kwargs",
    "load_tls",
    "location",
    "plain_hint",
    "resolve_tls",
    "server_kwargs",
    "tls_failure",
    "tls_from_env",
]

_log = logging.getLogger(__name__)

CERT_ENV = "PYSPARK_KUDU_TLS_CERT"
KEY_ENV = "PYSPARK_KUDU_TLS_KEY"
CA_ENV = "PYSPARK_KUDU_TLS_CA"
_CERT_MARK = b"-----BEGIN CERTIFICATE-----"
_TLS_FAILURES = ("Ssl handshake", "SSL_ERROR", "TSI_", "certificate verify failed",
                 "not in peer certificate", "wrong version number")
_HANGUPS = ("Socket closed", "Connection reset", "Broken pipe", "End of TCP stream")


@dataclass(frozen=True)
class TlsNames:
    """How the three settings are called in error messages."""

    cert: str
    key: str
    ca: str


ENV_NAMES = TlsNames(CERT_ENV, KEY_ENV, CA_ENV)
FLAG_NAMES = TlsNames(f"--tls-cert ({CERT_ENV})", f"--tls-key ({KEY_ENV})",
                      f"--tls-ca ({CA_ENV})")


class FromEnv(enum.Enum):
    """Type of :data:`FROM_ENV`: "read the TLS settings from the environment"."""

    FROM_ENV = "from-env"


FROM_ENV = FromEnv.FROM_ENV


@dataclass(frozen=True)
class TlsConfig:
    """A checked TLS configuration: the files' paths and their PEM contents.

    Build it with :func:`load_tls` or :func:`tls_from_env` (which check it), not directly.
    ``cert``/``key`` are None for a client-only configuration (:attr:`can_serve` False).
    """

    ca: str
    cert: str | None = None
    key: str | None = None
    ca_pem: bytes = field(default=b"", repr=False)
    cert_pem: bytes = field(default=b"", repr=False)
    key_pem: bytes = field(default=b"", repr=False)
    names: TlsNames = field(default=ENV_NAMES, repr=False, compare=False)

    @property
    def can_serve(self) -> bool:
        return bool(self.cert_pem and self.key_pem)


#: A component's TLS parameter: a configuration, None (no TLS) or :data:`FROM_ENV`.
TlsSetting: TypeAlias = "TlsConfig | Literal[FromEnv.FROM_ENV] | None"


def _read(path: str, name: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as e:
        raise InvalidArgumentError(f"{name}={path}: cannot read it ({e.strerror or e}); "
                                   f"point it at a PEM file this user can read") from e


def _check_key(path: str, pem: bytes, name: str) -> None:
    if b"ENCRYPTED" in pem:
        raise InvalidArgumentError(
            f"{name}={path} is an encrypted private key; the Flight server needs it "
            f"unencrypted (e.g. `openssl pkey -in {path} -out key.pem`, then chmod 600)")
    if b"PRIVATE KEY-----" not in pem:
        raise InvalidArgumentError(f"{name}={path} holds no PEM private key "
                                   f"('-----BEGIN ... PRIVATE KEY-----')")
    try:
        mode = stat.S_IMODE(os.stat(path).st_mode)
    except OSError:
        return
    if mode & 0o077:
        _log.warning("%s=%s has mode %04o: other users may read the private key; "
                     "chmod 600 %s", name, path, mode, path)


def _no_password() -> bytes:
    raise InvalidArgumentError("encrypted private keys are not supported")


def _load(cert: str | None, key: str | None, ca: str, names: TlsNames) -> TlsConfig:
    ca_pem = _read(ca, names.ca)
    if _CERT_MARK not in ca_pem:
        raise InvalidArgumentError(f"{names.ca}={ca} holds no PEM certificate "
                                   f"('{_CERT_MARK.decode()}')")
    try:
        ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT).load_verify_locations(
            cadata=ca_pem.decode("ascii", "replace"))
    except ssl.SSLError as e:
        raise InvalidArgumentError(f"{names.ca}={ca} is not a valid PEM CA certificate: "
                                   f"{e}") from e
    if cert is None or key is None:
        return TlsConfig(ca, ca_pem=ca_pem, names=names)
    cert_pem, key_pem = _read(cert, names.cert), _read(key, names.key)
    if _CERT_MARK not in cert_pem:
        raise InvalidArgumentError(f"{names.cert}={cert} holds no PEM certificate "
                                   f"('{_CERT_MARK.decode()}')")
    _check_key(key, key_pem, names.key)
    try:
        ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER).load_cert_chain(cert, key,
                                                                password=_no_password)
    except ssl.SSLError as e:
        raise InvalidArgumentError(
            f"{names.cert}={cert} and {names.key}={key} do not make a usable certificate "
            f"and key pair (unreadable PEM, or the key is not the certificate's): {e}") from e
    return TlsConfig(ca, cert, key, ca_pem, cert_pem, key_pem, names)


def _stamp(path: str | None) -> tuple[int, int] | None:
    if path is None:
        return None
    st = os.stat(path)
    return st.st_mtime_ns, st.st_size


@functools.lru_cache(maxsize=16)
def _load_cached(cert: str | None, key: str | None, ca: str, names: TlsNames,
                 stamps: tuple[tuple[int, int] | None, ...]) -> TlsConfig:
    return _load(cert, key, ca, names)


def load_tls(cert: str | None, key: str | None, ca: str | None, *,
             names: TlsNames = ENV_NAMES) -> TlsConfig | None:
    """The checked configuration of these three paths; None if all three are empty.

    Files are read and checked once per change of their size or modification time.

    Raises:
        InvalidArgumentError: a bad combination, file or PEM content; the message names
            the setting (from ``names``) and the path.
    """
    cert, key, ca = cert or None, key or None, ca or None
    if cert is None and key is None and ca is None:
        return None
    if (cert is None) != (key is None):
        have, missing = (names.cert, names.key) if key is None else (names.key, names.cert)
        raise InvalidArgumentError(f"{have} is set but {missing} is not: a TLS server needs "
                                   f"both its certificate and its private key")
    if ca is None:
        raise InvalidArgumentError(
            f"{names.cert} and {names.key} are set but {names.ca} is not: every process "
            f"also connects to others and verifies their certificates against that CA")
    try:
        stamps = (_stamp(cert), _stamp(key), _stamp(ca))
    except OSError:
        return _load(cert, key, ca, names)  # not cached: raises naming the missing file
    return _load_cached(cert, key, ca, names, stamps)


def tls_from_env(env: Mapping[str, str] = os.environ) -> TlsConfig | None:
    """The configuration in ``PYSPARK_KUDU_TLS_CERT/_KEY/_CA``; None if none is set.

    Raises:
        InvalidArgumentError: see :func:`load_tls`.
    """
    return load_tls(env.get(CERT_ENV), env.get(KEY_ENV), env.get(CA_ENV))


def resolve_tls(setting: TlsSetting, env: Mapping[str, str] = os.environ) -> TlsConfig | None:
    """``setting`` itself, or the environment's configuration for :data:`FROM_ENV`."""
    if setting is FROM_ENV:
        return tls_from_env(env)
    return setting


def location(address: str, tls: TlsConfig | None) -> str:
    """The Flight location of ``host:port``: ``grpc+tls://`` with TLS, else ``grpc+tcp://``."""
    return f"{'grpc+tls' if tls is not None else 'grpc+tcp'}://{address}"


def server_kwargs(tls: TlsConfig | None, what: str) -> dict[str, Any]:
    """``FlightServerBase`` keyword arguments serving ``tls`` (none without TLS).

    Raises:
        InvalidArgumentError: ``tls`` has no certificate and key (a client-only
            configuration) for the server ``what``.
    """
    if tls is None:
        return {}
    if not tls.can_serve:
        raise InvalidArgumentError(
            f"{tls.names.ca} is set, so clients expect TLS, but {tls.names.cert} and "
            f"{tls.names.key} are not: {what} cannot serve TLS; set them too (or unset "
            f"{tls.names.ca} on every host to run without TLS)")
    import pyarrow.flight as fl

    return {"tls_certificates": [fl.CertKeyPair(tls.cert_pem, tls.key_pem)]}


def client_kwargs(root_certs: bytes | None) -> dict[str, Any]:
    """``FlightClient`` keyword arguments verifying servers against ``root_certs`` (PEM)."""
    return {"tls_root_certs": root_certs} if root_certs else {}


def tls_failure(target: str, message: str, ca_name: str = CA_ENV) -> TlsHandshakeError | None:
    """A clear error for a failed TLS handshake of a client dialling ``target`` (a
    ``grpc+tls://`` location), or None if ``message`` (gRPC's) is not about TLS."""
    if not target.startswith("grpc+tls://") or not any(m in message for m in _TLS_FAILURES):
        return None
    where = target.removeprefix("grpc+tls://")
    if "wrong version number" in message:
        why = (f"{where} does not speak TLS (a server without {CERT_ENV}/{KEY_ENV}?); give "
               f"every server its certificate, or unset {ca_name} everywhere")
    elif "not in peer certificate" in message:
        why = (f"the certificate of {where} does not name that address; reissue it with "
               f"the host names and IPs clients use in its subjectAltName")
    elif "certificate verify failed" in message:
        why = (f"the certificate of {where} is not signed by the CA in {ca_name} (or has "
               f"expired)")
    else:
        why = f"TLS handshake with {where} failed"
    return TlsHandshakeError(f"TLS: {why} ({message.strip().splitlines()[0][-300:]})")


def plain_hint(target: str, message: str) -> str:
    """A hint to append to a plain (``grpc+tcp``) client's connection failure: the server
    may serve TLS (a TLS server hangs up on a plain client: gRPC says "Socket closed")."""
    if target.startswith("grpc+tcp://") and any(m in message for m in _HANGUPS):
        return (f"; if that server uses TLS, set {CA_ENV} to the CA certificate that "
                f"signed its certificate")
    return ""
