#!/usr/bin/env python3
"""Plots the fleet benchmark's CSV (databases, p50_us, p99_us, ...) as a
plain SVG: query latency against the number of databases (log scale).

    python3 benches/scripts/plot_fleet.py target/fleet-latency.csv papers/fleet-latency.svg
"""
import csv
import math
import sys

W, H = 760, 420
L, R, T, B = 80, 150, 40, 60


def main(src, dst):
    with open(src) as f:
        rows = list(csv.DictReader(f))
    if not rows:
        sys.exit(f"{src}: no rows")
    n = [int(r["databases"]) for r in rows]
    p50 = [float(r["p50_us"]) for r in rows]
    p99 = [float(r["p99_us"]) for r in rows]
    xmin, xmax = math.log10(min(n)), math.log10(max(n))
    if xmax == xmin:
        xmax = xmin + 1
    ymax = max(p99) * 1.15

    def x(v):
        return L + (math.log10(v) - xmin) / (xmax - xmin) * (W - L - R)

    def y(v):
        return H - B - v / ymax * (H - T - B)

    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif" font-size="12">',
           f'<rect width="{W}" height="{H}" fill="white"/>',
           f'<text x="{L}" y="22" font-size="14">Query latency over a hot set of 10 databases, by databases on the node</text>',
           f'<line x1="{L}" y1="{H-B}" x2="{W-R}" y2="{H-B}" stroke="black"/>',
           f'<line x1="{L}" y1="{T}" x2="{L}" y2="{H-B}" stroke="black"/>']
    for v in n:
        out.append(f'<line x1="{x(v):.1f}" y1="{H-B}" x2="{x(v):.1f}" y2="{H-B+5}" stroke="black"/>')
        out.append(f'<text x="{x(v):.1f}" y="{H-B+20}" text-anchor="middle">{v:,}</text>')
    for i in range(6):
        v = ymax * i / 5
        out.append(f'<line x1="{L-5}" y1="{y(v):.1f}" x2="{L}" y2="{y(v):.1f}" stroke="black"/>')
        out.append(f'<text x="{L-8}" y="{y(v)+4:.1f}" text-anchor="end">{v:.0f}</text>')
    out.append(f'<text x="{(L+W-R)/2}" y="{H-15}" text-anchor="middle">databases (log scale)</text>')
    out.append(f'<text x="20" y="{(T+H-B)/2}" transform="rotate(-90 20 {(T+H-B)/2})" text-anchor="middle">latency (us)</text>')
    for series, color, label in [(p50, "#1f77b4", "p50"), (p99, "#d62728", "p99")]:
        pts = " ".join(f"{x(a):.1f},{y(b):.1f}" for a, b in zip(n, series))
        out.append(f'<polyline points="{pts}" fill="none" stroke="{color}" stroke-width="2"/>')
        for a, b in zip(n, series):
            out.append(f'<circle cx="{x(a):.1f}" cy="{y(b):.1f}" r="3" fill="{color}"/>')
        out.append(f'<text x="{W-R+10}" y="{y(series[-1])+4:.1f}" fill="{color}">{label}</text>')
    out.append("</svg>")
    with open(dst, "w") as f:
        f.write("\n".join(out) + "\n")


if __name__ == "__main__":
    main(*sys.argv[1:3])
