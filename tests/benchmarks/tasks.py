"""The threadmill probe task of the latency benchmarks; module-level as django.tasks requires."""

import time

from django.tasks import task

from .probe import record_start


@task
def probe(token):
    started = time.time()
    record_start(token, started)
