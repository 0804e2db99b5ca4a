"""Denormal floats are flushed in every torch thread of an agentrl process (agentrl.runtime.denormals).

Each case runs in a fresh interpreter: whether torch's threads flush depends on what ran before
them, which in the pytest process is every earlier test."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

PROBE = "import json, torch; x = torch.full((2 * 65536,), 1e-30); "


def run_python(code: str, **env: str) -> str:
    full_env = {k: v for k, v in os.environ.items() if k != "AGENTRL_KEEP_DENORMALS"}
    full_env.update(env)
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          env=full_env, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip().splitlines()[-1]


def test_flushed_before_torch_threads_start_reaches_every_thread():
    out = run_python("""
        import json, torch
        torch.set_num_threads(2)
        from agentrl.runtime.denormals import flush_denormals, denormals_flushed
        ok = flush_denormals()
        x = torch.full((4 * 65536,), 1e-30)
        print(json.dumps([ok, denormals_flushed(), int(torch.count_nonzero(x * 1e-10))]))
    """)
    assert json.loads(out) == [True, True, 0]


def test_flushed_after_threads_started_reaches_only_some_and_the_trainer_check_warns():
    out = run_python("""
        import json, warnings, torch
        torch.set_num_threads(2)
        x = torch.full((4 * 65536,), 1e-30)
        before = int(torch.count_nonzero(x * 1e-10))     # starts torch's second thread, flushing off
        from agentrl.runtime.denormals import flush_denormals, warn_unless_flushed
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            warn_unless_flushed()
            ok = flush_denormals()
            after = int(torch.count_nonzero(x * 1e-10))
            warn_unless_flushed()
        print(json.dumps([before, ok, 0 < after < before, [str(w.message) for w in caught]]))
    """)
    before, ok, partly, messages = json.loads(out)
    assert before == 4 * 65536 and ok is False and partly
    assert len(messages) == 2 and all("before any torch work" in m and "AGENTRL_KEEP_DENORMALS" in m for m in messages)


def test_trainer_check_is_silent_when_flushed_or_kept():
    code = """
        import json, os, warnings
        from agentrl.runtime.denormals import flush_denormals, warn_unless_flushed
        if not os.environ.get("AGENTRL_KEEP_DENORMALS"):
            flush_denormals()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            warn_unless_flushed()
        print(json.dumps(len(caught)))
    """
    assert json.loads(run_python(code)) == 0
    assert json.loads(run_python(code, AGENTRL_KEEP_DENORMALS="1")) == 0


def test_keep_denormals_leaves_ieee_gradual_underflow():
    out = run_python("""
        import json, torch
        from agentrl.runtime.denormals import flush_denormals, denormals_flushed
        print(json.dumps([flush_denormals(), denormals_flushed(), float(torch.tensor(1e-30) * 1e-10)]))
    """, AGENTRL_KEEP_DENORMALS="1")
    ok, flushed, value = json.loads(out)
    assert ok is False and flushed is False and value == pytest.approx(1e-40, rel=1e-3)


@pytest.mark.parametrize("argv, flushes", [(["export"], True), (["train"], True), (["sft"], True), (["eval"], True),
                                           (["bench", "learner"], True), (["recipes"], False), (["table"], False)])
def test_cli_flushes_before_commands_that_compute(argv, flushes):
    """`agentrl <command>` flushes before the command runs when it computes with torch, and leaves
    the others' floats as they are."""
    out = run_python(f"""
        import json, sys
        import agentrl.cli.commands.{argv[0]} as module
        def run(args):
            torch = sys.modules.get("torch")
            from agentrl.runtime.denormals import denormals_flushed
            print(json.dumps([torch is not None and denormals_flushed()]))
            return 0
        module.run = run
        from agentrl.cli.main import main
        main({argv!r})
    """)
    assert json.loads(out) == [flushes]
