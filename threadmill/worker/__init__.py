"""The worker pool: a supervisor forks worker processes, each a fetcher, consumers and a buffer.

`supervisor` runs the pool and the broker, `child` is a worker process's entry point,
`process` holds its threads, buffer and phases, with one module per concern mixed in (`fetcher`,
`consumer`, `trust`, `suspects`, `limits`, `aborts`), and `executor` runs one task.
"""
