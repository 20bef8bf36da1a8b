#!/usr/bin/env python3
"""Lines up the quorum bench's steady-state commits with the disk's requests.

    steady_timeline.py TIMELINE PERF_SCRIPT [SLOW_FACTOR]

TIMELINE is the bench's WALRELAY_BENCH_TIMELINE file (per commit: its start
on CLOCK_MONOTONIC in us, and its latency in us). PERF_SCRIPT is `perf
script` output of a `perf record -k CLOCK_MONOTONIC -a` of the block layer's
bio_queue, rq_issue and rq_complete events (and any others, shown as they
are) over the same windows (steady_timeline.sh makes both).

Each disk request is put in a class by who queued it and how (the commit
path's direct writes and their flushes, the inode writes a sync adds, the
archiver's reads and syncs, discards, the page cache's writeback, ...).
A commit is slow when it takes over SLOW_FACTOR (default 2) times the
median. For each class the report gives the share of slow commits and of
all commits that had one of its requests in flight, and the bytes in flight
with the slow ones: a class whose share is much higher among the slow
commits is what delays them.

With the scheduler's sched_switch and sched_wakeup events too, it reports
how much of the slow and of all commits the archive's and the logs'
background threads were on a CPU, and the commit path's wake-ups that
waited over LATE_WAKE_US for a CPU (with the thread that ran just before
each: the last holder, not every one).
"""

import re
import sys
from bisect import bisect_left

LINE = re.compile(
    r"^\s*(?P<comm>.+?)\s+(?P<tid>\d+)\s+\[(?P<cpu>\d+)\]\s+(?P<t>\d+\.\d+):\s+"
    r"(?P<event>[\w:]+):\s*(?P<rest>.*)$"
)
SWITCH = re.compile(
    r"prev_comm=(?P<prev>.+?) prev_pid=(?P<prev_pid>\d+) .* next_comm=(?P<next>.+?) "
    r"next_pid=(?P<pid>\d+)"
)
WAKEUP = re.compile(r"comm=(?P<comm>.+?) pid=(?P<pid>\d+)")
# A wake-up that waits longer than this for its CPU is a late one.
LATE_WAKE_US = 50
BIO = re.compile(r"^\S+ (?P<rwbs>[A-Z]+) (?P<sector>\d+) \+ (?P<n>\d+)")
RQ = re.compile(r"^\S+ (?P<rwbs>[A-Z]+) (?:(?P<bytes>\d+) )?\(\S*\) (?P<sector>\d+) \+ (?P<n>\d+)")


def background_cpu(comm):
    """Whether a thread is the archive's or a log's background work."""
    return comm.startswith(("walrelay-idle", "walrelay-archiv", "walrelay-spare"))


# What any commit puts on the disk: a follower's write, the inode write a
# sync may add, and the flush.
COMMIT_PATH = {"follower log write", "sync's inode write (kworker)", "flush"}


def classify(comm, rwbs):
    """A request's class from the thread that queued it and its flags."""
    if "D" in rwbs:
        return "discard"
    if comm.startswith("walrelay-uring") or comm.startswith("iou-wrk"):
        return "follower log write" if "W" in rwbs else "ring read"
    if comm.startswith("walrelay-archiv") or comm.startswith("walrelay-idle"):
        if "F" in rwbs:
            return "archiver flush"
        return "archiver read" if "R" in rwbs else "archiver write"
    if comm.startswith("walrelay-spare"):
        return "spare fill"
    if comm.startswith("kworker"):
        if rwbs.startswith("F"):
            return "sync's flush (kworker)"
        if "M" in rwbs:
            return "sync's inode write (kworker)"
        if "W" in rwbs:
            return "writeback (kworker)"
    if comm.startswith("jbd2"):
        return "journal"
    if "F" in rwbs:
        return "other flush: " + comm
    return ("other read: " if "R" in rwbs else "other write: ") + comm


def read_commits(path):
    """(start us, latency us) of each commit in the bench's timeline."""
    with open(path) as f:
        return sorted((int(at), int(took)) for at, took in (line.split() for line in f))


def read_events(path):
    """From `perf script` output: the disk requests as (issue us, complete
    us, class, bytes); the background threads' stretches on a CPU as (from
    us, to us, comm); the commit path's late wake-ups as (woken us, waited
    us, who ran just before it); and the span the events cover."""
    queued = {}  # sector -> (comm, rwbs) of the newest bio queued there
    issued = {}  # (sector, rwbs) -> (issue us, class, bytes)
    flushes = []  # issued flushes, oldest first (they complete at no sector)
    spans = []
    running = {}  # cpu -> (since us, comm) of the thread on it
    woken = {}  # pid -> us it was woken at
    late = []
    cpu_spans = []
    first_us = last_us = None
    with open(path) as f:
        for line in f:
            m = LINE.match(line)
            if not m:
                continue
            t = int(float(m["t"]) * 1e6)
            first_us = t if first_us is None else first_us
            last_us = t
            ev, rest, comm = m["event"], m["rest"], m["comm"].strip()
            if ev == "sched:sched_switch":
                sw = SWITCH.search(rest)
                if sw:
                    since = running.get(m["cpu"])
                    if since and background_cpu(since[1]):
                        cpu_spans.append((since[0], t, since[1]))
                    running[m["cpu"]] = (t, sw["next"])
                    # Woken while it ran: that wake-up waited for nothing.
                    woken.pop(sw["prev_pid"], None)
                    at = woken.pop(sw["pid"], None)
                    if at is not None and t - at > LATE_WAKE_US:
                        late.append((at, t - at, sw["prev"]))
            elif ev in ("sched:sched_wakeup", "sched:sched_waking"):
                w = WAKEUP.search(rest)
                if w and not background_cpu(w["comm"]):
                    woken.setdefault(w["pid"], t)
            elif ev == "block:block_bio_queue":
                b = BIO.match(rest)
                if b:
                    queued[int(b["sector"])] = (comm, b["rwbs"])
            elif ev == "block:block_rq_issue":
                r = RQ.match(rest)
                if r and r["rwbs"] == "FF":
                    flushes.append((t, "flush", 0))
                elif r:
                    sector = int(r["sector"])
                    who, rwbs = queued.pop(sector, (comm, r["rwbs"]))
                    n = int(r["bytes"] or 0) or int(r["n"]) * 512
                    issued[(sector, r["rwbs"])] = (t, classify(who, rwbs), n)
            elif ev == "block:block_rq_complete":
                r = RQ.match(rest)
                if r and r["rwbs"] == "FF":
                    got = flushes.pop(0) if flushes else None
                elif r:
                    got = issued.pop((int(r["sector"]), r["rwbs"]), None)
                else:
                    got = None
                if got:
                    spans.append((got[0], t, got[1], got[2]))
    if first_us is None:
        sys.exit("no perf events")
    return sorted(spans), sorted(cpu_spans), sorted(late), (first_us, last_us)


def overlapping(items, starts, longest, at, end):
    """The items (sorted by start, starts their starts, none longer than
    longest) that overlap [at, end)."""
    lo = bisect_left(starts, at - longest)
    hi = bisect_left(starts, end)
    return [x for x in items[lo:hi] if x[1] > at]


def report_disk(commits, spans, slow_at, header):
    """Per class of request: the share of slow and of all commits it met
    (after `header`, the commits' own summary)."""
    starts = [s[0] for s in spans]
    longest = max((s[1] - s[0] for s in spans), default=0)
    classes = sorted({s[2] for s in spans})
    hits_all = dict.fromkeys(classes, 0)
    hits_slow = dict.fromkeys(classes, 0)
    bytes_slow = dict.fromkeys(classes, 0)
    slow = 0
    # Commits that met none but the commit path's own classes.
    alone = {"slow": 0, "all": 0}
    for at, took in commits:
        seen = {}
        for s in overlapping(spans, starts, longest, at, at + took):
            seen[s[2]] = seen.get(s[2], 0) + s[3]
        is_slow = took > slow_at
        slow += is_slow
        if not set(seen) - COMMIT_PATH:
            alone["all"] += 1
            alone["slow"] += is_slow
        for c, n in seen.items():
            hits_all[c] += 1
            if is_slow:
                hits_slow[c] += 1
                bytes_slow[c] += n
    print(f"{header}; {slow} slow (over {slow_at:.0f} us); {len(spans)} disk requests")
    print(f"{'class':<40} {'slow with it':>13} {'all with it':>12} {'KiB per slow':>13}")
    for c in sorted(classes, key=lambda c: -hits_slow[c]):
        s = 100.0 * hits_slow[c] / max(slow, 1)
        a = 100.0 * hits_all[c] / len(commits)
        kib = bytes_slow[c] / 1024 / max(hits_slow[c], 1)
        print(f"{c:<40} {s:>12.1f}% {a:>11.1f}% {kib:>13.0f}")
    s = 100.0 * alone["slow"] / max(slow, 1)
    a = 100.0 * alone["all"] / len(commits)
    print(f"{'(only the commit path in flight)':<40} {s:>12.1f}% {a:>11.1f}%")


def report_cpu(commits, cpu_spans, slow_at):
    """How much of the slow and of all commits the background threads were
    on a CPU."""
    starts = [c[0] for c in cpu_spans]
    longest = max(c[1] - c[0] for c in cpu_spans)
    on = {"slow": [], "all": []}
    for at, took in commits:
        end = at + took
        us = sum(
            min(c[1], end) - max(c[0], at)
            for c in overlapping(cpu_spans, starts, longest, at, end)
        )
        share = us / max(took, 1)
        on["all"].append(share)
        if took > slow_at:
            on["slow"].append(share)
    for k in ("slow", "all"):
        v = on[k]
        busy = 100.0 * sum(1 for x in v if x > 0) / max(len(v), 1)
        mean = 100.0 * sum(v) / max(len(v), 1)
        print(
            f"background threads on a CPU during {k} commits: {busy:.1f}% of them, "
            f"for {mean:.1f}% of their time on average"
        )


def report_wakeups(commits, late, slow_at):
    """The commit path's late wake-ups during slow and all commits, and (for
    the slow ones) who ran just before each got its CPU."""
    starts = [x[0] for x in late]
    for k, pick in (("slow", lambda took: took > slow_at), ("all", lambda took: True)):
        n = held = waited = 0
        by = {}
        chosen = [(at, took) for at, took in commits if pick(took)]
        for at, took in chosen:
            mine = late[bisect_left(starts, at) : bisect_left(starts, at + took)]
            if mine:
                n += 1
                waited += max(x[1] for x in mine)
                held += any(background_cpu(x[2]) for x in mine)
            for x in mine:
                who = re.sub(r"[/:]?\d+.*$", "", x[2])
                by[who] = by.get(who, 0) + x[1]
        if k == "slow":
            top = sorted(by.items(), key=lambda kv: -kv[1])[:6]
            print(
                "  late wake-ups' waits during slow commits, by who held the CPU (ms):",
                ", ".join(f"{w} {us / 1000:.1f}" for w, us in top),
            )
        print(
            f"{k} commits with a wake-up that waited over {LATE_WAKE_US} us for a CPU: "
            f"{100.0 * n / max(len(chosen), 1):.1f}% (longest wait {waited / max(n, 1):.0f} us "
            f"on average; {held} of them behind a background thread)"
        )


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    factor = float(sys.argv[3]) if len(sys.argv) > 3 else 2.0
    spans, cpu_spans, late, (first_us, last_us) = read_events(sys.argv[2])
    commits = [
        c for c in read_commits(sys.argv[1]) if c[0] >= first_us and c[0] + c[1] <= last_us
    ]
    if not commits:
        sys.exit("no commit inside the recorded span")
    lat = sorted(c[1] for c in commits)
    median = lat[len(lat) // 2]
    header = (
        f"{len(commits)} commits inside {(last_us - first_us) / 1e6:.1f} s of events; "
        f"median {median} us"
    )
    slow_at = median * factor
    report_disk(commits, spans, slow_at, header)
    if cpu_spans:
        report_cpu(commits, cpu_spans, slow_at)
    if late:
        report_wakeups(commits, late, slow_at)


if __name__ == "__main__":
    main()
