"""Short fixed-seed runs of every script, to show that a refactor leaves results bit for bit.

    python scripts/same_metrics.py --model SFT --out /tmp/before          # at the old commit
    python scripts/same_metrics.py --model SFT --out /tmp/after --compare /tmp/before

Each run takes a few steps on one thread with the kv engine and logs its metrics.jsonl; with
--compare, every row of every run (all fields but the wall-clock ones) must equal the other
folder's, and the first difference is printed (`--added /unfinished`: a metric added since, left
out where the older folder lacks it). SFT: a finished sft.py model (sft.py itself starts
from `tiny`). Exit status 1 if anything differs.
"""
import argparse
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
COMMON = ["--eval-size", "8", "--eval-k", "2", "--max-new-tokens", "24", "--threads", "1",
          "--seed", "1", "--engine", "kv"]
RUNS = {  # name: (script, flags); a few optimizer steps, evaluations and checkpoints each
    "sft": ("sft.py", ["--model", "tiny", "--train-size", "200", "--steps", "12", "--batch-size",
                       "16", "--eval-every", "6", "--lr", "1e-3"]),  # lr: 7ebd3b2's default
    "rloo": ("rloo.py", ["--steps", "4", "--prompts", "4", "--group-size", "4",
                         "--eval-every", "2", "--save-every", "2", "--beta", "0.1",
                         "--train-size", "200"]),
    "topr": ("topr.py", ["--iterations", "2", "--prompts", "8", "--group-size", "4",
                         "--batch-size", "8", "--eval-every", "3", "--train-size", "200",
                         "--sampling", "uniform", "--keep", "0"]),  # 7ebd3b2's defaults
    "agro": ("agro.py", ["--mode", "offpolicy", "--steps", "4", "--prompts", "4",
                         "--group-size", "4", "--offline-prompts", "8", "--eval-every", "2",
                         "--save-every", "2", "--train-size", "200"]),  # 7ebd3b2's mode
    "agro-on": ("agro.py", ["--mode", "onpolicy", "--steps", "4", "--prompts", "4",
                            "--group-size", "4", "--eval-every", "2", "--save-every", "2",
                            "--train-size", "200"]),
    "spo": ("spo.py", ["--steps", "4", "--train-size", "8", "--batch-size", "8",
                       "--group-size", "2", "--q0-samples", "4", "--eval-every", "2",
                       "--save-every", "2"]),
}


def rows(run_dir: str) -> list[dict]:
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        return [{k: v for k, v in json.loads(line).items()
                 if k != "time" and not k.startswith("time_")} for line in f]


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", required=True, help="the SFT model the RL scripts start from")
    p.add_argument("--out", required=True, help="folder for the runs (emptied first)")
    p.add_argument("--compare", default=None, help="another --out folder to compare with")
    p.add_argument("--runs", default=",".join(RUNS), help="which runs, comma-separated")
    p.add_argument("--renamed", default="", metavar="OLD=NEW,...",
                   help="metrics renamed since the --compare folder was made, compared by value "
                        "(in every run of --runs: give only the runs that renamed them)")
    p.add_argument("--added", default="", metavar="SUFFIX,...",
                   help="metrics added since the --compare folder was made (names ending so), "
                        "left out of the comparison where that folder lacks them")
    args = p.parse_args()
    model, differ = os.path.abspath(args.model), False
    renamed = dict(pair.split("=", 1) for pair in args.renamed.split(",") if pair)
    for name in args.runs.split(","):
        script, flags = RUNS[name]
        out = os.path.abspath(os.path.join(args.out, name))
        subprocess.run(["rm", "-rf", out])
        start = [] if script == "sft.py" else ["--model", model]
        proc = subprocess.run([sys.executable, script, *start, *flags, *COMMON, "--out", out],
                              cwd=ROOT, capture_output=True, text=True)
        if proc.returncode:
            sys.exit(f"{name}: exit {proc.returncode}\n{proc.stderr[-2000:]}")
        line = f"{name}: {len(rows(out))} rows"
        if args.compare:
            mine, theirs = rows(out), rows(os.path.join(args.compare, name))
            theirs = [{renamed.get(k, k): v for k, v in row.items()} for row in theirs]
            added = tuple(x for x in args.added.split(",") if x)
            mine = [{k: v for k, v in a.items() if k in b or not k.endswith(added)}
                    for a, b in zip(mine, theirs)] + mine[len(theirs):]
            same = mine == theirs
            differ |= not same
            line += ", identical" if same else ", DIFFERENT"
            for i, (a, b) in enumerate(zip(mine, theirs)):
                if a != b:
                    line += f" from row {i}: " + str({k: (a.get(k), b.get(k)) for k in {*a, *b}
                                                      if a.get(k) != b.get(k)})[:300]
                    break
        print(line, flush=True)
    sys.exit(1 if differ else 0)


if __name__ == "__main__":
    main()
