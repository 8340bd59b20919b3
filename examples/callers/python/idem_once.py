"""Run a unit of work once per key through `idem serve`, from Python.

    from idem_once import Idem
    idem = Idem("http://127.0.0.1:7700")
    receipt = idem.once("payments", "order-42", lambda: charge_card(42))

`once` claims the key (`begin`); the first caller runs the work while the
lease is renewed in the background (`extend`), stores its result
(`complete`) and returns it. A caller that arrives while the work runs waits
as told (`retry_after_ms`) and returns the stored result; so does every
later one. Work that raises releases the key (`release`), so the next
delivery runs it again. Needs `httpx`.
"""

import json
import threading
import time

import httpx


class IdemError(Exception):
    """idem answered something this client cannot go on from."""


class Idem:
    def __init__(self, url, lease_ms=30_000, timeout_s=10.0, wait_s=120.0):
        self.http = httpx.Client(base_url=url.rstrip("/"), timeout=timeout_s)
        self.lease_ms = lease_ms
        self.wait_s = wait_s

    def _post(self, ns, op, body):
        r = self.http.post(f"/v1/{ns}/{op}", json=body)
        if r.status_code == 409:
            return None  # stale: the lease ran out and someone took over
        if r.status_code == 503:
            raise IdemError(f"store unavailable; retry after {r.headers.get('retry-after')} s")
        if r.status_code != 200:
            raise IdemError(f"{op}: {r.status_code} {r.text}")
        return r.json()

    def once(self, ns, key, work, fingerprint=None):
        body = {"key": key, "lease_ms": self.lease_ms}
        if fingerprint is not None:
            body["fingerprint"] = fingerprint
        deadline = time.monotonic() + self.wait_s
        while True:
            b = self._post(ns, "begin", body)
            status = b["status"]
            if status == "completed":
                return b["outcome"]
            if status == "mismatch":
                raise IdemError(f"{key}: the same key was used for a different request")
            if status == "in_progress":
                if time.monotonic() > deadline:
                    raise IdemError(f"{key}: still in progress after {self.wait_s} s")
                time.sleep(b["retry_after_ms"] / 1000)
                continue
            return self._run(ns, key, b["token"], work)

    def _run(self, ns, key, token, work):
        stop = threading.Event()
        lost = threading.Event()

        def renew():
            # Extend at a third of the lease, so two renewals can fail
            # before the lease runs out.
            while not stop.wait(self.lease_ms / 3000):
                try:
                    if self._post(ns, "extend", {"key": key, "token": token,
                                                 "lease_ms": self.lease_ms}) is None:
                        lost.set()
                        return
                except (httpx.HTTPError, IdemError):
                    pass  # try again at the next tick

        renewer = threading.Thread(target=renew, daemon=True)
        renewer.start()
        try:
            outcome = work()
        except BaseException:
            stop.set()
            renewer.join()
            self._post(ns, "release", {"key": key, "token": token})
            raise
        stop.set()
        renewer.join()
        if lost.is_set() or self._post(
            ns, "complete", {"key": key, "token": token, "outcome": outcome}
        ) is None:
            raise IdemError(f"{key}: the lease was lost before the result was stored")
        return outcome


if __name__ == "__main__":
    import sys

    idem = Idem(sys.argv[1] if len(sys.argv) > 1 else "http://127.0.0.1:7700")
    print(json.dumps(idem.once("demo", "hello", lambda: {"greeting": "hello, once"})))
