"""What one gateway request may cost, and the episode's close: a body over the cap is refused unread
(413), too many messages or characters before any prompt is built, a prompt over the token limit as
soon as the count passes it; a call still running when its episode closes is refused, not recorded
after the engine read the steps (the race made deterministic); cut prompts and lost system messages
are counted. The backend is a labelled test backend (fixed ids, not a model)."""

from __future__ import annotations

import json
import socket
import threading
import time

import pytest
import urllib3

from agentrl.gateway.server import Gateway
from agentrl.models import train_tokenizer
from agentrl.generation.base import Generation, GenerationBackend

CORPUS = ["You craft items in Minecraft. Goal: craft a stick. Inventory: oak planks, sticks, crafting table."] * 20


class FixedBackend(GenerationBackend):
    """Test-only backend: every prompt gets the same few ids; ``hold`` (an Event) makes a call wait."""

    name = "fixed (test only)"

    def __init__(self, ids: list[int]):
        self.ids, self.calls = ids, 0
        self.entered, self.hold = threading.Event(), None

    def generate(self, prompt_ids, sampling):
        self.calls += 1
        self.entered.set()
        if self.hold is not None:
            self.hold.wait(10)
        return [Generation(list(self.ids), [-0.5] * len(self.ids), "stop") for _ in prompt_ids]

    def load_weights(self, state_dict):
        raise NotImplementedError("the fixed test backend has no weights")


@pytest.fixture(scope="module")
def tokenizer():
    return train_tokenizer(CORPUS, vocab_size=300)


@pytest.fixture
def gateway(tokenizer):
    backend = FixedBackend(tokenizer("ok", add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id])
    with Gateway(backend, tokenizer, max_model_len=600, default_max_tokens=8, batch_wait_s=0.0,
                 max_prompt_tokens=500, max_body_bytes=64 << 10, max_messages=16, max_prompt_chars=20_000) as served:
        yield served


def chat(gateway: Gateway, key: str, body: dict | bytes, timeout: float = 10) -> tuple[int, dict]:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    response = urllib3.request("POST", f"{gateway.base_url}/chat/completions", body=data, timeout=timeout,
                               retries=False, headers={"Authorization": f"Bearer {key}",
                                                       "Content-Type": "application/json"})
    return response.status, response.json()


def user(text: str) -> dict:
    return {"role": "user", "content": text}


def test_a_body_over_the_cap_is_refused_unread(gateway):
    episode = gateway.open_episode()
    with socket.create_connection(("127.0.0.1", gateway.port), timeout=5) as sock:
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + episode.key.encode()
                     + b"\r\nContent-Type: application/json\r\nContent-Length: 67108864\r\n\r\n{\"messages\": [")
        reply = b""
        while chunk := sock.recv(65536):          # answered without the 64 MiB, and closed
            reply += chunk
    head, _, body = reply.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 413") and b"connection: close" in head.lower()
    assert json.loads(body)["error"]["code"] == "request_too_large" and "65536" in json.loads(body)["error"]["message"]
    assert gateway.batcher.backend.calls == 0
    # sent in chunks without a Content-Length, it is cut off at the cap too
    status, reply = chat(gateway, gateway.open_episode().key, b'{"messages": [' + b" " * (80 << 10) + b"]}")
    assert status == 413 and reply["error"]["code"] == "request_too_large"


@pytest.mark.parametrize("messages, fragment", [
    ([user("hi")] * 17, "17 messages, more than the 16"),
    ([user("x" * 40_000)], "40000 characters, more than the 20000"),
])
def test_too_many_messages_or_characters_are_refused_before_any_prompt_is_built(gateway, monkeypatch, messages,
                                                                               fragment):
    def never(*args, **kwargs):
        raise AssertionError("the prompt was built")

    monkeypatch.setattr(gateway.renderer, "prompt", never)
    episode = gateway.open_episode()
    status, reply = chat(gateway, episode.key, {"model": "m", "messages": messages})
    assert status == 400 and reply["error"]["code"] == "context_length_exceeded" and fragment in reply["error"]["message"]
    assert "context_length_exceeded" in gateway.close_episode(episode.key).failure


def test_a_prompt_over_the_token_limit_is_refused_before_it_is_all_tokenized(gateway, monkeypatch):
    segments = []
    tokenize = gateway.renderer._ids
    monkeypatch.setattr(gateway.renderer, "_ids", lambda text: segments.append(text) or tokenize(text))
    messages = [user("Goal: craft a stick from oak planks. " * 12) for _ in range(12)]    # ~12 x 100 tokens
    status, reply = chat(gateway, gateway.open_episode().key, {"model": "m", "messages": messages})
    assert status == 400 and "more than 500 tokens" in reply["error"]["message"]
    assert len(segments) < 12         # it stopped as soon as the count passed the limit


def test_a_call_running_when_its_episode_closes_is_refused_not_recorded(gateway):
    backend = gateway.batcher.backend
    backend.hold = threading.Event()
    episode = gateway.open_episode()
    replies = []
    call = threading.Thread(target=lambda: replies.append(chat(gateway, episode.key, {"messages": [user("hi")]})))
    call.start()
    assert backend.entered.wait(5)            # the call is in the engine
    closed = gateway.close_episode(episode.key)
    steps_at_close = len(closed.steps)
    backend.hold.set()                        # the engine answers after the close
    call.join(10)
    assert steps_at_close == 0 and len(closed.steps) == 0
    status, reply = replies[0]
    assert status == 400 and reply["error"]["code"] == "episode_closed"


def test_cut_prompts_and_lost_system_messages_are_counted(tokenizer):
    backend = FixedBackend(tokenizer("ok", add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id])
    with Gateway(backend, tokenizer, max_model_len=200, default_max_tokens=8, batch_wait_s=0.0,
                 max_prompt_tokens=120, prompt_truncation="left") as gateway:
        short_system = [{"role": "system", "content": "Craft."}, user("Goal: craft a stick. " * 30)]
        long_system = [{"role": "system", "content": "You craft items. " * 40}, user("Goal: craft a stick.")]
        for messages in (short_system, long_system, [user("hi")]):
            assert chat(gateway, gateway.open_episode().key, {"messages": messages})[0] == 200
        assert gateway.truncated_prompts == 2 and gateway.dropped_system_messages == 1


def test_health_is_answered_and_heads_are_capped_on_the_gateway(gateway):
    with socket.create_connection(("127.0.0.1", gateway.port), timeout=5) as sock:
        try:
            sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nX-Pad: " + b"a" * (1 << 20))
        except (BrokenPipeError, ConnectionResetError):
            pass
        reply = b""
        try:
            while chunk := sock.recv(65536):
                reply += chunk
        except ConnectionResetError:
            pass
    assert reply.startswith(b"HTTP/1.1 431") and b'"code":"http_431"' in reply
    start = time.monotonic()
    assert urllib3.request("GET", f"http://127.0.0.1:{gateway.port}/health", timeout=5).status == 200
    assert time.monotonic() - start < 1.0
