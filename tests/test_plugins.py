"""agentrl.plugins.PluginRegistry: one discovery, even when threads look a plug-in up at once (the agent
threads of a rollout worker ask for their environment together)."""

from __future__ import annotations

import threading
import types

import pytest

from agentrl.plugins import PluginError, PluginRegistry


def test_threads_that_look_up_during_discovery_wait_for_it(tmp_path, monkeypatch):
    (tmp_path / "slow_plugins_home.py").write_text(
        "from agentrl.plugins import PluginRegistry\n"
        "REGISTRY = PluginRegistry('toy', key='toy.name', package='slow_plugins_pkg')\n")
    package = tmp_path / "slow_plugins_pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "sleepy.py").write_text(
        "import time\nimport types\nfrom slow_plugins_home import REGISTRY\n"
        "time.sleep(0.5)                       # a plug-in module that takes a while to import\n"
        "REGISTRY.register(types.SimpleNamespace(name='sleepy'))\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    from slow_plugins_home import REGISTRY

    start, found, errors = threading.Barrier(8), [], []

    def look_up() -> None:
        start.wait()
        try:
            found.append(REGISTRY.get("sleepy").name)
        except PluginError as err:
            errors.append(str(err))

    threads = [threading.Thread(target=look_up) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert errors == [] and found == ["sleepy"] * 8


def test_an_unknown_name_lists_what_was_found():
    registry = PluginRegistry("toy", key="toy.name")
    registry.register(types.SimpleNamespace(name="alpha"))
    with pytest.raises(PluginError, match=r"unknown toy toy.name='alpah'; did you mean alpha\?"):
        registry.get("alpah")
