"""Settings for the cost budget: the test settings with the backend's OPTIONS at their defaults.

The test suite's settings shorten `poll_max_interval` and the lease; a budget of what the
default task path costs must count what a site gets out of the box (tests/test_cost_budget.py).
"""

from tests.settings import *

TASKS = {"default": {key: value for key, value in TASKS["default"].items() if key != "OPTIONS"}}
