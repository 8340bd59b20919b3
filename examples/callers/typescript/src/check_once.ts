// Checks Idem against a running `idem serve`: eight callers of one key run
// the work once and all get its result; work longer than the lease keeps
// its claim by renewing it; work that fails releases the key, so the next
// call runs it again.
//
//   node dist/check_once.js http://127.0.0.1:7700

import { randomUUID } from "node:crypto";
import { strict as assert } from "node:assert";
import { Idem } from "./idem.js";

const idem = new Idem(process.argv[2], 300); // shorter than the work
const key = `ts-${randomUUID()}`;
let runs = 0;
const work = async () => {
  runs += 1;
  await new Promise((resolve) => setTimeout(resolve, 1000));
  return { receipt: `r-${runs}` };
};
const results = await Promise.all(Array.from({ length: 8 }, () => idem.once("callers", key, work)));
assert.equal(runs, 1, `the work ran ${runs} times`);
for (const r of results) assert.deepEqual(r, { receipt: "r-1" });

const other = `ts-${randomUUID()}`;
await assert.rejects(idem.once("callers", other, async () => { throw new Error("card declined"); }), /declined/);
assert.equal(await idem.once("callers", other, async () => "second try"), "second try");
assert.equal(await idem.once("callers", other, async () => "third try"), "second try");
console.log("typescript: ok");
