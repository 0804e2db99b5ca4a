"""Errors that reach the user as one line and exit code 2 (bad input, never a crash)."""


class UsageError(Exception):
    """A problem with what the user asked for: names the problem and the fix.

    The CLI prints ``agentrl: error: <message>`` and exits with code 2, without a traceback.
    """

    exit_code = 2
