"""A worker process's CPU and memory readings agree with psutil's, which they stand in for on Linux."""

from __future__ import annotations

import time

import psutil

from threadmill.worker.usage import ProcessUsage


def test_resident_memory_is_what_psutil_reads():
    usage, process = ProcessUsage(), psutil.Process()
    ours, theirs = usage.rss_bytes(), process.memory_info().rss
    assert abs(ours - theirs) <= 1 << 20, (ours, theirs)


def test_cpu_percent_is_psutils_share_since_the_previous_reading():
    process = psutil.Process()
    process.cpu_percent(None)
    usage = ProcessUsage()
    spin_until = time.process_time() + 0.3
    while time.process_time() < spin_until:
        pass
    theirs, ours = process.cpu_percent(None), usage.cpu_percent()
    assert theirs > 0 and abs(ours - theirs) <= max(5.0, theirs / 10), (ours, theirs)
    time.sleep(0.2)  # an idle interval to read, not a synchronisation
    assert usage.cpu_percent() < 10
