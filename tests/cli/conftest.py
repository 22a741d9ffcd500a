"""The command-line tests start real worker pools with the worker tests' fixture."""

from tests.worker.conftest import start_worker  # noqa: F401 - a fixture, found by name
