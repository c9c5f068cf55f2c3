"""RPC plumbing shared by every Arrow Flight service (tablet servers, master, driver session).

:mod:`pyspark_kudu.rpc.auth` holds the one authentication scheme: a mutual HMAC-SHA256
challenge-response handshake, then a fresh, single-use MAC token on every call.
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
