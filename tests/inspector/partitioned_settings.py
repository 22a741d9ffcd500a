"""The test settings with the `default` alias in three partitions: the live console of the cursor-paging browser test."""

from tests.settings import *

TASKS = {"default": {**TASKS["default"], "OPTIONS": {**TASKS["default"]["OPTIONS"], "partitions": 3}}}
