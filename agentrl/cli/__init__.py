"""The ``agentrl`` command line. Commands live one per module in :mod:`agentrl.cli.commands`."""
