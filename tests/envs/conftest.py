"""The environment tests' small environment that fails on request, registered for every test here."""

from flaky_env import FlakyEnv, make_flaky_env  # noqa: F401  (importing it registers ``test-flaky``)
