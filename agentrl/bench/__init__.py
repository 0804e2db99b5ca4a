"""Benchmarks run by ``agentrl bench TARGET``: every benchmark of the project lives here.

One module per target (``estimators``, ``envs``, ``rollout``, ...; the module ``webshop_steps`` is the
target ``webshop-steps``). A module defines ``HELP``, ``add_arguments(parser)`` and
``run(args) -> int``; ``--json`` is added for every target and means: print one JSON object with the
numbers and nothing else on stdout.
"""
