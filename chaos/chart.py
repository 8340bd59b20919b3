"""The chart of RELIABILITY.md: doubled effects per 1 000 messages, by fault,
in the plain sink beside the fenced one.

    idem-chaos suite --json --write RELIABILITY.md > rows.jsonl
    python3 chaos/chart.py rows.jsonl docs/reliability.png

Reads the JSON lines `idem-chaos --json` prints (one a run) and sums each
fault's runs over every broker and store. Needs matplotlib (scripts/chaos
puts it in the side-by-side benchmark's virtualenv).
"""

import json
import sys
from collections import OrderedDict


def main(rows_path, png_path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    by_fault = OrderedDict()
    for line in open(rows_path):
        line = line.strip()
        if not line.startswith("{"):
            continue
        r = json.loads(line)
        f = by_fault.setdefault(
            r["fault"], {"sent": 0, "plain": 0, "fenced": 0, "fenced_rows": 0}
        )
        f["sent"] += r["sent"]
        f["plain"] += r["doubled_plain"]
        if r.get("fenced", True):
            f["fenced"] += r["doubled_fenced"]
            f["fenced_rows"] += 1
    if not by_fault:
        sys.exit(f"{rows_path}: no runs in it")

    faults = list(by_fault)
    plain = [1000 * by_fault[f]["plain"] / max(by_fault[f]["sent"], 1) for f in faults]
    fenced = [
        1000 * by_fault[f]["fenced"] / max(by_fault[f]["sent"], 1)
        if by_fault[f]["fenced_rows"]
        else None
        for f in faults
    ]

    fig, ax = plt.subplots(figsize=(10, 0.62 * len(faults) + 1.8), dpi=110)
    ys = list(range(len(faults)))[::-1]
    h = 0.38
    for y, p, q in zip(ys, plain, fenced):
        ax.barh(y + h / 2, p, height=h, color="#c05621")
        ax.text(p, y + h / 2, f" {p:.1f}", va="center", fontsize=8.5)
        if q is None:
            ax.text(0, y - h / 2, " no fenced sink in the HTTP runs",
                    va="center", fontsize=8.5, color="#555555")
        else:
            ax.barh(y - h / 2, q, height=h, color="#2b6cb0")
            ax.text(q, y - h / 2, f" {q:.1f}", va="center", fontsize=8.5)
    ax.set_yticks(ys)
    ax.set_yticklabels(faults, fontsize=9.5)
    ax.set_xlabel("effects applied again, per 1 000 messages (every broker and store of the run)")
    ax.set_xlim(0, max(plain + [q or 0 for q in fenced] + [1]) * 1.25)
    ax.grid(axis="x", color="#dddddd")
    ax.set_axisbelow(True)
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)
    ax.legend(
        handles=[
            plt.Rectangle((0, 0), 1, 1, color="#c05621", label="plain sink"),
            plt.Rectangle((0, 0), 1, 1, color="#2b6cb0", label="fenced sink (fencing tokens checked)"),
        ],
        loc="lower right",
        fontsize=9,
        frameon=False,
    )
    fig.suptitle("idem-chaos: doubled effects by fault, plain beside fenced sink",
                 fontsize=11, x=0.01, ha="left")
    fig.tight_layout()
    fig.savefig(png_path)


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit("usage: chart.py ROWS.jsonl OUT.png")
    main(sys.argv[1], sys.argv[2])
