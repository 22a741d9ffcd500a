"""Fill the workflow benchmark's queue: `python -m tests.benchmarks.graph_fill SYSTEM SHAPE WIDTH`.

Run in its own process per fill, so each system gets its own settings and broker client, as the
drain's filler does. Shapes: `plain` (WIDTH independent steps, threadmill only: the baseline),
`fan` (a root, WIDTH steps after it, a join after them: threadmill only, since the peers' fan-in
has no root), `group` (WIDTH steps and a join after them: celery's chord, dramatiq's group with a
completion callback, a threadmill workflow) and `chain` (WIDTH steps one after another, threadmill).
Prints one JSON line: the seconds the enqueue call took (a workflow's includes its read-back) and,
for threadmill, the workflow id.
"""

from __future__ import annotations

import json
import sys
import time


def threadmill_fill(shape: str, width: int) -> dict:
    import django

    django.setup()
    from django.tasks import task_backends

    from threadmill.workflows import Workflow

    from .tasks import join, span

    started = time.perf_counter()
    if shape == "plain":
        task_backends["default"].enqueue_many(span, [((i,), {}) for i in range(width)])
        return {"enqueue_s": time.perf_counter() - started, "workflow": None}
    wf = Workflow(name=f"bench {shape} {width}")
    if shape == "chain":
        step = None
        for i in range(width):
            step = wf.add(span, (i,), after=[step] if step else [])
    else:
        root = [wf.add(span, ("root",))] if shape == "fan" else []
        steps = [wf.add(span, (i,), after=root) for i in range(width)]
        wf.add(join, after=steps, name="join")
    run = wf.enqueue()
    return {"enqueue_s": time.perf_counter() - started, "workflow": run.id}


def peer_fill(system: str, width: int) -> dict:
    if system == "celery":
        from .peers.celery_graph_app import enqueue_fan_in
    else:
        from .peers.dramatiq_graph_app import enqueue_fan_in
    started = time.perf_counter()
    enqueue_fan_in(width)
    return {"enqueue_s": time.perf_counter() - started, "workflow": None}


def main() -> None:
    system, shape, width = sys.argv[1], sys.argv[2], int(sys.argv[3])
    figures = threadmill_fill(shape, width) if system == "threadmill" else peer_fill(system, width)
    print(json.dumps(figures), flush=True)


if __name__ == "__main__":
    main()
