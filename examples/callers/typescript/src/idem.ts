// Run a unit of work once per key through `idem serve`, from TypeScript on
// Node (global `fetch`, Node 18+).
//
//   const idem = new Idem("http://127.0.0.1:7700");
//   const receipt = await idem.once("payments", "order-42", () => chargeCard(42));
//
// `once` claims the key (`begin`); the first caller runs the work while the
// lease is renewed on a timer (`extend`), stores its result (`complete`) and
// returns it. A caller that arrives while the work runs waits as told
// (`retry_after_ms`) and returns the stored result; so does every later
// one. Work that throws releases the key (`release`), so the next delivery
// runs it again.

export class IdemError extends Error {}

type Begin =
  | { status: "acquired"; token: number; lease_expires_at_ms: number; attempt: number }
  | { status: "in_progress"; retry_after_ms: number }
  | { status: "completed"; outcome: unknown; completed_at_ms: number }
  | { status: "mismatch" };

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

export class Idem {
  constructor(
    private readonly url: string,
    private readonly leaseMs = 30_000,
    private readonly waitMs = 120_000,
  ) {}

  /** POSTs `body` to `op`; `null` for 409 (the token is stale). */
  private async post<T>(ns: string, op: string, body: object): Promise<T | null> {
    const r = await fetch(`${this.url.replace(/\/$/, "")}/v1/${ns}/${op}`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify(body),
      signal: AbortSignal.timeout(10_000),
    });
    if (r.status === 409) return null;
    if (r.status !== 200) throw new IdemError(`${op}: ${r.status} ${await r.text()}`);
    return (await r.json()) as T;
  }

  async once<T>(ns: string, key: string, work: () => Promise<T>, fingerprint?: string): Promise<T> {
    const deadline = Date.now() + this.waitMs;
    for (;;) {
      const b = await this.post<Begin>(ns, "begin", { key, fingerprint, lease_ms: this.leaseMs });
      if (b === null) throw new IdemError("begin answered 409");
      switch (b.status) {
        case "completed":
          return b.outcome as T;
        case "mismatch":
          throw new IdemError(`${key}: the same key was used for a different request`);
        case "in_progress":
          if (Date.now() > deadline) throw new IdemError(`${key}: still in progress`);
          await sleep(b.retry_after_ms);
          continue;
        case "acquired":
          return this.run(ns, key, b.token, work);
      }
    }
  }

  private async run<T>(ns: string, key: string, token: number, work: () => Promise<T>): Promise<T> {
    let lost = false;
    // Extend at a third of the lease, so two renewals can fail before it
    // runs out.
    const renew = setInterval(() => {
      this.post(ns, "extend", { key, token, lease_ms: this.leaseMs })
        .then((r) => {
          if (r === null) lost = true;
        })
        .catch(() => {}); // try again at the next tick
    }, this.leaseMs / 3);
    let outcome: T;
    try {
      outcome = await work();
    } catch (e) {
      clearInterval(renew);
      await this.post(ns, "release", { key, token });
      throw e;
    }
    clearInterval(renew);
    if (lost || (await this.post(ns, "complete", { key, token, outcome })) === null) {
      throw new IdemError(`${key}: the lease was lost before the result was stored`);
    }
    return outcome;
  }
}
