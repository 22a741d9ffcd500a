"""The soak: N minutes of mixed load on two worker pools while faults fire at random.

Run it with `python -m tests.soak --minutes 30` (see the README's Soak section). It is not
part of the test suite: no module here is collected by pytest. Every start and finish of a
task is counted on a second server that no fault touches; the verdict (verdict.py) compares
what was enqueued, what the server holds and what really ran.
"""
