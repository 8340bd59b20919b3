"""An HTTP handler for `idem consume`, in Python's standard library.

    python3 handler.py 8081 effects.jsonl
    idem consume --from 'redis://127.0.0.1:6379?stream=orders&group=shipping' \
        --key json:/order_id --to http://127.0.0.1:8081/

idem consume POSTs each message with `Idempotency-Key`, `Idem-Fencing-Token`
and `Idem-Attempt`. The handler does the work and answers 2xx when it is
done (idem stores the answer and acks), 4xx to refuse the message for good
(dead letter), 5xx or 429 to have it retried (`Retry-After` is honoured).

The write here is fenced: it is refused (409, retried) when a higher token
was already written for the key, so a holder whose lease ran out cannot
overwrite the one that took over.

With `idem consume --batch N` a request carries `Idem-Batch: COUNT` and a
JSON array of messages, each `{"key", "token", "attempt", "headers",
"body"}`; the answer is `{"results": [{"key", "status", "outcome"}]}`, one
result per message, each settled by its own status.
"""

import json
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

port, path = int(sys.argv[1]), sys.argv[2]
lock = threading.Lock()
highest = {}


def apply(key, token, body):
    """The fenced write: 200 when done, 409 when a later holder wrote."""
    with lock:
        if highest.get(key, 0) > token:
            return 409
        highest[key] = token
        with open(path, "a") as effects:
            effects.write(json.dumps({"key": key, "token": token,
                                      "body": body}) + "\n")
    return 200


class Handler(BaseHTTPRequestHandler):
    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("content-length", 0)))
        if self.headers.get("idem-batch"):
            results = []
            for item in json.loads(body):
                status = apply(item["key"], item["token"], item["body"])
                results.append({"key": item["key"], "status": status,
                                "outcome": {"handled": item["key"]}})
            self.answer(200, {"results": results})
            return
        key = self.headers["idempotency-key"]
        status = apply(key, int(self.headers["idem-fencing-token"]),
                       body.decode())
        self.answer(status, {"handled": key})

    def answer(self, status, value):
        answer = json.dumps(value).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)

    def log_message(self, *args):
        pass


print(f"listening on {port}", flush=True)
ThreadingHTTPServer(("127.0.0.1", port), Handler).serve_forever()
