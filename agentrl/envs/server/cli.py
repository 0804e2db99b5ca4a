"""``agentrl envs serve NAME``: run an environment pool standalone over HTTP."""

from __future__ import annotations

import json
import os

from agentrl.envs import env_names
from agentrl.envs.server.auth import read_token_file, refuse_open_bind, token_from_env
from agentrl.envs.server.http_server import serve
from agentrl.errors import UsageError


def add_cli(subparsers) -> None:
    p = subparsers.add_parser(
        "serve", help="serve a pool of environment instances over HTTP (JSON API)",
        description="Serve SIZE instances of environment NAME over HTTP, for a trainer in another "
                    "process, virtualenv or machine. API: GET /info, POST /reset, /step, /expert; "
                    "its OpenAPI description at GET /openapi.json and /docs (see docs/env-servers.md).")
    p.add_argument("name", help=f"environment: one found ({', '.join(env_names())}) or package.module:SPEC")
    p.add_argument("--port", type=int, default=8400, help="port of the first shard (default 8400)")
    p.add_argument("--host", default="127.0.0.1",
                   help="address to bind (default 127.0.0.1); any other needs a token (--token-file or "
                        "$AGENTRL_ENV_TOKEN) or --allow-no-token")
    p.add_argument("--size", type=int, default=16, help="number of environment instances (default 16)")
    p.add_argument("--shards", type=int, default=1,
                   help="processes to spread the instances over, one core each (default 1)")
    p.add_argument("--env-kwargs", default="{}", metavar="JSON",
                   help='keyword arguments of the environment factory, e.g. \'{"max_steps": 30}\'')
    p.add_argument("--max-body-bytes", type=int, default=16 << 20,
                   help="largest request body accepted (default 16 MiB)")
    p.add_argument("--call-timeout", type=float, default=None, metavar="SECONDS",
                   help="abandon an environment reset/step that runs longer and rebuild the instance "
                        "(default: no limit)")
    p.add_argument("--token-file", default=None, metavar="PATH",
                   help="file holding the shared token clients must send (Authorization: Bearer); default: "
                        "$AGENTRL_ENV_TOKEN if set, else no token")
    p.add_argument("--allow-no-token", action="store_true",
                   help="serve an address other machines can reach without a token (a trusted network only)")
    p.add_argument("--ssl-certfile", default=None, metavar="PEM", help="serve HTTPS with this certificate (chain)")
    p.add_argument("--ssl-keyfile", default=None, metavar="PEM", help="the certificate's private key")
    p.add_argument("--verbose", action="store_true", help="log every request to stderr")
    p.set_defaults(_envs_run=run_serve)


def run_serve(args) -> int:
    try:
        env_kwargs = json.loads(args.env_kwargs)
    except json.JSONDecodeError as err:
        raise UsageError(f"--env-kwargs is not valid JSON: {err}") from None
    if not isinstance(env_kwargs, dict):
        raise UsageError("--env-kwargs must be a JSON object")
    if args.size <= 0:
        raise UsageError(f"--size must be positive, got {args.size}")
    if not 1 <= args.shards <= args.size:
        raise UsageError(f"--shards must be between 1 and --size ({args.size}), got {args.shards}")
    if args.call_timeout is not None and args.call_timeout <= 0:
        raise UsageError(f"--call-timeout must be positive, got {args.call_timeout}")
    if not 0 <= args.port <= 65535:
        raise UsageError(f"--port must be 0..65535, got {args.port}")
    if bool(args.ssl_certfile) != bool(args.ssl_keyfile):
        raise UsageError("--ssl-certfile and --ssl-keyfile go together: give both (or neither, for plain HTTP)")
    for flag, path in (("--ssl-certfile", args.ssl_certfile), ("--ssl-keyfile", args.ssl_keyfile)):
        if path and not os.path.isfile(path):
            raise UsageError(f"{flag} {path}: no such file (PEM files; see docs/env-servers.md, 'Authentication "
                             f"and TLS')")
    try:
        token = read_token_file(args.token_file) if args.token_file else token_from_env()
        refuse_open_bind(args.host, token, args.allow_no_token)
    except ValueError as err:
        raise UsageError(str(err)) from None
    try:
        return serve(args.name, args.size, env_kwargs, host=args.host, port=args.port, shards=args.shards,
                     max_body_bytes=args.max_body_bytes, verbose=args.verbose, call_timeout_s=args.call_timeout,
                     token=token, allow_no_token=args.allow_no_token, ssl_certfile=args.ssl_certfile,
                     ssl_keyfile=args.ssl_keyfile)
    except (ValueError, TypeError) as err:  # unknown env name, bad factory kwargs
        raise UsageError(str(err)) from None
    except OSError as err:  # port in use, address not available
        raise UsageError(f"cannot serve on {args.host}:{args.port}: {err}") from None
