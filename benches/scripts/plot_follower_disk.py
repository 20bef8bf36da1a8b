#!/usr/bin/env python3
"""Plots follower_disk.sh's CSV as a plain SVG (no plotting library):
each follower's disk, the database size, and the bound
max(256 MiB, 2 x database size).

    python3 benches/scripts/plot_follower_disk.py CSV SVG
"""
import csv
import sys

MIB = 1 << 20
W, H = 980, 480
L, R, T, B = 80, 250, 40, 50  # margins: left, right, top, bottom
COLORS = ["#1f77b4", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#bcbd22"]


def main(src, dst):
    with open(src) as f:
        rows = list(csv.DictReader(f))
    if not rows:
        sys.exit(f"{src}: no rows")
    t = [float(r["t_s"]) for r in rows]
    db = [int(r["db_bytes"]) for r in rows]
    fcols = [c for c in rows[0] if c.startswith("follower_")]
    fol = {c: [int(r[c] or 0) for r in rows] for c in fcols}
    bound = [max(256 * MIB, 2 * d) for d in db]
    ymax = max([max(bound)] + [max(v) for v in fol.values()]) * 1.08 / MIB
    xmax = max(t[-1], 1.0)

    def x(v):
        return L + (W - L - R) * v / xmax

    def y(v):
        return T + (H - T - B) * (1 - v / MIB / ymax)

    def line(vals, color, width=1.5, dash=None):
        pts = " ".join(f"{x(a):.1f},{y(b):.1f}" for a, b in zip(t, vals))
        d = f' stroke-dasharray="{dash}"' if dash else ""
        return f'<polyline fill="none" stroke="{color}" stroke-width="{width}"{d} points="{pts}"/>'

    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif" font-size="12">',
        f'<rect width="{W}" height="{H}" fill="white"/>',
        f'<text x="{W / 2 - R / 2}" y="22" text-anchor="middle" font-size="14">'
        f"Follower disk under walrelay up (demo workload, {t[-1] / 60:.0f} min)</text>",
    ]
    step = nice_step(ymax)
    v = 0.0
    while v <= ymax:
        out.append(f'<line x1="{L}" x2="{W - R}" y1="{y(v * MIB):.1f}" y2="{y(v * MIB):.1f}" stroke="#ddd"/>')
        out.append(f'<text x="{L - 6}" y="{y(v * MIB) + 4:.1f}" text-anchor="end">{v:g}</text>')
        v += step
    xs = nice_step(xmax / 60) * 60
    v = 0.0
    while v <= xmax:
        out.append(f'<line x1="{x(v):.1f}" x2="{x(v):.1f}" y1="{T}" y2="{H - B}" stroke="#eee"/>')
        out.append(f'<text x="{x(v):.1f}" y="{H - B + 16}" text-anchor="middle">{v / 60:g}</text>')
        v += xs
    out.append(f'<text x="{(L + W - R) / 2}" y="{H - 12}" text-anchor="middle">minutes</text>')
    out.append(f'<text x="18" y="{(T + H - B) / 2}" text-anchor="middle" '
               f'transform="rotate(-90 18 {(T + H - B) / 2})">MiB</text>')
    out.append(f'<rect x="{L}" y="{T}" width="{W - L - R}" height="{H - T - B}" fill="none" stroke="#444"/>')
    legend = []
    out.append(line(bound, "#d62728", 2.5, "8 4"))
    legend.append(("#d62728", "bound max(256 MiB, 2x db)", "8 4"))
    out.append(line(db, "#ff7f0e", 2.5))
    legend.append(("#ff7f0e", "database size", None))
    for i, c in enumerate(fcols):
        color = COLORS[i % len(COLORS)]
        out.append(line(fol[c], color))
        legend.append((color, c.replace("_bytes", "").replace("_", "-") + " (du -sb)", None))
    for i, (color, label, dash) in enumerate(legend):
        ly = T + 10 + i * 20
        d = f' stroke-dasharray="{dash}"' if dash else ""
        out.append(f'<line x1="{W - R + 12}" x2="{W - R + 36}" y1="{ly}" y2="{ly}" stroke="{color}" stroke-width="2"{d}/>')
        out.append(f'<text x="{W - R + 42}" y="{ly + 4}">{label}</text>')
    over = [(a, c) for c in fcols for a, v, bd in zip(t, fol[c], bound) if v > bd]
    note = (f"{len(over)} samples above the bound" if over else "every sample within the bound")
    out.append(f'<text x="{W - R + 12}" y="{T + 10 + len(legend) * 20 + 10}">{note}</text>')
    out.append("</svg>")
    with open(dst, "w") as f:
        f.write("\n".join(out) + "\n")
    print(f"{dst}: {len(rows)} samples, max follower {max(max(v) for v in fol.values()) / MIB:.1f} MiB, "
          f"max database {max(db) / MIB:.1f} MiB; {note}")


def nice_step(span):
    for s in [1, 2, 5, 10, 20, 25, 50, 100, 200, 250, 500, 1000, 2000, 5000]:
        if span / s <= 10:
            return float(s)
    return float(span / 10)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
