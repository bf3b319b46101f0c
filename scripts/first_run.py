"""The first five minutes: `python topr.py --task countdown` on fresh copies of two commits.

    python scripts/first_run.py --base 7ebd3b2 --seeds 0,1,2,3,4 --out /tmp/first-run

Each commit is exported with `git archive` into its own empty folder (a fresh clone: no runs/, so
topr.py first trains its start model with sft.py's defaults) and the README's command is run there
with --seed 0, the base first, then the new one (--new, default HEAD), back to back: the ratio of
their wall times is the figure (absolute times move 2x between machines). The other seeds then run
in the new copy, from the start model it made (their time is topr.py's alone). Each run's closing
lines give the gains: greedy and T = 1, per size. Run it alone on the machine: the CPU and the load
average at the start are printed with the table.

    python scripts/first_run.py --base "" --scripts rloo,agro,spo --seeds 0,1,2 --time-limit 5 \
        --out /tmp/first-run           # the other scripts' defaults from that start model

With --base "" no base runs and an existing OUT/new is reused (its runs/ holds the start model);
each script in --scripts runs its defaults (`python SCRIPT.py --task countdown --seed S`, plus
--time-limit if given) in the new copy for every seed. --results FILE also writes the table there
(docs/FIRST-RUN.md).
"""
import argparse
import os
import re
import shlex
import subprocess
import sys
import time

from lab import ROOT, repo_relative

LINE = re.compile(r"size (\d+): greedy ([\d.]+) -> ([\d.]+) \(([-+][\d.]+)\), "
                  r"T = 1 ([\d.]+) -> ([\d.]+) \(([-+][\d.]+)\)")


def fresh_copy(rev: str, folder: str) -> str:
    """`git archive REV` unpacked into an empty folder."""
    os.makedirs(folder)
    archive = subprocess.run(["git", "archive", rev], cwd=ROOT, capture_output=True, check=True)
    subprocess.run(["tar", "-x", "-C", folder], input=archive.stdout, check=True)
    return folder


def run(folder: str, script: str, seed: int, log: str, extra: list[str]) -> dict:
    """The README's command for `script` in `folder`: wall seconds and, per size, (start, end,
    gain) greedy and T = 1. Not lab.run_script: that runs in this checkout, this in a fresh copy."""
    t0 = time.time()
    with open(log, "w") as f:
        proc = subprocess.run([sys.executable, f"{script}.py", "--task", "countdown", "--seed",
                               str(seed), *extra], cwd=folder, stdout=f, stderr=subprocess.STDOUT)
    wall = time.time() - t0
    if proc.returncode:
        sys.exit(f"{folder}: exit {proc.returncode}, see {log}")
    sizes = {int(m[1]): tuple(float(x) for x in m.groups()[1:])
             for m in LINE.finditer(open(log).read())}  # the last summary wins
    return {"wall": wall, "sizes": sizes}


def shown(argv: list[str]) -> list[str]:
    """The command line as the doc names it: --out relative to the repository, or OUT where it
    lies outside (a temporary folder is no reader's path)."""
    out = []
    for i, a in enumerate(argv):
        if i and argv[i - 1] == "--out" or a.startswith("--out="):
            value = a.split("=", 1)[1] if a.startswith("--out=") else a
            name = repo_relative(os.path.abspath(value))
            name = "OUT" if os.path.isabs(name) else name
            a = f"--out={name}" if a.startswith("--out=") else name
        out.append(a)
    return out


def cpu() -> str:
    """The CPU and its cores; not lab.machine(), whose other line (GPU, torch) would change
    docs/FIRST-RUN.md's."""
    with open("/proc/cpuinfo") as f:
        names = [line.split(":", 1)[1].strip() for line in f if line.startswith("model name")]
    return f"{names[0] if names else 'unknown CPU'}, {os.cpu_count()} cores"


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--base", default="7ebd3b2", help="the commit to compare with; '': none, and "
                   "OUT/new is reused if it exists")
    p.add_argument("--new", default="HEAD", help="the commit measured")
    p.add_argument("--scripts", default="topr", help="scripts run with their defaults; the "
                   "first at seed 0 is timed against the base's topr.py")
    p.add_argument("--seeds", default="0,1,2,3,4", help="the new commit's seeds")
    p.add_argument("--time-limit", default=None, help="passed to every run of the new commit")
    p.add_argument("--out", required=True, help="an empty or absent folder for the copies")
    p.add_argument("--results", default=None, help="also write the table to this Markdown file")
    args = p.parse_args()
    seeds, scripts = [int(s) for s in args.seeds.split(",")], args.scripts.split(",")
    extra = ["--time-limit", args.time_limit] if args.time_limit else []
    machine = f"{cpu()}; load average at the start {os.getloadavg()[0]:.2f}"
    print(machine, flush=True)
    rows = []
    if args.base:
        base = run(fresh_copy(args.base, f"{args.out}/base"), "topr", 0, f"{args.out}/base.log",
                   [])
        rows.append((f"{args.base} topr.py seed 0 (fresh copy)", base))
    new = f"{args.out}/new"
    label = subprocess.run(["git", "rev-parse", "--short", args.new], cwd=ROOT, check=True,
                           capture_output=True, text=True).stdout.strip()
    if os.path.isdir(new) and not args.base:
        label = f"{shown(['--out', args.out])[1]}/new (reused)"  # an earlier invocation's
    else:
        fresh_copy(args.new, new)
    results = {}
    for script in scripts:
        for s in sorted(seeds, key=lambda s: s != 0):  # seed 0 first: it makes the start model
            results[script, s] = run(new, script, s, f"{args.out}/new-{script}-{s}.log", extra)
            fresh = args.base and (script, s) == (scripts[0], 0)
            name = f"{label} {script}.py seed {s}"
            rows.append((name + (" (fresh copy)" if fresh else " (its start model)"),
                         results[script, s]))
    lines = ["| run | wall (s) | size: greedy start -> end (gain), T = 1 start -> end (gain) |",
             "|---|---|---|"]
    for name, r in rows:
        cells = "; ".join(f"{n}: {a:.1f} -> {b:.1f} ({d:+.1f}), {c:.1f} -> {e:.1f} ({g:+.1f})"
                          for n, (a, b, d, c, e, g) in sorted(r["sizes"].items()))
        lines.append(f"| {name} | {r['wall']:.0f} | {cells} |")
    lines.append("")
    if args.base:
        lines.append(f"- wall time, {args.new} / {args.base}, seed 0 from a fresh copy: "
                     f"{results[scripts[0], 0]['wall'] / base['wall']:.2f}")
    for script in scripts:
        for n in sorted(results[script, seeds[0]]["sizes"]):
            greedy = [results[script, s]["sizes"][n][2] for s in seeds]
            sampled = [results[script, s]["sizes"][n][5] for s in seeds]
            lines.append(f"- {script}.py size {n}, mean gain over seeds {seeds}: greedy "
                         f"{sum(greedy) / len(greedy):+.1f} (lowest {min(greedy):+.1f}), T = 1 "
                         f"{sum(sampled) / len(sampled):+.1f} (lowest {min(sampled):+.1f})")
    print("\n".join(lines))
    if args.results:  # the same lines, with what made them
        command = shown(sys.argv[1:])
        where = " (OUT: a folder outside the repository)" if "OUT" in command else ""
        with open(args.results, "w") as f:
            f.write(f"# The first run, measured\n\nGenerated by `python scripts/first_run.py "
                    f"{shlex.join(command)}`{where}; do not edit by hand.\n\n- {machine}; new: "
                    f"{label}; {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}\n\n"
                    + "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
