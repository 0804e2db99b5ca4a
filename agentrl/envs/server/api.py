"""The wire API of the HTTP env pool server, as data: pydantic models and the OpenAPI document.

The models describe the JSON bodies :class:`~agentrl.envs.server.pool.EnvPool` accepts and returns;
the server does *not* validate requests with them (the pool's own checks give the 400 messages),
they exist so the API is written down once, served as ``GET /openapi.json`` and checked against
real replies in the tests. A server written in another language that answers these routes with
these bodies works with :meth:`EnvClient.http <agentrl.envs.server.client.EnvClient.http>`.
"""

from __future__ import annotations

import html
import json
from typing import Any

from pydantic import BaseModel, ConfigDict, Field
from pydantic.json_schema import models_json_schema

from agentrl.envs.base import MAX_TEXT_LENGTH

API_VERSION = "1.1"


class _Model(BaseModel):
    model_config = ConfigDict(extra="allow")


class TaskAddress(_Model):
    """A task: a split of the environment's task set and an index into it."""
    split: str = Field(description="a key of /info's split_sizes")
    index: int = Field(ge=0, description="0 .. split_sizes[split] - 1")


class ResetRequestItem(_Model):
    instance_id: int
    task: TaskAddress


class StepRequestItem(_Model):
    instance_id: int
    action: str = Field(max_length=MAX_TEXT_LENGTH, description="the agent's action text")


class ResetRequest(_Model):
    """Start a task on each listed instance (each id at most once per request)."""
    items: list[ResetRequestItem]


class StepRequest(_Model):
    """Apply one action on each listed instance (each id at most once per request)."""
    items: list[StepRequestItem]


class ExpertRequest(_Model):
    """The expert's plan of each listed instance, from the state right after its last reset."""
    instance_ids: list[int]


class ResetReplyItem(_Model):
    instance_id: int
    ok: bool = Field(description="false: the environment failed; see error")
    error: str | None = Field(description="null when ok")
    obs: str = Field(description="the first observation ('' on failure)")
    info: dict[str, Any] = Field(description="environment-specific; failures add env_error and env_traceback")


class StepReplyItem(_Model):
    instance_id: int
    ok: bool
    error: str | None
    obs: str
    reward: float
    terminated: bool
    truncated: bool = Field(description="true on a failure too: the episode is over, reset the instance")
    info: dict[str, Any] = Field(description="environment-specific (won, admissible_actions, ...); "
                                             "failures add env_error")


class ExpertReplyItem(_Model):
    instance_id: int
    ok: bool
    error: str | None
    actions: list[str]


class ResetReply(_Model):
    results: list[ResetReplyItem] = Field(description="one per request item, in request order")


class StepReply(_Model):
    results: list[StepReplyItem] = Field(description="one per request item, in request order")


class ExpertReply(_Model):
    results: list[ExpertReplyItem] = Field(description="one per requested id, in request order")


class ShardAddress(_Model):
    port: int = Field(description="on the same host as the URL the client was given")
    first_id: int
    size: int


class InfoReply(_Model):
    env: str
    env_kwargs: dict[str, Any]
    first_id: int = Field(description="the first instance id this process serves")
    size: int = Field(description="instances this process serves")
    split_sizes: dict[str, int] = Field(description="tasks per split")
    failures: int = Field(description="environment failures this process recovered from")
    shards: list[ShardAddress] | None = Field(
        default=None, description="every process of this server, this one first; together they hold ids "
                                  "0 .. N-1 contiguously. Absent: this process is the whole pool")


class HealthReply(_Model):
    ok: bool


class ErrorReply(_Model):
    error: str = Field(description="what was wrong, for a person")


MODELS = (TaskAddress, ResetRequestItem, StepRequestItem, ResetRequest, StepRequest, ExpertRequest,
          ResetReplyItem, StepReplyItem, ExpertReplyItem, ResetReply, StepReply, ExpertReply,
          ShardAddress, InfoReply, HealthReply, ErrorReply)

DESCRIPTION = """\
A pool of text-environment instances (one environment, many instances) stepped in batches.
Every body is JSON. A batch names instances by integer id; results come back in request order.
A malformed request (bad JSON, unknown or repeated id, bad task address, non-string action) is
refused as a whole with 400 and touches no instance. A failure *inside* an environment is not an
HTTP error: that instance's result has ok=false and error set, and the instance is rebuilt (reset
it before stepping it again). Other statuses: 401 no or wrong token (a server started with one
requires `Authorization: Bearer <token>` on every route but /health), 404 unknown route, 405 wrong
method, 408 a request head or body that did not arrive in time (the connection is closed), 411
POST without Content-Length, 413 body over the server's limit (refused from the header; the
connection is closed), 431 a request head (request line and headers) over 64 KiB (the connection is
closed), 500 an unexpected server fault (the server keeps running), 503 the server closed while the
request ran (the instances' state is unknown), or it holds its maximum of connections and all are
busy (sent before the request is read, with Retry-After). Every error body is {"error": message}.
A 401 closes its connection; a connection idle after its last reply is closed after 15 s (2 s when
it made no authenticated request).

Sharding: a server may spread its instances over several processes (ports on one host); GET
/info lists them in `shards` and a client sends each instance's requests to its shard. A server
of one process may omit `shards`.
"""

_ERRORS = {"400": "malformed request: nothing was done", "401": "no or wrong token", "404": "no such route",
           "405": "wrong method", "408": "request head or body not received in time", "411": "no Content-Length",
           "413": "body over the server's limit", "431": "request head over 64 KiB", "500": "server fault",
           "503": "the server closed while the request ran, or holds its maximum of connections"}
_TOKEN = "bearerToken"


def _json(ref: str, description: str) -> dict[str, Any]:
    return {"description": description,
            "content": {"application/json": {"schema": {"$ref": f"#/components/schemas/{ref}"}}}}


def _post(summary: str, request: str, reply: str) -> dict[str, Any]:
    errors = {code: _json("ErrorReply", text) for code, text in _ERRORS.items() if code != "404"}
    return {"post": {"summary": summary, "operationId": request.removesuffix("Request").lower(),
                     "requestBody": {**_json(request, summary), "required": True},
                     "responses": {"200": _json(reply, "results in request order"), **errors}}}


def _get(summary: str, operation: str, reply: str, open_route: bool = False) -> dict[str, Any]:
    responses = {"200": _json(reply, summary)}
    if open_route:  # no token needed
        return {"get": {"summary": summary, "operationId": operation, "responses": responses, "security": []}}
    return {"get": {"summary": summary, "operationId": operation,
                    "responses": {**responses, "401": _json("ErrorReply", _ERRORS["401"])}}}


def openapi_document() -> dict[str, Any]:
    """The OpenAPI 3.1 description of the server (served as ``GET /openapi.json``)."""
    _, schemas = models_json_schema([(m, "validation") for m in MODELS],
                                    ref_template="#/components/schemas/{model}")
    return {
        "openapi": "3.1.0",
        "info": {"title": "agentrl environment pool server", "version": API_VERSION, "description": DESCRIPTION},
        "paths": {
            "/health": _get("liveness (no token needed)", "health", "HealthReply", open_route=True),
            "/info": _get("the pool: environment, instance ids, splits, shards", "info", "InfoReply"),
            "/reset": _post("start a task on each listed instance", "ResetRequest", "ResetReply"),
            "/step": _post("apply one action on each listed instance (never re-sent by the client: "
                           "it may have been applied)", "StepRequest", "StepReply"),
            "/expert": _post("the expert's plan of each listed instance", "ExpertRequest", "ExpertReply"),
            "/openapi.json": {"get": {"summary": "this document", "operationId": "openapi",
                                      "responses": {"200": {"description": "OpenAPI 3.1 (JSON)"}}}},
            "/docs": {"get": {"summary": "this document as a page", "operationId": "docs",
                              "responses": {"200": {"description": "HTML"}}}},
        },
        "components": {"schemas": schemas["$defs"], "securitySchemes": {_TOKEN: {
            "type": "http", "scheme": "bearer",
            "description": "the server's shared token; required by servers started with one (every server "
                           "listening beyond the loopback interface, unless started with --allow-no-token)"}}},
        "security": [{_TOKEN: []}, {}],
    }


def docs_page(document: dict[str, Any]) -> str:
    """A self-contained HTML page of ``document`` (no scripts, nothing fetched from elsewhere)."""
    rows = []
    for path, methods in document["paths"].items():
        for method, op in methods.items():
            body = op.get("requestBody", {}).get("content", {}).get("application/json", {})
            reply = op["responses"]["200"].get("content", {}).get("application/json", {})
            names = [s["schema"]["$ref"].rsplit("/", 1)[1] for s in (body, reply) if s]
            links = " &rarr; ".join(f'<a href="#{n}">{n}</a>' for n in names)
            rows.append(f"<tr><td><code>{method.upper()} {html.escape(path)}</code></td>"
                        f"<td>{html.escape(op['summary'])}</td><td>{links}</td></tr>")
    schemas = "".join(f'<h3 id="{html.escape(name)}">{html.escape(name)}</h3><pre>'
                      f"{html.escape(json.dumps(schema, indent=2))}</pre>"
                      for name, schema in document["components"]["schemas"].items())
    info = document["info"]
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(info['title'])}</title>"
            "<style>body{font-family:sans-serif;max-width:60em;margin:2em auto}td{padding:.2em 1em;"
            "vertical-align:top}pre{background:#f4f4f4;padding:.5em}</style></head><body>"
            f"<h1>{html.escape(info['title'])} <small>API {html.escape(info['version'])}</small></h1>"
            f"<p>Machine-readable: <a href='/openapi.json'>/openapi.json</a> (OpenAPI 3.1).</p>"
            f"<pre>{html.escape(info['description'])}</pre><h2>Routes</h2><table>{''.join(rows)}</table>"
            f"<h2>Schemas</h2>{schemas}</body></html>")


if __name__ == "__main__":  # python -m agentrl.envs.server.api > docs/env-server-openapi.json
    print(json.dumps(openapi_document(), indent=2))
