"""The worker pool: a supervisor forks worker processes, each a fetcher, consumers and a buffer.

`supervisor` runs the pool and the broker, `child` is a worker process's entry point,
`process` holds its threads and buffer, `executor` runs one task.
"""
