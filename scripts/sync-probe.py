#!/usr/bin/env python3
"""The raw disk's floor for the replication latency benchmark (scripts/bench-replication).

Prints two medians in microseconds, for DIR's disk: one pwrite + fdatasync of a 1 KiB record
by one writer, and the time until the second of three writers (each its own file, released
together) is done: the quorum of three copies on one disk. Usage: sync-probe.py DIR [ROUNDS]
"""
import os, sys, threading, time, statistics
d = sys.argv[1]; rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 400
buf = b"x" * 1100
def fd(i): return os.open(os.path.join(d, f"probe{i}"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
def one(f, off): os.pwrite(f, buf, off); os.fdatasync(f)
single = []; f = fd(9)
for r in range(rounds):
    t = time.perf_counter(); one(f, r * 4096); single.append(time.perf_counter() - t)
# three persistent writers, each its own file, released together: time until the second is done
files = [fd(i) for i in range(3)]; start = threading.Barrier(4); end = threading.Barrier(4)
finish = [0.0] * 3
def writer(i):
    for r in range(rounds):
        start.wait(); one(files[i], r * 4096); finish[i] = time.perf_counter(); end.wait()
threads = [threading.Thread(target=writer, args=(i,)) for i in range(3)]
[x.start() for x in threads]; quorum = []
for r in range(rounds):
    t = time.perf_counter(); start.wait(); end.wait(); quorum.append(sorted(finish)[1] - t)
[x.join() for x in threads]
print(int(statistics.median(single) * 1e6), int(statistics.median(quorum) * 1e6))
