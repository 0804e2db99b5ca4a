"""Denormal floats on CPU: flushed to zero in every torch thread of every agentrl process.

Floats below 1.2e-38 in magnitude (denormals) take a slow microcode path on x86 CPUs. A trained
model's attention and its gradients produce them; random weights do not. On the ALFWorld tiny
recipe's warm start the learner's update ran at 10.2 k tokens/s with denormals and 15.2 k with
them flushed, the same speed as random weights (docs/benchmarks.md, "Learner"). Flushing changes
only values that small, far below anything a float32 or bfloat16 update can resolve.

``torch.set_flush_denormal`` sets the flush-to-zero bits of the calling thread only, and a thread
inherits them from the thread that creates it. torch creates its intra-op (OpenMP) threads at the
first parallel operation, so :func:`flush_denormals` must run before that in every process that
computes: the ``agentrl`` command (:mod:`agentrl.cli.main`), each Ray learner rank and rollout
worker, each spawned worker. Called later, only the calling thread flushes, and
:func:`flush_denormals` returns False. The ``Trainer`` built from Python does not change its
caller's floating-point state; it warns (:func:`warn_unless_flushed`) when a CPU learner would run
with denormals.

``AGENTRL_KEEP_DENORMALS=1`` keeps IEEE gradual underflow (e.g. to compare numbers bit for bit
with another framework), at the cost above. GPUs are not affected either way.
"""

from __future__ import annotations

import os
import warnings

KEEP_ENV = "AGENTRL_KEEP_DENORMALS"
# torch splits an elementwise operation into chunks of at least 32,768 elements (at::internal::GRAIN_SIZE)
_ELEMENTS_PER_THREAD = 65536


def keep_denormals() -> bool:
    """Whether the user asked to keep denormals (``AGENTRL_KEEP_DENORMALS`` set and not 0)."""
    return os.environ.get(KEEP_ENV, "").strip() not in ("", "0")


def flush_denormals() -> bool:
    """Flush denormals in this thread and the torch threads created after it; True when every
    torch thread of this process flushes now (False when kept on purpose, unsupported by the CPU,
    or torch's threads already existed)."""
    import torch

    if keep_denormals() or not torch.set_flush_denormal(True):
        return False
    return denormals_flushed()


def warn_unless_flushed() -> None:
    """A ``RuntimeWarning`` naming the fix when this process computes with denormals and the user did
    not ask for them. For library entry points (the ``Trainer``) that run in a user's process: they
    leave its floating-point state alone (e.g. hypothesis refuses to run with flushing on)."""
    if keep_denormals() or denormals_flushed():
        return
    warnings.warn("denormal floats are not flushed in this process, which can make a trained model's CPU update "
                  "~1.5x slower: call agentrl.runtime.denormals.flush_denormals() at the top of your script, before any "
                  "torch work, as the agentrl commands do (or set "
                  f"{KEEP_ENV}=1 to keep denormals on purpose)", RuntimeWarning, stacklevel=3)


def denormals_flushed() -> bool:
    """Whether every torch intra-op thread flushes denormals: one multiplication spread over all
    threads, whose products (1e-40) are denormal unless flushed."""
    import torch

    x = torch.full((max(1, torch.get_num_threads()) * _ELEMENTS_PER_THREAD,), 1e-30)
    return int(torch.count_nonzero(x * 1e-10)) == 0
