"""Authentication of the HTTP env server: a shared token sent as ``Authorization: Bearer`` (the scheme
in any case), refused without it; no token on an address other machines reach unless allowed; token
files that others may read refused; the token kept out of child processes' environments; a warning
before it goes over plain HTTP to another machine; TLS with uvicorn's options."""

from __future__ import annotations

import datetime
import ipaddress
import logging
import os
import subprocess
import sys

import pytest
import urllib3

from agentrl.cli.main import main as cli_main
from agentrl.envs import TaskRef
from agentrl.envs.server import EnvClient, EnvServerError
from agentrl.envs.server import auth
from agentrl.envs.server.auth import TOKEN_ENV, check_token, is_loopback, load_token_file, read_token_file
from agentrl.envs.server.client import HttpTransport
from agentrl.envs.server.http_server import ShardedHTTPServer

pytestmark = pytest.mark.slow

TOKEN = "s3cret-token-for-tests-0123456789"


def private_file(path, text: str):
    """A token file as MAKE_TOKEN writes it: created with mode 600."""
    path.write_text(text)
    path.chmod(0o600)
    return path


@pytest.fixture(scope="module")
def guarded():
    server = ShardedHTTPServer("textcraft", 4, shards=2, token=TOKEN)  # the extra shard gets it too
    server.start_background()
    yield server
    server.close()


def get(port: int, path: str, headers: dict | None = None) -> tuple[int, dict, dict]:
    response = urllib3.request("GET", f"http://127.0.0.1:{port}{path}", headers=headers, timeout=10, retries=False)
    return response.status, response.json(), dict(response.headers)


def test_every_route_but_health_needs_the_token(guarded, monkeypatch):
    monkeypatch.delenv(TOKEN_ENV, raising=False)
    assert get(guarded.port, "/health")[:2] == (200, {"ok": True})  # for load balancers and probes
    status, body, headers = get(guarded.port, "/info")
    assert status == 401 and "requires a token" in body["error"] and headers.get("www-authenticate") == "Bearer"
    status, body, _ = get(guarded.port, "/info", {"Authorization": "Bearer not-the-token"})
    assert status == 401 and "wrong token" in body["error"]
    for shard in guarded.shards:  # every shard process checks it
        response = urllib3.request("POST", f"http://127.0.0.1:{shard['port']}/step", body=b'{"items": []}',
                                   timeout=10, retries=False)
        assert response.status == 401, shard
    with pytest.raises(EnvServerError, match="answered 401: this server requires a token"):
        EnvClient.http(f"http://127.0.0.1:{guarded.port}", timeout=10)
    assert get(guarded.port, "/info", {"Authorization": f"Bearer {TOKEN}"})[0] == 200


def test_the_client_sends_the_token_from_the_environment_or_its_argument(guarded, monkeypatch):
    url = f"http://127.0.0.1:{guarded.port}"
    monkeypatch.setenv(TOKEN_ENV, TOKEN)
    with EnvClient.http(url, timeout=30) as client:  # both shards, reset and step
        results = client.reset([(0, TaskRef("train", 0)), (3, TaskRef("train", 1))])
        assert all(r.ok for r in results)
        assert all(r.ok for r in client.step([(0, "inventory"), (3, "inventory")]))
    monkeypatch.delenv(TOKEN_ENV)
    with EnvClient.http(url, timeout=30, token=TOKEN) as client:
        assert client.reset([(2, TaskRef("train", 2))])[0].ok


def test_an_open_address_needs_a_token_unless_allowed(monkeypatch):
    monkeypatch.delenv(TOKEN_ENV, raising=False)
    with pytest.raises(ValueError, match="refusing to serve on 0.0.0.0 without a token.*--allow-no-token"):
        ShardedHTTPServer("test-flaky", 2, host="0.0.0.0")
    for host in ("0.0.0.0", "::"):
        assert not is_loopback(host)
    assert is_loopback("127.0.0.1") and is_loopback("localhost") and is_loopback("::1")
    open_server = ShardedHTTPServer("test-flaky", 2, host="0.0.0.0", allow_no_token=True)
    open_server.close()
    guarded = ShardedHTTPServer("test-flaky", 2, host="0.0.0.0", token=TOKEN)
    guarded.close()


@pytest.mark.parametrize("token, fragment", [("short", "at least 16"), ("has a space in it 0123", "printable ASCII"),
                                             ("ünïcode-token-0123456", "printable ASCII")])
def test_weak_or_unsendable_tokens_are_refused(token, fragment, tmp_path):
    with pytest.raises(ValueError, match=fragment):
        check_token(token, "a test")
    path = private_file(tmp_path / "token", f"{TOKEN}\n")
    assert read_token_file(path) == TOKEN
    with pytest.raises(ValueError, match="cannot read the token file"):
        read_token_file(tmp_path / "missing")


@pytest.mark.parametrize("argv, fragment", [
    (["--host", "0.0.0.0"], "without a token"),
    (["--token-file", "/nonexistent/token"], "cannot read the token file"),
    (["--ssl-certfile", "cert.pem"], "go together"),
    (["--ssl-certfile", "/nonexistent/c.pem", "--ssl-keyfile", "/nonexistent/k.pem"], "no such file"),
])
def test_cli_refuses_unsafe_or_broken_auth_settings(capsys, monkeypatch, argv, fragment):
    monkeypatch.delenv(TOKEN_ENV, raising=False)
    assert cli_main(["envs", "serve", "textcraft", "--port", "0", *argv]) == 2
    err = capsys.readouterr().err
    assert fragment in err and len(err.strip().splitlines()) == 1, err


def test_env_server_token_file_is_this_processes_token_and_not_its_childrens(tmp_path, monkeypatch):
    """env.server_token_file: the rollout workers (and the driver) read it where every transport looks,
    not into the environment that vLLM, agent processes and other children inherit."""
    monkeypatch.delenv(TOKEN_ENV, raising=False)
    monkeypatch.setattr(auth, "_PROCESS_TOKEN", None)
    load_token_file(None)
    assert auth.default_token() is None
    path = private_file(tmp_path / "token", TOKEN + "\n")
    load_token_file(path)
    assert auth.default_token() == TOKEN and TOKEN_ENV not in os.environ
    assert HttpTransport("127.0.0.1", 1, None)._post_headers["Authorization"] == f"Bearer {TOKEN}"
    child = subprocess.run([sys.executable, "-c", f"import os; print(os.environ.get({TOKEN_ENV!r}))"],
                           capture_output=True, text=True, check=True)
    assert child.stdout.strip() == "None"
    path.write_text("short\n")
    with pytest.raises(ValueError, match="at least 16"):
        load_token_file(path)


@pytest.mark.parametrize("mode", [0o644, 0o640, 0o604, 0o620])
def test_a_token_file_others_may_read_or_write_is_refused_with_the_fix(tmp_path, mode):
    path = private_file(tmp_path / "token", TOKEN + "\n")
    path.chmod(mode)
    with pytest.raises(ValueError, match=f"open to other users \\(mode {mode:04o}\\).*run: chmod 600 {path}"):
        read_token_file(path)
    path.chmod(0o600)
    assert read_token_file(path) == TOKEN
    assert "umask 077" in auth.MAKE_TOKEN


def test_the_cli_refuses_a_token_file_others_may_read(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv(TOKEN_ENV, raising=False)
    path = private_file(tmp_path / "token", TOKEN + "\n")
    path.chmod(0o644)
    assert cli_main(["envs", "serve", "textcraft", "--port", "0", "--token-file", str(path)]) == 2
    err = capsys.readouterr().err
    assert "chmod 600" in err and len(err.strip().splitlines()) == 1, err


def test_the_bearer_scheme_is_case_insensitive(guarded):
    for scheme in ("bearer", "BEARER", "Bearer", "bEaReR"):
        assert get(guarded.port, "/info", {"Authorization": f"{scheme} {TOKEN}"})[0] == 200, scheme
    assert get(guarded.port, "/info", {"Authorization": f"Basic {TOKEN}"})[0] == 401
    assert get(guarded.port, "/info", {"Authorization": TOKEN})[0] == 401


def test_a_401_closes_the_connection(guarded):
    import socket

    with socket.create_connection(("127.0.0.1", guarded.port), timeout=5) as sock:
        sock.sendall(b"GET /info HTTP/1.1\r\nHost: x\r\n\r\n")
        reply = b""
        while chunk := sock.recv(65536):      # returns only once the server closed the connection
            reply += chunk
    assert reply.startswith(b"HTTP/1.1 401") and b"connection: close" in reply.lower()


def test_the_shard_processes_get_the_token_through_a_pipe_not_their_environment(guarded):
    for child in guarded.children:
        environ = open(f"/proc/{child.pid}/environ", "rb").read().split(b"\0")
        assert not any(entry.startswith(TOKEN_ENV.encode() + b"=") for entry in environ)
        assert TOKEN.encode() not in b" ".join(open(f"/proc/{child.pid}/cmdline", "rb").read().split(b"\0"))


def test_a_token_over_plain_http_to_another_machine_is_warned_about_once(monkeypatch, caplog):
    monkeypatch.setattr(auth, "_WARNED", set())
    with caplog.at_level(logging.WARNING, logger="agentrl.envs.server"):
        HttpTransport("127.0.0.1", 8400, None, TOKEN)          # loopback: nothing to say
        HttpTransport("192.0.2.7", 8400, None, TOKEN, scheme="https")   # TLS: nothing to say
        HttpTransport("192.0.2.7", 8400, None, None)           # no token: nothing to say
        for _ in range(3):
            HttpTransport("192.0.2.7", 8400, None, TOKEN)
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and "plain http to 192.0.2.7:8400" in lines[0] and "ssl-certfile" in lines[0]


def self_signed(tmp_path) -> tuple[str, str]:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), True)
            .sign(key, hashes.SHA256()))
    cert_path, key_path = tmp_path / "cert.pem", tmp_path / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return str(cert_path), str(key_path)


def test_tls_with_a_token(tmp_path, monkeypatch):
    cert, key = self_signed(tmp_path)
    server = ShardedHTTPServer("textcraft", 2, token=TOKEN, ssl_certfile=cert, ssl_keyfile=key)
    server.start_background()
    try:
        monkeypatch.setenv("SSL_CERT_FILE", cert)  # how a client trusts a private CA (docs/env-servers.md)
        with EnvClient.http(f"https://127.0.0.1:{server.port}", timeout=30, token=TOKEN) as client:
            assert client.reset([(1, TaskRef("train", 4))])[0].ok
            assert client.step([(1, "inventory")])[0].ok
        with pytest.raises(Exception):  # plain HTTP to a TLS port gets no answer it can read
            urllib3.request("GET", f"http://127.0.0.1:{server.port}/health", timeout=5, retries=False)
    finally:
        server.close()


def test_a_bad_certificate_fails_at_construction(tmp_path):
    (tmp_path / "junk.pem").write_text("not a certificate")
    with pytest.raises(OSError):
        ShardedHTTPServer("test-flaky", 2, ssl_certfile=str(tmp_path / "junk.pem"),
                          ssl_keyfile=str(tmp_path / "junk.pem"))

