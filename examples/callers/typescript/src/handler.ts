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
//
// With `idem consume --batch N` a request carries `Idem-Batch: COUNT` and a
// JSON array of messages, each {key, token, attempt, headers, body}; the
// answer is {results: [{key, status, outcome}]}, one result per message,
// each settled by its own status.

import { appendFileSync } from "node:fs";
import { createServer } from "node:http";

const [port, path] = [Number(process.argv[2]), process.argv[3]];
const highest = new Map<string, number>();

// The fenced write: 200 when done, 409 when a later holder wrote.
function apply(key: string, token: number, body: unknown): number {
  if ((highest.get(key) ?? 0) > token) return 409;
  highest.set(key, token);
  appendFileSync(path, JSON.stringify({ key, token, body }) + "\n");
  return 200;
}

interface BatchItem {
  key: string;
  token: number;
  body: unknown;
}

createServer((req, res) => {
  const chunks: Buffer[] = [];
  req.on("data", (c: Buffer) => chunks.push(c));
  req.on("end", () => {
    const body = Buffer.concat(chunks).toString();
    const json = { "content-type": "application/json" };
    if (req.headers["idem-batch"]) {
      const results = (JSON.parse(body) as BatchItem[]).map((item) => ({
        key: item.key,
        status: apply(item.key, item.token, item.body),
        outcome: { handled: item.key },
      }));
      res.writeHead(200, json).end(JSON.stringify({ results }));
      return;
    }
    const key = String(req.headers["idempotency-key"]);
    const status = apply(key, Number(req.headers["idem-fencing-token"]), body);
    res.writeHead(status, json).end(JSON.stringify({ handled: key }));
  });
}).listen(port, "127.0.0.1", () => console.log(`listening on ${port}`));
