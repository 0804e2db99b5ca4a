"""Benchmarks run by ``agentrl bench TARGET``.

One module per target (``estimators``, ``envs``, ``rollout``, ...). A module defines ``HELP``,
``add_arguments(parser)`` and ``run(args) -> int``; ``--json`` is added for every target and
means: print one JSON object with the numbers and nothing else on stdout.
"""
