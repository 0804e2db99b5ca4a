"""The gateway's HTTP side: ``/v1/chat/completions`` (streaming or not) and ``/v1/models``, OpenAI's wire
format, on Starlette/uvicorn (the env server's stack).

    gateway = Gateway(backend, tokenizer, model_name="agentrl-policy")
    gateway.start_background()
    episode = gateway.open_episode()                 # episode.key: the agent's API key
    client = openai.OpenAI(base_url=gateway.base_url, api_key=episode.key)
    ... the agent runs ...
    steps = gateway.close_episode(episode.key).steps

Supported request fields: ``messages`` (string content or text parts), ``tools`` and ``tool_choice``
(``auto``, ``none``; ``required`` or a named function is accepted and only listed, the model is not
constrained), ``temperature``, ``top_p``, ``max_tokens`` / ``max_completion_tokens``, ``stop``,
``seed``, ``logprobs`` (``top_logprobs`` only 0), ``stream`` (and ``stream_options.include_usage``),
``n`` = 1, and agentrl's own ``agentrl: {"anchor": ...}`` (the OpenAI client's ``extra_body``).
Anything malformed is a 400 in OpenAI's error shape (``{"error": {"message", "type", "code"}}``)
and fails the episode; an unknown key is a 401 (the connection is closed); a call over the
episode's budget a 400 with code ``budget_exceeded``; a failed engine call a 500 with code
``engine_error`` (the rollout then fails: the engine's fault, not the agent's).

What one request may cost is bounded before the prompt is built (docs/reliability.md, "Limits"):
a body over ``max_body_bytes`` is refused unread (413), more than ``max_messages`` messages or
more than ``max_prompt_chars`` characters of messages and tools (400, ``context_length_exceeded``);
with ``prompt_truncation="error"`` the prompt is tokenized message by message and refused as soon
as it passes ``max_prompt_tokens``. The connections are guarded as
:mod:`agentrl.runtime.http_connections` describes (head size and deadline, keep-alive, a cap).
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time
import uuid
from typing import Any

import orjson
import uvicorn
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from agentrl.gateway.conversation import ConversationRenderer, PromptOverLimit, SampledReply
from agentrl.gateway.episodes import (Batcher, EngineError, EnvCallError, EpisodeRegistry, GatewayEpisode, GatewayStep,
                                      anchor_of)
from agentrl.gateway.tools import calls_key, parse_tool_calls
from agentrl.generation.base import GenerationBackend, SamplingParams
from agentrl.runtime.http_connections import LISTEN_BACKLOG, ConnectionGuard, ConnectionLimits, connection_of

ROLES = ("system", "developer", "user", "assistant", "tool")
MAX_STOP_STRINGS = 4
MAX_BODY_BYTES = 4 << 20        # a request body larger than this is refused unread (413)
MAX_MESSAGES = 256              # messages of one request (building a prompt takes time quadratic in them)
CHARS_PER_TOKEN = 32            # max_prompt_chars defaults to this many characters per token of the model length
MIN_PROMPT_CHARS = 1 << 16


class RequestError(ValueError):
    """A request refused as a whole: its status, OpenAI error type and code."""

    def __init__(self, message: str, status: int = 400, code: str = "invalid_request", kind: str = "invalid_request_error"):
        super().__init__(message)
        self.status, self.code, self.kind = status, code, kind


def _error(err: RequestError) -> Response:
    body = {"error": {"message": str(err), "type": err.kind, "code": err.code, "param": None}}
    close = {"Connection": "close"} if err.status in (401, 413) else None   # a stranger, or a body left unread
    return Response(orjson.dumps(body), err.status, close, media_type="application/json")


def _openai_error(status: int, message: str) -> bytes:
    """A connection-level error (431, 408, 503, malformed HTTP) in OpenAI's error shape."""
    kind = "server_error" if status >= 500 else "invalid_request_error"
    return orjson.dumps({"error": {"message": message, "type": kind, "code": f"http_{status}", "param": None}})


async def _body_json(request: Request, limit: int) -> Any:
    """The request body parsed, refused (413) past ``limit`` bytes, announced or sent."""
    announced = request.headers.get("content-length")
    if announced is not None and announced.isdigit() and int(announced) > limit:
        raise RequestError(f"the request body has {announced} bytes, more than the {limit} the gateway takes",
                           413, "request_too_large")
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > limit:
            raise RequestError(f"the request body is over the {limit} bytes the gateway takes", 413,
                               "request_too_large")
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError as err:
        raise RequestError(f"the body is not JSON: {err}") from err


def _characters(messages: list[dict[str, Any]], tools: Any) -> int:
    """Characters of the messages' text, tool calls and the tool list: what the prompt is built from."""
    count = len(orjson.dumps(tools)) if tools else 0
    for message in messages:
        count += len(message.get("content") or "")
        if message.get("tool_calls"):
            count += len(orjson.dumps(message["tool_calls"]))
    return count


def _text(content: Any, where: str) -> str | None:
    if content is None or isinstance(content, str):
        return content
    if isinstance(content, list) and all(isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
                                         for p in content):
        return "".join(p["text"] for p in content)
    raise RequestError(f"{where}.content must be a string or a list of text parts ({{\"type\": \"text\", \"text\": ...}})")


def _messages(body: dict[str, Any]) -> list[dict[str, Any]]:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise RequestError("messages must be a non-empty list of {role, content} objects")
    out = []
    for i, message in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(message, dict) or message.get("role") not in ROLES:
            raise RequestError(f"{where} needs a role among {', '.join(ROLES)}")
        # OpenAI's newer clients send instructions as "developer"; chat templates know them as "system"
        role = "system" if message["role"] == "developer" else message["role"]
        clean = {"role": role, "content": _text(message.get("content"), where)}
        if message.get("tool_calls"):
            calls = message["tool_calls"]
            if not isinstance(calls, list) or not all(isinstance(c, dict) and isinstance(c.get("function"), dict)
                                                      for c in calls):
                raise RequestError(f"{where}.tool_calls must be a list of {{\"function\": {{\"name\", \"arguments\"}}}}")
            clean["tool_calls"] = calls
        if message["role"] == "tool":
            clean["tool_call_id"] = message.get("tool_call_id")
        out.append(clean)
    return out


def cut_at_stop(text: str, stops: tuple[str, ...]) -> str:
    """``text`` up to its first stop string: OpenAI leaves a matched stop string, and what the token that
    completed it carried after it, out of the content (the recorded ids keep the whole token)."""
    found = [i for i in (text.find(stop) for stop in stops) if i >= 0]
    return text[:min(found)] if found else text


def _number(body: dict[str, Any], key: str, default: float, low: float, high: float) -> float:
    value = body.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not low <= value <= high:
        raise RequestError(f"{key} must be a number in [{low}, {high}], got {value!r}")
    return float(value)


class Gateway:
    """An OpenAI-compatible endpoint over ``backend`` (module docstring). ``policy_version`` is stamped on
    every step; the trainer sets it after each weight sync."""

    def __init__(self, backend: GenerationBackend, tokenizer: Any, *, model_name: str = "agentrl-policy",
                 host: str = "127.0.0.1", port: int = 0, max_model_len: int = 4096, default_max_tokens: int = 256,
                 stop_token_ids: tuple[int, ...] = (), max_batch: int = 256, batch_wait_s: float = 0.005, seed: int = 0,
                 max_prompt_tokens: int | None = None, prompt_truncation: str = "error",
                 max_body_bytes: int = MAX_BODY_BYTES, max_messages: int = MAX_MESSAGES,
                 max_prompt_chars: int | None = None, limits: ConnectionLimits | None = None):
        self.tokenizer, self.model_name = tokenizer, model_name
        self.renderer = ConversationRenderer(tokenizer)
        self.episodes = EpisodeRegistry()
        self.batcher = Batcher(backend, max_batch, batch_wait_s, seed)
        self.batcher.version = lambda: self.policy_version
        self.max_model_len, self.default_max_tokens = int(max_model_len), int(default_max_tokens)
        self.stop_token_ids = tuple(stop_token_ids) or tuple(
            i for i in (tokenizer.convert_tokens_to_ids("<|im_end|>"), tokenizer.eos_token_id) if isinstance(i, int))
        self.policy_version = 0
        #: set while training: temperature, top-p, top-k and the response cap of every call come from it
        self.sampling: SamplingParams | None = None
        #: rollout.max_prompt_tokens and rollout.prompt_truncation (left: keep a long prompt's last tokens)
        self.max_prompt_tokens, self.prompt_truncation = int(max_prompt_tokens or 0), prompt_truncation
        self.max_body_bytes, self.max_messages = int(max_body_bytes), int(max_messages)
        self.max_prompt_chars = int(max_prompt_chars or max(MIN_PROMPT_CHARS, CHARS_PER_TOKEN * self.max_model_len))
        self.truncated_prompts = 0          # prompts cut to their last max_prompt_tokens tokens
        self.dropped_system_messages = 0    # of those, cut without their system message (instructions, tools)
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self.socket = socket.create_server((host, port), family=family, backlog=LISTEN_BACKLOG)
        self.host, self.port = host, self.socket.getsockname()[1]
        self.app = Starlette(routes=[Route("/v1/models", self._models, methods=["GET"]),
                                     Route("/v1/chat/completions", self._chat, methods=["POST"]),
                                     Route("/agentrl/env/{what:str}", self._env, methods=["POST"]),
                                     Route("/health", self._health, methods=["GET"])])
        self.guard = ConnectionGuard(limits, _openai_error)
        self._uvicorn = uvicorn.Server(uvicorn.Config(self.app, http=self.guard.protocol_class(), lifespan="off",
                                                      log_config=None, log_level="error", access_log=False,
                                                      timeout_keep_alive=self.guard.limits.keep_alive_s,
                                                      server_header=False, date_header=False))
        self._thread: threading.Thread | None = None

    @property
    def base_url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/v1"

    # ----- episodes ------------------------------------------------------------------------------
    def open_episode(self, label: str = "", max_calls: int | None = None, max_tokens: int | None = None
                     ) -> GatewayEpisode:
        return self.episodes.open(label, max_calls, max_tokens)

    def close_episode(self, key: str) -> GatewayEpisode:
        return self.episodes.close(key)

    # ----- routes --------------------------------------------------------------------------------
    async def _health(self, request: Request) -> Response:
        return Response(b'{"ok":true}', 200, media_type="application/json")

    async def _models(self, request: Request) -> Response:
        body = {"object": "list", "data": [{"id": self.model_name, "object": "model", "created": 0,
                                            "owned_by": "agentrl"}]}
        return Response(orjson.dumps(body), 200, media_type="application/json")

    def _episode(self, request: Request) -> GatewayEpisode:
        auth = request.headers.get("authorization", "")
        key = auth[7:].strip() if auth.lower().startswith("bearer ") else ""
        episode = self.episodes.get(key) if key else None
        if episode is None:
            raise RequestError("unknown or missing API key: each episode's agent gets its own key from the trainer "
                               "(Authorization: Bearer <key>)", 401, "invalid_api_key", "authentication_error")
        connection = connection_of(request.scope)
        if connection is not None:
            connection.prove()
        return episode

    async def _chat(self, request: Request) -> Response:
        episode = None
        try:
            episode = self._episode(request)
            body = await _body_json(request, self.max_body_bytes)
            if not isinstance(body, dict):
                raise RequestError("the body must be a JSON object")
            return await self._complete(episode, body)
        except RequestError as err:
            if episode is not None and err.status != 401:
                episode.fail(f"{err.code}: {err}")
            return _error(err)

    async def _env(self, request: Request) -> Response:
        """The episode's environment for an agent in a process of its own (agent_processes.RemoteEnv):
        ``reset`` and ``step`` (``{"action": ...}``) of the instance the worker holds for the episode."""
        what = request.path_params["what"]
        try:
            episode = self._episode(request)
            if what not in ("reset", "step"):
                raise RequestError(f"unknown env call {what!r}: reset or step", 404, "not_found")
            if episode.env is None or episode.closed:
                raise RequestError("this episode has no environment here (or is over)", 400, "no_env")
            if what == "reset":
                obs, info = await run_in_threadpool(episode.env.reset)
                return Response(orjson.dumps({"obs": obs, "info": info}, default=str), 200,
                                media_type="application/json")
            body = await _body_json(request, self.max_body_bytes)
            action = body.get("action") if isinstance(body, dict) else None
            if not isinstance(action, str):
                raise RequestError("the body must be {\"action\": \"...\"} with a string action")
            obs, reward, done, info = await run_in_threadpool(episode.env.step, action)
            return Response(orjson.dumps({"obs": obs, "reward": reward, "done": done, "info": info}, default=str),
                            200, media_type="application/json")
        except RequestError as err:
            return _error(err)
        except EnvCallError as err:
            return _error(RequestError(str(err), 502, "env_error", "env_error"))

    def _sampling(self, body: dict[str, Any], prompt_len: int, episode: GatewayEpisode) -> tuple[SamplingParams, bool]:
        if body.get("n", 1) != 1:
            raise RequestError("n must be 1: each call is one step of one episode")
        if body.get("top_logprobs") not in (None, 0):
            raise RequestError("top_logprobs above 0 is not supported (logprobs=true gives each token's log-prob)")
        max_tokens = body.get("max_completion_tokens")
        max_tokens = body.get("max_tokens") if max_tokens is None else max_tokens
        max_tokens = self.default_max_tokens if max_tokens is None else max_tokens
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
            raise RequestError(f"max_tokens must be a positive integer, got {max_tokens!r}")
        room = self.max_model_len - prompt_len
        limit = min(max_tokens, room, episode.max_tokens - prompt_len if episode.max_tokens else room)
        if limit < 1:
            code = "context_length_exceeded" if room < 1 else "budget_exceeded"
            raise RequestError(f"the prompt has {prompt_len} tokens: no room left to generate (model length "
                               f"{self.max_model_len}, episode budget {episode.max_tokens})", 400, code)
        stop = body.get("stop") or []
        stop = [stop] if isinstance(stop, str) else stop
        if not isinstance(stop, list) or len(stop) > MAX_STOP_STRINGS or not all(isinstance(s, str) and s for s in stop):
            raise RequestError(f"stop must be a string or a list of at most {MAX_STOP_STRINGS} non-empty strings")
        seed = body.get("seed")
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
            raise RequestError(f"seed must be an integer, got {seed!r}")
        temperature = _number(body, "temperature", 1.0, 0.0, 2.0)
        top_p = _number(body, "top_p", 1.0, 1e-9, 1.0)
        if self.sampling is not None:       # training: the rollout's sampling, whatever the agent asked
            temperature, top_p = self.sampling.temperature, self.sampling.top_p
            limit = min(limit, self.sampling.max_tokens)
        sampling = SamplingParams(max_tokens=int(limit), temperature=temperature,
                                  top_p=top_p if temperature > 0 else 1.0,
                                  top_k=self.sampling.top_k if self.sampling is not None and temperature > 0 else -1,
                                  stop_token_ids=self.stop_token_ids, stop_strings=tuple(stop), seed=int(seed or 0))
        return sampling, seed is not None

    async def _complete(self, episode: GatewayEpisode, body: dict[str, Any]) -> Response:
        started = time.perf_counter()
        if episode.closed:
            raise RequestError("this episode is over: its key takes no more calls", 400, "episode_closed")
        if episode.max_calls is not None and len(episode.steps) >= episode.max_calls:
            raise RequestError(f"this episode made its {episode.max_calls} calls (its budget)", 400, "budget_exceeded")
        messages = _messages(body)
        tools = body.get("tools") or None
        if tools is not None and (not isinstance(tools, list) or not all(isinstance(t, dict) for t in tools)):
            raise RequestError("tools must be a list of {\"type\": \"function\", \"function\": {...}} objects")
        if body.get("tool_choice") == "none":
            tools = None
        self._check_size(messages, tools)
        extra = body.get("agentrl") if isinstance(body.get("agentrl"), dict) else {}
        with episode.lock:
            sampled = list(episode.sampled)
        # off the event loop: other requests are read and answered meanwhile; refused as soon as it passes
        # max_prompt_tokens unless it is to be cut
        stop_over = self.max_prompt_tokens if self.max_prompt_tokens and self.prompt_truncation != "left" else None
        try:
            prompt = await run_in_threadpool(self.renderer.prompt, messages, tools, sampled, stop_over)
        except PromptOverLimit as over:
            raise RequestError(f"the prompt has more than {over.limit} tokens, the most a call may send "
                               "(rollout.max_prompt_tokens)", 400, "context_length_exceeded") from None
        if self.max_prompt_tokens and len(prompt.ids) > self.max_prompt_tokens:
            self._cut(prompt)
        sampling, seeded = self._sampling(body, len(prompt.ids), episode)
        try:
            generation, version = await asyncio.wrap_future(self.batcher.submit(prompt.ids, sampling, seeded))
        except EngineError as err:
            raise RequestError(str(err), 500, "engine_error", "server_error") from err
        ids = list(generation.token_ids)
        text = self.tokenizer.decode(ids, skip_special_tokens=True)    # as OpenAI servers do (vLLM's default)
        if generation.finish_reason == "stop" and sampling.stop_strings:
            text = cut_at_stop(text, sampling.stop_strings)
        parsed = parse_tool_calls(text) if tools else None
        content = parsed.content if parsed else text
        calls = parsed.tool_calls if parsed else []
        finish = "tool_calls" if calls else ("stop" if generation.finish_reason == "stop" else "length")
        step = GatewayStep(prompt.ids, ids, list(generation.logprobs), version, anchor_of(messages, extra.get("anchor")),
                           messages, prompt.tokenized, prompt.token_in_token_out, finish,
                           parsed.invalid_tool_calls if parsed else 0, time.perf_counter() - started)
        with episode.lock:       # a call still running when its episode closed is refused, not recorded
            if episode.closed:
                raise RequestError("this episode ended while the call ran (its agent timed out or the rollout "
                                   "finished): the reply is not recorded", 400, "episode_closed")
            episode.steps.append(step)
            episode.sampled.append(SampledReply(content, calls_key(calls), ids))
        message: dict[str, Any] = {"role": "assistant", "content": content}
        if calls:
            message["tool_calls"] = calls
        logprobs = None
        if body.get("logprobs"):
            tokens = [self.tokenizer.decode([t], skip_special_tokens=False) for t in ids]
            logprobs = {"content": [{"token": token, "logprob": lp, "bytes": list(token.encode()), "top_logprobs": []}
                                    for token, lp in zip(tokens, generation.logprobs)]}
        usage = {"prompt_tokens": len(prompt.ids), "completion_tokens": len(ids), "total_tokens": len(prompt.ids) + len(ids)}
        reply_id, created = f"chatcmpl-{uuid.uuid4().hex}", int(time.time())
        if body.get("stream"):
            include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
            return StreamingResponse(self._chunks(reply_id, created, message, finish, logprobs,
                                                  usage if include_usage else None), media_type="text/event-stream")
        reply = {"id": reply_id, "object": "chat.completion", "created": created, "model": self.model_name,
                 "choices": [{"index": 0, "message": message, "finish_reason": finish, "logprobs": logprobs}],
                 "usage": usage}
        return Response(orjson.dumps(reply), 200, media_type="application/json")

    def _check_size(self, messages: list[dict[str, Any]], tools: Any) -> None:
        """Refuse, before any prompt is built, a request too large to build one for (module docstring)."""
        if len(messages) > self.max_messages:
            raise RequestError(f"the request has {len(messages)} messages, more than the {self.max_messages} a call "
                               "may send; send the conversation's last turns", 400, "context_length_exceeded")
        chars = _characters(messages, tools)
        if chars > self.max_prompt_chars:
            raise RequestError(f"the messages and tools hold {chars} characters, more than the {self.max_prompt_chars} "
                               f"a call may send ({CHARS_PER_TOKEN} per token of the model length "
                               f"{self.max_model_len}); send the conversation's last turns", 400,
                               "context_length_exceeded")

    def _cut(self, prompt) -> None:
        """As agentrl's own loop (rollout.prompt_truncation=left): the last tokens, after the system message
        (instructions, tools) when it takes at most half the room; counted, the system message's loss too."""
        keep = prompt.system_len if 0 < prompt.system_len <= self.max_prompt_tokens // 2 else 0
        prompt.ids = prompt.ids[:keep] + prompt.ids[len(prompt.ids) - (self.max_prompt_tokens - keep):]
        self.truncated_prompts += 1
        if prompt.system_len and not keep:
            self.dropped_system_messages += 1

    def _chunks(self, reply_id: str, created: int, message: dict[str, Any], finish: str, logprobs: Any,
                usage: dict[str, int] | None):
        def chunk(delta: dict[str, Any], finish_reason: str | None = None, extra: dict[str, Any] | None = None) -> bytes:
            body = {"id": reply_id, "object": "chat.completion.chunk", "created": created, "model": self.model_name,
                    "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason, **(extra or {})}]}
            return b"data: " + orjson.dumps(body) + b"\n\n"

        async def stream():
            yield chunk({"role": "assistant", "content": ""})
            if message.get("content"):
                yield chunk({"content": message["content"]}, extra={"logprobs": logprobs} if logprobs else None)
            for index, call in enumerate(message.get("tool_calls", [])):
                yield chunk({"tool_calls": [{"index": index, **call}]})
            yield chunk({}, finish)
            if usage is not None:
                body = {"id": reply_id, "object": "chat.completion.chunk", "created": created,
                        "model": self.model_name, "choices": [], "usage": usage}
                yield b"data: " + orjson.dumps(body) + b"\n\n"
            yield b"data: [DONE]\n\n"

        return stream()

    # ----- running -------------------------------------------------------------------------------
    def start_background(self) -> "Gateway":
        self._thread = threading.Thread(target=lambda: self._uvicorn.run(sockets=[self.socket]), name="gateway-http",
                                        daemon=True)
        self._thread.start()
        deadline = time.monotonic() + 30
        while not self._uvicorn.started and time.monotonic() < deadline:
            time.sleep(0.01)
        return self

    def close(self) -> None:
        self._uvicorn.should_exit = True
        if self._thread is not None:
            self._thread.join(10)
        self.socket.close()
        self.batcher.close()

    def __enter__(self) -> "Gateway":
        return self.start_background()

    def __exit__(self, *exc: Any) -> None:
        self.close()


__all__ = ["Gateway", "RequestError"]
