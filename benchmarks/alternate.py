"""Time whole commands against each other, alternating, the way hyperfine does.

    python benchmarks/alternate.py --rounds 5 --name nanoGPT --cmd "..." --name ours --cmd "..."

Each round runs every command once, in order (so a change of machine load hits all of them
alike); each run is a whole process: interpreter start-up, imports, data loading, training,
evaluation, files. Reported per command, as a markdown table: median and best wall time, median
CPU time (user + system of the process and its children), and each median's ratio to the first
command's.
A command that fails stops the benchmark with its output.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shlex
import statistics
import subprocess
import sys
import time

from scratchgpt.commands.argtypes import positive_int


def run_once(cmd: str, cwd: str | None) -> tuple[float, float]:
    """(wall seconds, CPU seconds of the children) of one run of ``cmd`` in a shell."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    done = subprocess.run(cmd, shell=True, cwd=cwd, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        sys.exit(f"command failed ({done.returncode}): {cmd}\n{done.stdout[-1500:]}"
                 f"{done.stderr[-1500:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=positive_int, default=5,
                   help="runs of each command, taking turns (5)")
    p.add_argument("--name", action="append", required=True, help="label of the next --cmd")
    p.add_argument("--cmd", action="append", required=True, help="a shell command")
    p.add_argument("--cwd", action="append", default=None,
                   help="working directory of each command (one per --cmd, '.' for here)")
    p.add_argument("--json", default=None, help="also write the results to this file")
    p.add_argument("--markdown", default=None, help="also append the table to this file")
    args = p.parse_args()
    if len(args.name) != len(args.cmd) or (args.cwd and len(args.cwd) != len(args.cmd)):
        p.error("give one --name (and --cwd, if any) per --cmd")
    cwds = args.cwd or ["."] * len(args.cmd)
    times: dict[str, list[tuple[float, float]]] = {n: [] for n in args.name}
    for r in range(args.rounds):
        for name, cmd, cwd in zip(args.name, args.cmd, cwds, strict=True):
            wall, cpu = run_once(cmd, os.path.abspath(cwd))
            times[name].append((wall, cpu))
            print(f"round {r + 1}/{args.rounds} {name}: {wall:.2f} s wall, {cpu:.2f} s CPU",
                  flush=True)
    ref = statistics.median(w for w, _ in times[args.name[0]])
    results = []
    lines = [f"| command | median wall s | best wall s | median CPU s | speed vs {args.name[0]} |",
             "|---|---:|---:|---:|---:|"]
    for name, cmd in zip(args.name, args.cmd, strict=True):
        walls = [w for w, _ in times[name]]
        med, cpu = statistics.median(walls), statistics.median(c for _, c in times[name])
        results.append({"name": name, "cmd": cmd, "wall_s": walls, "median_s": med,
                        "cpu_median_s": cpu, "speedup": ref / med})
        lines.append(f"| {name} | {med:.2f} | {min(walls):.2f} | {cpu:.2f} | {ref / med:.2f}x |")
    table = "\n".join(lines) + "\n"
    print("\n" + table)
    if args.markdown:
        with open(args.markdown, "a") as f:
            f.write(table)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"rounds": args.rounds, "results": results}, f, indent=1)
    print("\ncommands:\n" + "\n".join(f"  {n}: {shlex.quote(c)}" for n, c in
                                       zip(args.name, args.cmd, strict=True)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
