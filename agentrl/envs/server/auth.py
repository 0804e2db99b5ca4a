"""The env server's shared token: where it comes from, what a valid one is, which addresses need one.

A server that listens beyond the loopback interface refuses every request but ``GET /health``
without the header ``Authorization: Bearer <token>``; it will not even start on such an address
without a token unless told to (``allow_no_token``). The token reaches a server and its clients
through the environment variable ``AGENTRL_ENV_TOKEN`` or a file (``--token-file``,
``env.server_token_file``), never through a command line, which other users of the machine can
read. The shard processes of a server get it through their environment.
"""

from __future__ import annotations

import hmac
import ipaddress
import os
import socket
from pathlib import Path

TOKEN_ENV = "AGENTRL_ENV_TOKEN"
MIN_TOKEN_LENGTH = 16
MAKE_TOKEN = "python -c 'import secrets; print(secrets.token_urlsafe(32))'"


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
    """The token held in file ``path`` (surrounding whitespace and the final newline dropped)."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise ValueError(f"cannot read the token file {path}: {err}") from None
    return check_token(text.strip(), f"the file {path}")


def export_token_file(path: str | os.PathLike | None) -> None:
    """Put the token of file ``path`` (``env.server_token_file``) in ``$AGENTRL_ENV_TOKEN`` of this
    process, where every HTTP transport it opens takes it from; nothing when ``path`` is None."""
    if path:
        os.environ[TOKEN_ENV] = read_token_file(path)


def token_from_env() -> str | None:
    """``$AGENTRL_ENV_TOKEN`` checked, or None when it is unset or empty."""
    token = os.environ.get(TOKEN_ENV, "").strip()
    return check_token(token, f"${TOKEN_ENV}") if token else None


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
    """Compares the ``Authorization`` header of a request with ``Bearer <token>`` in constant time."""

    def __init__(self, token: str):
        self._expected = b"Bearer " + token.encode("ascii")

    def problem(self, headers: list[tuple[bytes, bytes]]) -> str | None:
        """None when the request carries the token, else what is wrong with it (one line)."""
        for name, value in headers:
            if name == b"authorization":
                if hmac.compare_digest(value, self._expected):
                    return None
                return (f"wrong token in the Authorization header; send 'Authorization: Bearer <token>' with the "
                        f"server's token (EnvClient: ${TOKEN_ENV} or token=)")
        return (f"this server requires a token: send 'Authorization: Bearer <token>' (EnvClient: set ${TOKEN_ENV} "
                f"or pass token=; training: env.server_token_file)")
