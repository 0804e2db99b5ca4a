"""The env server's shared token: where it comes from, what a valid one is, which addresses need one.

A server that listens beyond the loopback interface refuses every request but ``GET /health``
without the header ``Authorization: Bearer <token>`` (the scheme in any case, RFC 7235); it will not
even start on such an address without a token unless told to (``allow_no_token``). The token reaches
a server and its clients through a file (``--token-file``, ``env.server_token_file``) or the
environment variable ``AGENTRL_ENV_TOKEN``, never through a command line, which other users of the
machine can read.

* A token file must be private, as ssh requires of its keys: one that group or others may read or
  write is refused with the ``chmod 600`` that fixes it. Make one with ``MAKE_TOKEN`` (a private umask,
  so it is never readable by others, not even for a moment).
* A token read from a file is kept in this process (:func:`load_token_file`, :func:`default_token`),
  not exported: child processes (vLLM's, agent processes, an environment's own) do not inherit it.
  The shard processes of a server get it through a pipe.
* A client about to send it over plain HTTP to another machine warns once per server
  (:func:`warn_plain_http`): anyone on the path can read it; use TLS or a TLS-terminating proxy.
"""

from __future__ import annotations

import hmac
import ipaddress
import logging
import os
import socket
import stat
import threading
from pathlib import Path

TOKEN_ENV = "AGENTRL_ENV_TOKEN"
MIN_TOKEN_LENGTH = 16
MAKE_TOKEN = "(umask 077; python -c 'import secrets; print(secrets.token_urlsafe(32))' > FILE)"

LOG = logging.getLogger("agentrl.envs.server")
_PROCESS_TOKEN: str | None = None           # the token of env.server_token_file, read in this process
_WARNED: set[tuple[str, int]] = set()
_WARNED_LOCK = threading.Lock()


def check_token(token: str, where: str) -> str:
    """``token`` if it can travel in an HTTP header and is not trivially guessed, else ValueError."""
    if len(token) < MIN_TOKEN_LENGTH:
        raise ValueError(f"the token from {where} has {len(token)} characters; use at least {MIN_TOKEN_LENGTH} "
                         f"(make one with: {MAKE_TOKEN})")
    if not all(33 <= ord(c) <= 126 for c in token):
        raise ValueError(f"the token from {where} has spaces, control or non-ASCII characters; use printable "
                         f"ASCII only (make one with: {MAKE_TOKEN})")
    return token


def read_token_file(path: str | os.PathLike) -> str:
    """The token held in file ``path`` (surrounding whitespace and the final newline dropped); a file
    that group or others may read or write is refused (POSIX), as ssh refuses such keys."""
    try:
        with open(path, "rb") as f:
            mode = os.fstat(f.fileno()).st_mode
            text = f.read().decode("utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise ValueError(f"cannot read the token file {path}: {err}") from None
    if os.name == "posix" and mode & 0o077:
        raise ValueError(f"the token file {path} is open to other users (mode {stat.S_IMODE(mode):04o}): anyone "
                         f"who can read it can drive the environments; run: chmod 600 {path}")
    return check_token(text.strip(), f"the file {path}")


def load_token_file(path: str | os.PathLike | None) -> None:
    """Read the token of file ``path`` (``env.server_token_file``) into this process, where every HTTP
    transport it opens takes it from (:func:`default_token`); it is not exported to child processes.
    Nothing when ``path`` is None."""
    global _PROCESS_TOKEN
    if path:
        _PROCESS_TOKEN = read_token_file(path)


def token_from_env() -> str | None:
    """``$AGENTRL_ENV_TOKEN`` checked, or None when it is unset or empty."""
    token = os.environ.get(TOKEN_ENV, "").strip()
    return check_token(token, f"${TOKEN_ENV}") if token else None


def default_token() -> str | None:
    """The token a client sends when given none: the one :func:`load_token_file` read, else
    ``$AGENTRL_ENV_TOKEN``, else None."""
    return _PROCESS_TOKEN if _PROCESS_TOKEN is not None else token_from_env()


def warn_plain_http(host: str, port: int) -> None:
    """Warn (once per server and process) before a token goes over plain HTTP to another machine."""
    if is_loopback(host):
        return
    with _WARNED_LOCK:
        if (host, port) in _WARNED:
            return
        _WARNED.add((host, port))
    LOG.warning("sending the env server token over plain http to %s:%d: anyone on the network path can read "
                "it; serve with --ssl-certfile/--ssl-keyfile and use https://, or put a TLS-terminating proxy in "
                "front (docs/env-servers.md, 'Authentication and TLS')", host, port)


def is_loopback(host: str) -> bool:
    """Whether ``host`` (an address or a name) reaches only this machine."""
    if host in ("", "0.0.0.0", "::"):
        return False
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        pass
    try:
        addresses = {info[4][0] for info in socket.getaddrinfo(host, None)}
    except OSError:
        return False
    return bool(addresses) and all(ipaddress.ip_address(a.split("%")[0]).is_loopback for a in addresses)


def refuse_open_bind(host: str, token: str | None, allow_no_token: bool) -> None:
    """ValueError when ``host`` is reachable from other machines and no token protects it."""
    if token is None and not allow_no_token and not is_loopback(host):
        raise ValueError(f"refusing to serve on {host or 'every interface'} without a token: anyone who can reach "
                         f"the port could drive the environments; set {TOKEN_ENV} or --token-file (clients send "
                         f"the same token), or pass --allow-no-token on a network you trust")


class TokenCheck:
    """Compares the ``Authorization`` header of a request with ``Bearer <token>`` in constant time (the
    scheme in any case, as RFC 7235 has it)."""

    def __init__(self, token: str):
        self._expected = token.encode("ascii")

    def problem(self, headers: list[tuple[bytes, bytes]]) -> str | None:
        """None when the request carries the token, else what is wrong with it (one line)."""
        for name, value in headers:
            if name == b"authorization":
                scheme, _, credentials = value.strip().partition(b" ")
                if scheme.lower() == b"bearer" and hmac.compare_digest(credentials.strip(), self._expected):
                    return None
                return (f"wrong token in the Authorization header; send 'Authorization: Bearer <token>' with the "
                        f"server's token (EnvClient: ${TOKEN_ENV} or token=)")
        return (f"this server requires a token: send 'Authorization: Bearer <token>' (EnvClient: set ${TOKEN_ENV} "
                f"or pass token=; training: env.server_token_file)")
