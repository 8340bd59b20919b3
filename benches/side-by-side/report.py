"""Turns the JSON lines of scripts/side-by-side into the section of
BENCHMARKS.md between the side-by-side markers and the chart
docs/side-by-side.png. Only measured values are shown: a row whose every
run failed is shown as failed, with the reason its run gave.

    report.py RESULTS.jsonl --machine LINE --command CMD --keys N
              --powertools-keys N --tasks N --runs N
"""

import argparse
import datetime
import json
import math
import re
import statistics
from pathlib import Path

START = "<!-- side-by-side:start -->"
END = "<!-- side-by-side:end -->"
HEADING = "## Side by side: idem, raw Redis and PostgreSQL, and Powertools"
PEER = "Powertools (Python), Redis"

RAW_COLOUR = "#9a9a9a"
IDEM_COLOUR = "#2b6cb0"
PEER_COLOUR = "#dd6b20"


def colour(name):
    if name == PEER:
        return PEER_COLOUR
    if name.startswith("idem"):
        return IDEM_COLOUR
    return RAW_COLOUR


def load(path):
    """Rows in the order they first appear, with every run's line."""
    rows = {}
    for line in Path(path).read_text().splitlines():
        line = line.strip()
        if not line.startswith("{"):
            continue
        r = json.loads(line)
        rows.setdefault(r["name"], []).append(r)
    return rows


def summarise(name, runs):
    """The median of the measured runs, or the reason none was measured."""
    ok = [r for r in runs if "error" not in r]
    failed = [r for r in runs if "error" in r]
    if not ok:
        return {"name": name, "error": failed[0]["error"], "runs": len(runs)}
    out = {
        "name": name,
        "cycles_per_s": statistics.median(r["cycles_per_s"] for r in ok),
        "p99_ms": statistics.median(r["p99_ms"] for r in ok),
        "n": ok[0]["n"],
        "runs": len(runs),
        "measured": len(ok),
        "rates": [r["cycles_per_s"] for r in ok],
    }
    if failed:
        out["partly_failed"] = failed[0]["error"]
    if "version" in ok[0]:
        out["version"] = ok[0]["version"]
    return out


def rate(x):
    if x >= 1e6:
        return f"{x / 1e6:.2f} M"
    if x >= 1e3:
        return f"{x / 1e3:.1f} k"
    return f"{x:.0f}"


def ms(x):
    if x < 0.1:
        return f"{x:.3f}"
    return f"{x:.2f}" if x < 10 else f"{x:.1f}"


def ratio(x, peer):
    if peer is None:
        return "—"
    r = x / peer
    return f"{thousands(round(r))}×" if r >= 100 else f"{r:.1f}×"


def thousands(n):
    return f"{n:,}".replace(",", " ")


def short(reason, limit=90):
    reason = " ".join(reason.split())
    return reason if len(reason) <= limit else reason[: limit - 1] + "…"


def table(rows, peer_rate, runs):
    out = [
        "| row | deliveries | cycles/s | p99 ms | × Powertools |",
        "| --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        name = r["name"]
        if name == PEER and "version" in r:
            name += f" {r['version']}"
        if "error" in r:
            out.append(f"| {name} | — | failed: {short(r['error'], 200)} | — | — |")
            continue
        cycles = f"**{rate(r['cycles_per_s'])}**"
        if runs > 1:
            cycles += " (" + ", ".join(rate(x) for x in r["rates"]) + ")"
        if "partly_failed" in r:
            cycles += f"; {r['runs'] - r['measured']} of {r['runs']} runs failed: {short(r['partly_failed'])}"
        out.append(
            f"| {name} | {thousands(r['n'])} | {cycles} | {ms(r['p99_ms'])} | {ratio(r['cycles_per_s'], peer_rate)} |"
        )
    return "\n".join(out)


def section(args, rows, peer_rate):
    today = datetime.date.today().isoformat()
    runs = "one run" if args.runs == 1 else f"{args.runs} runs, medians (each run in brackets)"
    return f"""{START}
`{args.command}` on {today}, {runs}.
{args.machine}.

Every row: {thousands(args.keys)} keys, each tenth followed by a duplicate
of an earlier key (10 % more deliveries: 1 in 11 is a duplicate), and
{args.tasks} concurrent clients. A cycle is one delivery: claim the key and,
when claimed, record its completion with the outcome "ok"; a duplicate
finds the key completed (in the "claims only" rows, a cycle is the
claim alone, and a duplicate finds the key in progress). p99 is of each
delivery's time.

{table(rows, peer_rate, args.runs)}

![cycles per second, log scale](docs/side-by-side.png)

- Redis `SET NX` rows: `redis-benchmark -c {args.tasks}` sending
  `SET key x NX EX 600`, the raw claim with nothing recorded on
  completion, with random keys out of {thousands(args.keys)} (so about
  two in five repeat, not one in eleven). The second runs against a `redis-server` of
  the script's own with `--appendonly yes --appendfsync always`.
- PostgreSQL row: `pgbench -c {args.tasks}` running
  `benches/side-by-side/insert.sql`, the classic dedup statement
  (`INSERT … ON CONFLICT DO NOTHING`, one a delivery, 1 in 11 a repeat),
  again with nothing recorded on completion.
- idem rows: `crates/idem-tiered/benches/side_by_side.rs`, {args.tasks}
  Tokio tasks on the runtime's default workers, `begin` then `complete`
  (`begin_many` then `complete_many`, 256 keys a call, in the batched
  rows, where each delivery counts its batch's time). File store: a
  temporary directory, group commit (an fsync before each completion is
  acknowledged). PostgreSQL: a fresh table each run, which like pgbench's
  starts from 100 000 records the planner has read (`ANALYZE`), as a table
  in use would.
- Powertools: `benches/side-by-side/powertools.py`, an
  `idempotent_function` with the Redis persistence layer
  (`CachePersistenceLayer`, one shared `redis` client), {args.tasks}
  threads, on the same Redis as idem's Redis row; only
  {thousands(args.powertools_keys)} keys, as it runs at a few thousand a second.
{END}"""


def write_section(path, text):
    doc = Path(path).read_text()
    pattern = re.compile(re.escape(START) + ".*?" + re.escape(END), re.S)
    if pattern.search(doc):
        doc = pattern.sub(lambda _: text, doc, count=1)
    else:
        doc = doc.rstrip("\n") + f"\n\n{HEADING}\n\n{text}\n"
    Path(path).write_text(doc)


def chart(path, args, rows, peer_rate):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    names = [r["name"] for r in rows]
    measured = [r for r in rows if "error" not in r]
    top = max((r["cycles_per_s"] for r in measured), default=1e6)
    low = min((r["cycles_per_s"] for r in measured), default=1e3)
    left = 10 ** math.floor(math.log10(low) - 0.3)
    right = top * 2.5

    fig, ax = plt.subplots(figsize=(11, 0.55 * len(rows) + 2.2), dpi=110)
    ys = list(range(len(rows)))[::-1]
    labels = []
    for y, r in zip(ys, rows):
        if "error" in r:
            ax.text(left * 1.15, y, "failed: " + short(r["error"], 70), va="center",
                    color="#c53030", fontsize=9)
            continue
        x = r["cycles_per_s"]
        ax.barh(y, x - left, left=left, color=colour(r["name"]), height=0.62)
        label = f"{rate(x)}/s · p99 {ms(r['p99_ms'])} ms"
        if peer_rate and r["name"] != PEER:
            label += f" · {ratio(x, peer_rate)} Powertools"
        labels.append(ax.text(x * 1.12, y, label, va="center", fontsize=9, clip_on=False))
    ax.set_xscale("log")
    ax.set_xlim(left, right)
    ax.set_yticks(ys)
    ax.set_yticklabels(
        [n + (f"\n({thousands(args.powertools_keys)} keys)" if n == PEER else "") for n in names],
        fontsize=9.5,
    )
    ax.set_xlabel("cycles per second (log scale)")
    ax.grid(axis="x", which="major", color="#dddddd")
    ax.set_axisbelow(True)
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)
    # Across the whole figure, not only above the axis: the row names take
    # a third of the width.
    fig.suptitle(
        f"Claim + complete per delivery: {thousands(args.keys)} keys, 10 % duplicates, "
        f"{args.tasks} concurrent clients"
        + ("" if args.runs == 1 else f", median of {args.runs} runs")
        + f"\n{args.machine}",
        fontsize=10.5,
        x=0.01,
        ha="left",
    )
    ax.legend(
        handles=[
            Patch(color=RAW_COLOUR, label="raw Redis / PostgreSQL"),
            Patch(color=IDEM_COLOUR, label="idem"),
            Patch(color=PEER_COLOUR, label="AWS Powertools (Python)"),
        ],
        # Below the axis: inside it, it would cover the last rows' labels.
        loc="upper center",
        bbox_to_anchor=(0.5, -0.07),
        ncol=3,
        fontsize=9,
        frameon=False,
    )
    fig.tight_layout()
    # The value labels may run past the axis into the right margin: shrink
    # the axis until the longest one ends inside the figure.
    for _ in range(8):
        fig.canvas.draw()
        width = fig.get_window_extent().x1
        over = max((t.get_window_extent().x1 for t in labels), default=0) - (width - 8)
        if over <= 0:
            break
        box = ax.get_position()
        fig.subplots_adjust(right=box.x1 - over / width)
    fig.savefig(path)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("results")
    p.add_argument("--machine", required=True)
    p.add_argument("--command", required=True)
    p.add_argument("--keys", type=int, required=True)
    p.add_argument("--powertools-keys", type=int, required=True)
    p.add_argument("--tasks", type=int, required=True)
    p.add_argument("--runs", type=int, required=True)
    p.add_argument("--benchmarks", default="BENCHMARKS.md")
    p.add_argument("--png", default="docs/side-by-side.png")
    args = p.parse_args()

    rows = [summarise(name, runs) for name, runs in load(args.results).items()]
    peer = next((r for r in rows if r["name"] == PEER and "error" not in r), None)
    peer_rate = peer["cycles_per_s"] if peer else None
    text = section(args, rows, peer_rate)
    write_section(args.benchmarks, text)
    chart(args.png, args, rows, peer_rate)
    print(text)


if __name__ == "__main__":
    main()
