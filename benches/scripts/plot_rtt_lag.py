#!/usr/bin/env python3
"""Reads benches/scripts/rtt_lag.sh's CSV, prints the table with issue 13's
targets beside the measurements, and plots commit latency and confirm lag
against RTT as a plain SVG (no plotting library on these machines).

Targets (issue 13, item 6), per percentile:
  confirm lag <= RTT + 1 ms
  commit      <= W-th follower RTT + fsync floor + 1 ms
RTT is as the probe measured it through the delay proxy (the same
percentile): the proxy's own overshoot over the nominal RTT (timer slack,
thread wake-ups on a loaded machine) is the emulated network's, not
walrelay's. The lag's RTT is one path's (the replica has one); the
commit's is the W-th follower RTT: each round, the W-th quickest of the
five followers' paths' round trips started together, as a record's
Appends go out together (CSVs from before the probe measured it have the
one path's RTT, used for both). The fsync floor is the same percentile's,
measured just before the cluster started.

    python3 benches/scripts/plot_rtt_lag.py papers/rtt-lag.csv papers/rtt-lag.svg
"""
import csv
import sys

W, H = 760, 440
L, R, T, B = 70, 210, 40, 60


def ms(us):
    return float(us) / 1000.0


def wth(r):
    """The W-th follower RTT (p50, p99): the W-th quickest of the five
    paths' round trips started together, where the run measured it (runs
    before it have the one path's RTT only)."""
    if r.get("wth_rtt_p50_us"):
        return ms(r["wth_rtt_p50_us"]), ms(r["wth_rtt_p99_us"])
    return ms(r["path_rtt_p50_us"]), ms(r["path_rtt_p99_us"])


def targets(r):
    r50, r99 = ms(r["path_rtt_p50_us"]), ms(r["path_rtt_p99_us"])
    w50, w99 = wth(r)
    return {
        "lag_p50": r50 + 1.0,
        "lag_p99": r99 + 1.0,
        "commit_p50": w50 + ms(r["fsync_p50_us"]) + 1.0,
        "commit_p99": w99 + ms(r["fsync_p99_us"]) + 1.0,
    }


def table(rows):
    head = (
        f"{'RTT':>4} {'path p50/p99':>13} {'W-th p50/p99':>13} {'fsync p50/p99':>13} |"
        f" {'commit p50/p99':>14} {'target':>13} {'met':>7} |"
        f" {'lag p50/p99':>12} {'target':>13} {'met':>7} | {'commits':>7} {'HTTP floor':>10}"
    )
    print(
        "times in ms; target and met are per percentile (p50/p99); the commit's"
        " target is the W-th follower RTT + fsync + 1 ms, the lag's the path RTT + 1 ms"
    )
    print(head)
    print("-" * len(head))
    yes = lambda ok: "yes" if ok else "NO"
    pair = lambda a, b: f"{a:.2f}/{b:.2f}"
    for r in rows:
        t = targets(r)
        c50, c99 = ms(r["commit_p50_us"]), ms(r["commit_p99_us"])
        l50, l99 = ms(r["lag_p50_us"]), ms(r["lag_p99_us"])
        cmet = f"{yes(c50 <= t['commit_p50'])}/{yes(c99 <= t['commit_p99'])}"
        lmet = f"{yes(l50 <= t['lag_p50'])}/{yes(l99 <= t['lag_p99'])}"
        print(
            f"{r['rtt_ms']:>4} {pair(ms(r['path_rtt_p50_us']), ms(r['path_rtt_p99_us'])):>13}"
            f" {pair(*wth(r)):>13}"
            f" {pair(ms(r['fsync_p50_us']), ms(r['fsync_p99_us'])):>13} |"
            f" {pair(c50, c99):>14} {pair(t['commit_p50'], t['commit_p99']):>13} {cmet:>7} |"
            f" {pair(l50, l99):>12} {pair(t['lag_p50'], t['lag_p99']):>13} {lmet:>7} |"
            f" {r['commits']:>7} {pair(ms(r['http_floor_p50_us']), ms(r['http_floor_p99_us'])):>10}"
        )
    print(
        "shared-disk floor (3rd of 5 concurrent fsyncs) p50/p99: "
        + ", ".join(
            f"{pair(ms(r['shared_disk_p50_us']), ms(r['shared_disk_p99_us']))} (RTT {r['rtt_ms']})"
            for r in rows
        )
    )


def plot(rows, dst):
    xs = [float(r["rtt_ms"]) for r in rows]
    series = [
        ("commit p50", "#1f5fa8", "", [ms(r["commit_p50_us"]) for r in rows]),
        ("commit p99", "#1f5fa8", "6,4", [ms(r["commit_p99_us"]) for r in rows]),
        ("confirm lag p50", "#c0392b", "", [ms(r["lag_p50_us"]) for r in rows]),
        ("confirm lag p99", "#c0392b", "6,4", [ms(r["lag_p99_us"]) for r in rows]),
        ("target: commit p50", "#1f5fa8", "2,3", [targets(r)["commit_p50"] for r in rows]),
        ("target: lag p50", "#c0392b", "2,3", [targets(r)["lag_p50"] for r in rows]),
    ]
    xmax = max(xs) if max(xs) > 0 else 1.0
    ymax = max(max(v) for _, _, _, v in series) * 1.1

    def x(v):
        return L + v / xmax * (W - L - R)

    def y(v):
        return H - B - v / ymax * (H - T - B)

    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif" font-size="12">',
        f'<rect width="{W}" height="{H}" fill="white"/>',
        f'<text x="{L}" y="22" font-size="14">Commit latency and confirm lag against RTT (5 followers, W=3, 1 client)</text>',
        f'<line x1="{L}" y1="{H - B}" x2="{W - R}" y2="{H - B}" stroke="black"/>',
        f'<line x1="{L}" y1="{T}" x2="{L}" y2="{H - B}" stroke="black"/>',
        f'<text x="{(L + W - R) / 2}" y="{H - 20}" text-anchor="middle">RTT to followers and replica (ms)</text>',
        f'<text x="18" y="{(T + H - B) / 2}" transform="rotate(-90 18 {(T + H - B) / 2})" text-anchor="middle">ms</text>',
    ]
    for v in xs:
        out.append(f'<line x1="{x(v):.1f}" y1="{H - B}" x2="{x(v):.1f}" y2="{H - B + 5}" stroke="black"/>')
        out.append(f'<text x="{x(v):.1f}" y="{H - B + 18}" text-anchor="middle">{v:g}</text>')
    step = 10 ** len(str(int(ymax / 5))) / 10 if ymax >= 5 else 1
    while ymax / step > 10:
        step *= 2
    v = 0.0
    while v <= ymax:
        out.append(f'<line x1="{L - 5}" y1="{y(v):.1f}" x2="{W - R}" y2="{y(v):.1f}" stroke="#ddd"/>')
        out.append(f'<text x="{L - 8}" y="{y(v) + 4:.1f}" text-anchor="end">{v:g}</text>')
        v += step
    for i, (name, colour, dash, vals) in enumerate(series):
        pts = " ".join(f"{x(a):.1f},{y(b):.1f}" for a, b in zip(xs, vals))
        dasharray = f' stroke-dasharray="{dash}"' if dash else ""
        out.append(f'<polyline points="{pts}" fill="none" stroke="{colour}" stroke-width="2"{dasharray}/>')
        if not name.startswith("target"):
            for a, b in zip(xs, vals):
                out.append(f'<circle cx="{x(a):.1f}" cy="{y(b):.1f}" r="3" fill="{colour}"/>')
        ly = T + 20 + i * 20
        out.append(f'<line x1="{W - R + 15}" y1="{ly}" x2="{W - R + 45}" y2="{ly}" stroke="{colour}" stroke-width="2"{dasharray}/>')
        out.append(f'<text x="{W - R + 52}" y="{ly + 4}">{name}</text>')
    out.append("</svg>")
    with open(dst, "w") as f:
        f.write("\n".join(out) + "\n")


def main(src, dst):
    with open(src) as f:
        rows = list(csv.DictReader(f))
    if not rows:
        sys.exit(f"{src}: no rows")
    table(rows)
    plot(rows, dst)
    print(f"wrote {dst}")


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit("usage: plot_rtt_lag.py RESULTS.csv OUT.svg")
    main(sys.argv[1], sys.argv[2])
