"""Where one threadmill task's bytes go: its hash's fields, and what each candidate cut would save.

Every saving is measured, not estimated: one stored task hash is copied, with the cut made,
into a scratch database of the same server under the same key name, and `MEMORY USAGE`
(SAMPLES 0) of that copy is taken from that of an unchanged copy. Nothing here changes what
threadmill stores (a rolling deploy reads the stored layout); it lists candidates for a later one.
"""

from __future__ import annotations

import json
from typing import Any

import redis

#: Database the copies are written to; no system under test uses it.
SCRATCH_DB = 15
#: Members of the scratch sorted sets that price a shorter task id.
ID_SAMPLE = 10_000
#: Top-level fields of the task document (`data`) that hold their default until the task runs.
DATA_DEFAULTS: dict[str, Any] = {
    "status": "READY", "started_at": None, "last_attempted_at": None, "finished_at": None, "errors": [],
    "worker_ids": [],
}  # fmt: skip
#: Fields of the task's own description (`data["task"]`) at the `@task` defaults.
TASK_DEFAULTS: dict[str, Any] = {
    "priority": 0,
    "backend": "default",
    "context": False,
    "run_after": None,
    "retry": None,
}
#: Fields of the finished document (`result`) that repeat what `data` holds, unchanged by the run.
RESULT_REPEATS = ("task", "id", "args", "kwargs", "enqueued_at")


def compact(document: dict[str, Any]) -> bytes:
    return json.dumps(document, separators=(",", ":")).encode()


def data_without_repeats(data: bytes) -> bytes:
    """Return the task document without its id (the key holds it) and without the fields at their defaults."""
    document = json.loads(data)
    document.pop("id", None)
    document = {k: v for k, v in document.items() if DATA_DEFAULTS.get(k, object()) != v}
    document["task"] = {k: v for k, v in document["task"].items() if TASK_DEFAULTS.get(k, object()) != v}
    return compact(document)


def result_without_repeats(result: bytes) -> bytes:
    """Return the finished document without the fields `data` already holds."""
    return compact({k: v for k, v in json.loads(result).items() if k not in RESULT_REPEATS})


def cuts(fields: dict[bytes, bytes]) -> dict[str, dict[bytes, bytes]]:
    """Return the task hash as each candidate cut would store it (only the cuts that apply to it)."""
    variants = {"drop the `score` field (the segment's score repeats it)": _without(fields, b"score")}
    variants["drop the `queue` field (`data` names the queue)"] = _without(fields, b"queue")
    variants["`data` without its id and its fields at their defaults"] = {
        **fields, b"data": data_without_repeats(fields[b"data"])
    }  # fmt: skip
    if b"result" in fields:
        variants["`result` without what `data` holds (task, id, args, kwargs, enqueued_at)"] = {
            **fields, b"result": result_without_repeats(fields[b"result"])
        }  # fmt: skip
        variants["drop the `started_at` field (`result` and `attempts` hold it)"] = _without(fields, b"started_at")
        variants["drop the `attempts` record of a task that succeeded at its first attempt"] = _without(
            fields, b"attempts"
        )
    combined = dict(fields)
    for variant in variants.values():
        for name in fields.keys() - variant.keys():
            combined.pop(name, None)
        combined.update({k: v for k, v in variant.items() if v != fields[k]})
    variants["every cut above together"] = combined
    return variants


def _without(fields: dict[bytes, bytes], name: bytes) -> dict[bytes, bytes]:
    return {k: v for k, v in fields.items() if k != name}


def usage_of(scratch: redis.Redis, key: bytes, fields: dict[bytes, bytes]) -> int:
    """Return `MEMORY USAGE` of `fields` stored as a hash under `key` in the scratch database."""
    scratch.delete(key)
    scratch.hset(key, mapping=fields)
    usage = scratch.memory_usage(key, samples=0) or 0
    scratch.delete(key)
    return usage


def listpack_usage(scratch: redis.Redis, key: bytes, fields: dict[bytes, bytes]) -> tuple[int, str]:
    """Return `MEMORY USAGE` and encoding of `fields` with `hash-max-listpack-value` raised to fit every value."""
    setting = scratch.config_get("hash-max-listpack-value")["hash-max-listpack-value"]
    scratch.config_set("hash-max-listpack-value", max(len(v) for v in fields.values()) + 1)
    try:
        scratch.delete(key)
        scratch.hset(key, mapping=fields)
        usage, encoding = scratch.memory_usage(key, samples=0) or 0, scratch.object("encoding", key).decode()
        scratch.delete(key)
    finally:
        scratch.config_set("hash-max-listpack-value", setting)
    return usage, encoding


def id_member_saving(scratch: redis.Redis, id_length: int, shorter: int) -> float:
    """Return the bytes per member a sorted set of `ID_SAMPLE` ids saves with ids `shorter` characters long."""
    per_member = []
    for length in (id_length, shorter):
        pipe = scratch.pipeline(transaction=False)
        for start in range(0, ID_SAMPLE, 1000):
            pipe.zadd("ids", {f"{i:0{length}d}": i for i in range(start, start + 1000)})
        pipe.execute()
        per_member.append((scratch.memory_usage("ids", samples=0) or 0) / ID_SAMPLE)
        scratch.delete("ids")
    return round(per_member[0] - per_member[1], 1)


#: The fields a lease adds to a task hash and acknowledge deletes (`started_at` stays).
LEASE_FIELDS = (b"lease_worker", b"lease_started_at", b"lease_token")


def lease_report(client: redis.Redis, scratch: redis.Redis, key: bytes) -> dict[str, Any]:
    """Return a running task hash's field sizes and what its lease fields cost (`MEMORY USAGE` with and without)."""
    fields = client.hgetall(key)
    leased = usage_of(scratch, key, fields)
    return {
        "memory_usage": client.memory_usage(key, samples=0),
        "fields": {f.decode(): len(v) for f, v in fields.items()},
        "lease_fields_bytes": leased
        - usage_of(scratch, key, {k: v for k, v in fields.items() if k not in LEASE_FIELDS}),
    }


def task_hash_report(client: redis.Redis, scratch: redis.Redis) -> dict[str, Any]:
    """Return one stored task hash's `MEMORY USAGE`, encoding, field sizes, and the measured saving of each cut."""
    key = next(client.scan_iter(match="threadmill:*:task:*", count=1000))
    fields = client.hgetall(key)
    base = usage_of(scratch, key, fields)
    saving: dict[str, float] = {name: base - usage_of(scratch, key, v) for name, v in cuts(fields).items()}
    listpack, encoding = listpack_usage(scratch, key, fields)
    saving[f"server setting: hash-max-listpack-value above the longest value ({encoding} encoding)"] = base - listpack
    task_id = key.rsplit(b":", 1)[1]
    # A UUID as 22 base64 characters: the key name and one segment member each shorter by 14.
    saving["task id as 22 base64 characters, not 36: the key name"] = base - usage_of(scratch, key[:-14], fields)
    saving["task id as 22 base64 characters, not 36: its segment member"] = id_member_saving(scratch, len(task_id), 22)
    return {
        "memory_usage": client.memory_usage(key, samples=0),
        "encoding": client.object("encoding", key).decode(),
        "key_bytes": len(key),
        "fields": {f.decode(): len(v) for f, v in fields.items()},
        "cut_savings_bytes": saving,
    }
