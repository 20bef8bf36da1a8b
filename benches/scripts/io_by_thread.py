#!/usr/bin/env python3
"""Each second, what the disk wrote and who in walrelay wrote and read it.

    io_by_thread.py SECONDS

Prints one line a second for SECONDS: the disk's bytes written and read
(`/proc/diskstats`, every block device that is not a partition, a loop
or a zram device), the kernel's dirty and writeback page cache
(`/proc/meminfo`), then per walrelay thread kind (role and thread name,
as thread_cpu.py keys them) its CPU milliseconds and the bytes it read
and wrote that second (`/proc/PID/task/TID/io`: direct writes count
here; buffered ones are the kernel's writeback, in the disk's figure
only). Kinds below 5 ms of CPU and 1 MiB of I/O are left out. Used by
http_tail.sh (IO_SAMPLE=1); papers/performance-log.md ("Where a lone
write's disk bytes go") shows what it printed.
"""
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from thread_cpu import role_of, thread_kind  # noqa: E402

TICK_MS = 1000 / os.sysconf("SC_CLK_TCK")
MIB = 1 << 20


def disks():
    written = read = 0
    for line in open("/proc/diskstats"):
        f = line.split()
        name = f[2]
        if name.startswith(("loop", "zram", "ram")) or os.path.exists(f"/sys/class/block/{name}/partition"):
            continue
        read += int(f[5]) * 512
        written += int(f[9]) * 512
    return written, read


def page_cache_mib():
    m = {}
    for line in open("/proc/meminfo"):
        k, v = line.split(":")
        m[k] = int(v.split()[0]) >> 10
    return m["Dirty"], m["Writeback"]


def snapshot():
    rows = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            role = role_of(open(f"/proc/{pid}/cmdline", "rb").read().split(b"\0"))
            if role is None:
                continue
            for tid in os.listdir(f"/proc/{pid}/task"):
                base = f"/proc/{pid}/task/{tid}"
                name = thread_kind(open(f"{base}/comm").read().strip())
                stat = open(f"{base}/stat").read().rsplit(")", 1)[1].split()
                io = dict(line.split(": ") for line in open(f"{base}/io").read().splitlines())
                row = rows.setdefault(f"{role}|{name}", [0, 0, 0])
                row[0] += int(stat[11]) + int(stat[12])
                row[1] += int(io["read_bytes"])
                row[2] += int(io["write_bytes"])
        except (OSError, ValueError, KeyError, IndexError):
            continue  # a thread or process that ended meanwhile
    return rows


def main():
    seconds = float(sys.argv[1])
    t0 = time.monotonic()
    before, disk_before = snapshot(), disks()
    while time.monotonic() - t0 < seconds:
        time.sleep(1)
        after, disk_after = snapshot(), disks()
        dirty, writeback = page_cache_mib()
        kinds = []
        for key, (cpu, rd, wr) in sorted(after.items()):
            c0, r0, w0 = before.get(key, (0, 0, 0))
            cpu_ms, rd, wr = (cpu - c0) * TICK_MS, rd - r0, wr - w0
            if cpu_ms >= 5 or rd + wr >= MIB:
                kinds.append(f"{key} {cpu_ms:.0f} ms r {rd / MIB:.0f} w {wr / MIB:.0f} MiB")
        print(
            f"{time.monotonic() - t0:5.1f} s: disk w {(disk_after[0] - disk_before[0]) / MIB:.0f} "
            f"r {(disk_after[1] - disk_before[1]) / MIB:.0f} MiB, dirty {dirty} wb {writeback} MiB; "
            + "; ".join(kinds),
            flush=True,
        )
        before, disk_before = after, disk_after


if __name__ == "__main__":
    main()
