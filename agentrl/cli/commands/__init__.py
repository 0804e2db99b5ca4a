"""One module per ``agentrl`` command.

A command module defines ``HELP`` (one line), ``add_arguments(parser)`` and ``run(args) -> int``.
The module's name is the command's name (``_`` becomes ``-``); :mod:`agentrl.cli.main` finds the
modules itself, so adding a command is adding a file.
"""
