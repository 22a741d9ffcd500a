"""Threadmill's benchmark tasks, the latency probe and the fairness nap; module-level as django.tasks requires."""

import time

from django.tasks import task

from . import naps
from .graph_stamps import record_join
from .probe import record_start


@task
def probe(token):
    started = time.time()
    record_start(token, started)


@task
def nap(token, seconds):
    naps.nap(token, seconds)


@task
def span(index):
    """A workflow benchmark's step: return when it started and ended (epoch seconds); the result is stored."""
    return [time.time(), time.time()]


@task
def join(*parents):
    """A workflow benchmark's join: record when it started (`graph_stamps.record_join`)."""
    record_join(time.time())
