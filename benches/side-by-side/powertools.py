"""The side-by-side workload through AWS Powertools for Python's idempotency
with its Redis persistence layer: N keys, every tenth followed by a
duplicate of the key half way back in the stream, dealt to 64 threads as
idem's bench deals them to its tasks. A delivery is one call of an
`idempotent_function`; its first call stores "ok", a duplicate gets that
back. Prints one JSON line: {"name", "cycles_per_s", "p99_ms", "n", ...}.

    powertools.py [KEYS]     (Redis from IDEM_TEST_REDIS_URL)

Run by scripts/side-by-side, in a virtualenv with aws-lambda-powertools
and redis.
"""

import json
import os
import sys
import threading
import time
import uuid
import warnings
from importlib.metadata import version

import redis
from aws_lambda_powertools.utilities.idempotency import IdempotencyConfig, idempotent_function
from aws_lambda_powertools.utilities.idempotency.persistence.cache import CachePersistenceLayer

TASKS = 64
NAME = "Powertools (Python), Redis"


def stream(n):
    out = []
    for i in range(n):
        out.append(f"order-{i:010}")
        if i % 10 == 9:
            out.append(out[i // 2])
    return out


def deal(keys, tasks):
    """Round robin; a duplicate goes to the thread of its original."""
    parts = [[] for _ in range(tasks)]
    owner = {}
    for k in keys:
        task = owner.setdefault(k, len(owner) % tasks)
        parts[task].append(k)
    return parts


def main():
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 20_000
    url = os.environ.get("IDEM_TEST_REDIS_URL", "redis://127.0.0.1:6379")
    # One client: its connection pool is thread safe and grows to one
    # connection per thread.
    client = redis.Redis.from_url(url, decode_responses=True)
    client.ping()
    # CachePersistenceLayer is RedisCachePersistenceLayer under the name
    # Powertools now documents.
    # The alias carries the old name's deprecation warning, wrongly.
    warnings.filterwarnings("ignore", message="RedisCachePersistenceLayer will be removed")
    # Outside Lambda there is no remaining time to derive an in-progress
    # expiry from: Powertools warns, and keeps the claim until the record
    # expires.
    warnings.filterwarnings("ignore", message="Couldn't determine the remaining time left")
    layer = CachePersistenceLayer(client=client)
    # Records expire after ten minutes, so a run leaves nothing for long.
    config = IdempotencyConfig(expires_after_seconds=600)
    ran = [0]
    ran_lock = threading.Lock()

    @idempotent_function(
        data_keyword_argument="order",
        persistence_store=layer,
        config=config,
        key_prefix=f"sbs-{uuid.uuid4().hex[:12]}",
    )
    def process(order):
        with ran_lock:
            ran[0] += 1
        return "ok"

    parts = deal(stream(n), TASKS)
    times = [[] for _ in parts]
    errors = []

    def work(t):
        mine = times[t]
        try:
            for k in parts[t]:
                start = time.perf_counter()
                if process(order={"id": k}) != "ok":
                    raise RuntimeError(f"{k}: the stored outcome did not come back")
                mine.append(time.perf_counter() - start)
        except Exception as e:  # reported in the JSON line, not lost in a thread
            errors.append(f"{type(e).__name__}: {e}")

    threads = [threading.Thread(target=work, args=(t,)) for t in range(TASKS)]
    start = time.perf_counter()
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    elapsed = time.perf_counter() - start

    all_times = sorted(x for ts in times for x in ts)
    if errors:
        line = {"name": NAME, "error": errors[0]}
    elif ran[0] != n:
        line = {"name": NAME, "error": f"the function ran {ran[0]} times for {n} keys"}
    else:
        p99 = all_times[-(-len(all_times) * 99 // 100) - 1]
        line = {
            "name": NAME,
            "cycles_per_s": round(len(all_times) / elapsed),
            "p99_ms": round(p99 * 1e3, 3),
            "n": len(all_times),
            "acquired": ran[0],
            "duplicates": len(all_times) - ran[0],
            "version": version("aws-lambda-powertools"),
        }
    print(json.dumps(line), flush=True)


if __name__ == "__main__":
    main()
