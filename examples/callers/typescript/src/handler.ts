// An HTTP handler for `idem consume`, on Node's `http` module.
//
//   node dist/handler.js 8082 effects.jsonl
//   idem consume --from 'redis://127.0.0.1:6379?stream=orders&group=shipping' \
//       --key json:/order_id --to http://127.0.0.1:8082/
//
// idem consume POSTs each message with `Idempotency-Key`,
// `Idem-Fencing-Token` and `Idem-Attempt`. Answer 2xx when the work is done
// (idem stores the answer and acks), 4xx to refuse the message for good
// (dead letter), 5xx or 429 to have it retried (`Retry-After` is honoured).
// The write here is fenced: refused (409, retried) when a higher token was
// already written for the key.

import { appendFileSync } from "node:fs";
import { createServer } from "node:http";

const [port, path] = [Number(process.argv[2]), process.argv[3]];
const highest = new Map<string, number>();

createServer((req, res) => {
  const chunks: Buffer[] = [];
  req.on("data", (c: Buffer) => chunks.push(c));
  req.on("end", () => {
    const key = String(req.headers["idempotency-key"]);
    const token = Number(req.headers["idem-fencing-token"]);
    if ((highest.get(key) ?? 0) > token) {
      res.writeHead(409).end();
      return;
    }
    highest.set(key, token);
    appendFileSync(path, JSON.stringify({ key, token, body: Buffer.concat(chunks).toString() }) + "\n");
    res.writeHead(200, { "content-type": "application/json" }).end(JSON.stringify({ handled: key }));
  });
}).listen(port, "127.0.0.1", () => console.log(`listening on ${port}`));
