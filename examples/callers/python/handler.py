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
"""

import json
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

port, path = int(sys.argv[1]), sys.argv[2]
lock = threading.Lock()
highest = {}


class Handler(BaseHTTPRequestHandler):
    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("content-length", 0)))
        key = self.headers["idempotency-key"]
        token = int(self.headers["idem-fencing-token"])
        with lock:
            if highest.get(key, 0) > token:
                self.send_response(409)
                self.end_headers()
                return
            highest[key] = token
            with open(path, "a") as effects:
                effects.write(json.dumps({"key": key, "token": token,
                                          "body": body.decode()}) + "\n")
        answer = json.dumps({"handled": key}).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)

    def log_message(self, *args):
        pass


print(f"listening on {port}", flush=True)
ThreadingHTTPServer(("127.0.0.1", port), Handler).serve_forever()
