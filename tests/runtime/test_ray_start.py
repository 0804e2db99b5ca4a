"""A local Ray start that times out (a busy machine) is retried, and its stray processes killed.

Ray's own timeout cannot be provoked on demand, so ``ray.init`` is replaced by a function that
behaves like a timed-out start: it spawns a real child process (the half-started GCS/raylet) and
raises the exception Ray raises.
"""

from __future__ import annotations

import subprocess
import sys

import pytest
import ray

from agentrl.runtime import ray_start
from agentrl.runtime.ray_start import RayStartError, init_local_ray

TIMEOUT = Exception("The current node timed out during startup. This could happen because some of the "
                    "raylet failed to startup or the GCS has become overloaded.")


class FlakyInit:
    """``ray.init`` that times out ``failures`` times, leaving a live child process each time."""

    def __init__(self, failures: int, error: Exception = TIMEOUT):
        self.failures = failures
        self.error = error
        self.calls: list[dict] = []
        self.strays: list[subprocess.Popen] = []

    def __call__(self, **kwargs):
        self.calls.append(kwargs)
        if len(self.calls) <= self.failures:
            self.strays.append(subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"]))
            raise self.error


@pytest.fixture
def flaky(monkeypatch):
    def install(failures: int, error: Exception = TIMEOUT) -> FlakyInit:
        fake = FlakyInit(failures, error)
        monkeypatch.setattr(ray, "init", fake)
        monkeypatch.setattr(ray, "is_initialized", lambda: False)
        return fake
    yield install


def _reap(fake: FlakyInit) -> None:
    for proc in fake.strays:
        if proc.poll() is None:
            proc.kill()
        proc.wait()


def test_a_timed_out_start_is_retried_after_killing_its_processes(flaky):
    fake = flaky(failures=2)
    messages: list[str] = []
    try:
        init_local_ray(3, attempts=3, wait_s=0.0, log=messages.append)
        assert len(fake.calls) == 3
        assert all(call["num_cpus"] == 3 for call in fake.calls)
        # each failed attempt's stray process was killed before the next attempt
        assert [p.poll() is not None for p in fake.strays] == [True, True]
        assert len(messages) == 2 and "attempt 1 of 3" in messages[0] and "1 half-started" in messages[0]
    finally:
        _reap(fake)


def test_every_attempt_timing_out_names_the_load_and_the_fix(flaky):
    fake = flaky(failures=5)
    try:
        with pytest.raises(RayStartError) as info:
            init_local_ray(2, attempts=2, wait_s=0.0, log=lambda m: None)
        text = str(info.value)
        assert "load average" in text and "2 times" in text
        assert "RAY_ADDRESS" in text and "ray start --head" in text and "concurrency" in text
        assert len(fake.calls) == 2 and all(p.poll() is not None for p in fake.strays)
    finally:
        _reap(fake)


def test_other_start_errors_are_not_retried(flaky):
    fake = flaky(failures=1, error=ValueError("bad num_cpus"))
    try:
        with pytest.raises(ValueError, match="bad num_cpus"):
            init_local_ray(2, attempts=3, wait_s=0.0, log=lambda m: None)
        assert len(fake.calls) == 1
    finally:
        _reap(fake)


def test_retry_waits_grow(flaky, monkeypatch):
    fake = flaky(failures=2)
    pauses: list[float] = []
    monkeypatch.setattr(ray_start.time, "sleep", pauses.append)
    try:
        init_local_ray(2, attempts=3, wait_s=5.0, log=lambda m: None)
        assert pauses == [5.0, 10.0]
    finally:
        _reap(fake)
