"""One module per ``agentrl`` command.

A command module defines ``HELP`` (one line), ``add_arguments(parser)`` and ``run(args) -> int``.
The module's name is the command's name (``_`` becomes ``-``); :mod:`agentrl.cli.main` finds the
modules itself, so adding a command is adding a file.

A command imports what it runs inside ``run`` (and ``add_arguments``), not at module level: the CLI
imports every command module to list them in ``--help``, so a module-level import of torch, Ray or
transformers here would slow every command down, and a command that computes with torch must flush
denormal floats before torch starts its threads (``TORCH_COMPUTE``, :mod:`agentrl.cli.main`).
"""
