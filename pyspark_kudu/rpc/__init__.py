"""RPC plumbing for the project's Arrow Flight services.

:mod:`pyspark_kudu.rpc.auth` holds the authentication scheme: a mutual HMAC-SHA256
challenge-response handshake, then a fresh, single-use MAC token on every call. All three
Flight services use it: the resident tablet servers and the driver's session service (over
the application's ``PYSPARK_KUDU_SECRET``) and the masters (over their shared token).
:mod:`pyspark_kudu.rpc.tls` is the optional TLS layer under it (``PYSPARK_KUDU_TLS_CERT``,
``PYSPARK_KUDU_TLS_KEY``, ``PYSPARK_KUDU_TLS_CA``).
"""

from __future__ import annotations

from pyspark_kudu.rpc.auth import (
    SECRET_ENV,
    HmacClientAuthHandler,
    HmacServerAuthHandler,
    check_listen,
    connect,
    is_loopback,
    new_secret,
    secret_from_env,
)

__all__ = [
    "SECRET_ENV",
    "HmacClientAuthHandler",
    "HmacServerAuthHandler",
    "check_listen",
    "connect",
    "is_loopback",
    "new_secret",
    "secret_from_env",
]
