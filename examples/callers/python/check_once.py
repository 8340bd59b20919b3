"""Checks idem_once against a running `idem serve`: eight callers of one key
run the work once and all get its result; work longer than the lease keeps
its claim by renewing it; work that fails releases the key, so the next
call runs it again.

    python3 check_once.py http://127.0.0.1:7700
"""

import sys
import threading
import time
import uuid

from idem_once import Idem

url = sys.argv[1]
idem = Idem(url, lease_ms=300)  # shorter than the work: renewals must hold it
key = f"py-{uuid.uuid4()}"
runs = []


def work():
    runs.append(1)
    time.sleep(1.0)
    return {"receipt": f"r-{len(runs)}"}


results = [None] * 8


def call(i):
    results[i] = idem.once("callers", key, work)


threads = [threading.Thread(target=call, args=(i,)) for i in range(8)]
for t in threads:
    t.start()
for t in threads:
    t.join()
assert len(runs) == 1, f"the work ran {len(runs)} times"
assert all(r == {"receipt": "r-1"} for r in results), results


def failing():
    raise RuntimeError("card declined")


other = f"py-{uuid.uuid4()}"
try:
    idem.once("callers", other, failing)
    raise AssertionError("the failure was swallowed")
except RuntimeError:
    pass
assert idem.once("callers", other, lambda: "second try") == "second try"
assert idem.once("callers", other, lambda: "third try") == "second try"
print("python: ok")
