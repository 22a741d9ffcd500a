"""Threadmill's benchmark tasks, the latency probe and the fairness nap; module-level as django.tasks requires."""

import time

from django.tasks import task

from . import naps
from .probe import record_start


@task
def probe(token):
    started = time.time()
    record_start(token, started)


@task
def nap(token, seconds):
    naps.nap(token, seconds)
