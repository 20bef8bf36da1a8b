#!/usr/bin/env python3
"""CPU time and context switches of every walrelay thread, by role and name.

    thread_cpu.py snap FILE             # save a snapshot of /proc
    thread_cpu.py diff BEFORE AFTER N   # per-unit figures over N units

A thread is keyed by its process's role (the subcommand of `walrelay`,
after any global option such as `--cpu-scheduling batch`: up, primary,
follower, replica) and its name with digits
dropped (`iou-wrk-123` -> `iou-wrk`), so the five followers' rings add up
in one row. `diff` prints, per row, CPU microseconds and voluntary and
involuntary context switches per unit (a request, a commit), largest CPU
first, then the total. Used by http_threads.sh.
"""
import json
import os
import sys

# walrelay's options that come before the subcommand, each with a value.
GLOBAL_OPTIONS = {"--cpu-scheduling"}

TICK_US = 1_000_000 / os.sysconf("SC_CLK_TCK")


def role_of(cmd):
    """The role of a process from its command line (a list of bytes), or
    None if it is not walrelay: any binary named walrelay* (a copy kept
    aside for an A/B run), its role the subcommand: the first argument that
    is neither a global option nor its value (`--cpu-scheduling batch
    primary ...`)."""
    if len(cmd) < 2 or not os.path.basename(cmd[0]).startswith(b"walrelay"):
        return None
    args = [a.decode(errors="replace") for a in cmd[1:] if a]
    while len(args) > 2 and args[0] in GLOBAL_OPTIONS:
        args = args[2:]
    return args[0] if args else "?"


def thread_kind(name):
    """A thread's name with its digits dropped (`iou-wrk-123` -> `iou-wrk`)."""
    return name.rstrip("0123456789").rstrip("-")


def snapshot():
    rows = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmd = open(f"/proc/{pid}/cmdline", "rb").read().split(b"\0")
            tids = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        role = role_of(cmd)
        if role is None:
            continue
        for tid in tids:
            try:
                stat = open(f"/proc/{pid}/task/{tid}/stat").read()
                status = open(f"/proc/{pid}/task/{tid}/status").read()
            except OSError:
                continue  # the thread ended meanwhile
            name = stat[stat.index("(") + 1 : stat.rindex(")")]
            fields = stat[stat.rindex(")") + 2 :].split()
            cpu = int(fields[11]) + int(fields[12])  # utime + stime, ticks
            vol = int(status.split("voluntary_ctxt_switches:")[1].split()[0])
            invol = int(status.split("nonvoluntary_ctxt_switches:")[1].split()[0])
            key = f"{role}|{thread_kind(name)}"
            row = rows.setdefault(key, [0, 0, 0])
            row[0] += cpu
            row[1] += vol
            row[2] += invol
    return rows


def diff(before, after, units):
    rows = []
    for key, b in after.items():
        a = before.get(key, [0, 0, 0])
        d = [b[i] - a[i] for i in range(3)]
        if d[0] > 0 or d[1] > 0:
            rows.append((d[0], key, d))
    rows.sort(reverse=True)
    total = [0, 0, 0]
    print(f"{'role | thread':34s} {'CPU us':>8s} {'vol cs':>7s} {'invol cs':>8s}   (per unit)")
    for _, key, d in rows:
        total = [total[i] + d[i] for i in range(3)]
        print(f"{key.replace('|', ' | '):34s} {d[0] * TICK_US / units:8.1f} {d[1] / units:7.2f} {d[2] / units:8.2f}")
    print(f"{'total':34s} {total[0] * TICK_US / units:8.1f} {total[1] / units:7.2f} {total[2] / units:8.2f}")


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "snap":
        json.dump(snapshot(), open(sys.argv[2], "w"))
    elif len(sys.argv) == 5 and sys.argv[1] == "diff":
        diff(json.load(open(sys.argv[2])), json.load(open(sys.argv[3])), float(sys.argv[4]))
    else:
        sys.exit(__doc__)
