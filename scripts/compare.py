"""Compare the algorithms on one task; write docs/RESULTS.md. One SFT checkpoint, one budget, seeds.

    python scripts/compare.py            # CPU: tiny model, every row, seeds 0,1,2, 3 minutes a run
    python scripts/compare.py --task coins    # another task: docs/RESULTS-coins.md, our rows only
    python scripts/compare.py --sft runs/sft-countdown-TIME/final --time-limit 30 --jobs 1 \
        --engine vllm                    # GPU

1. sft.py trains the starting checkpoint once (or `--sft PATH` reuses one).
2. Every row of ROWS (the course report's configurations, then our defaults) runs its script from
   that checkpoint with `--seed s` for every seed and `--time-limit` minutes of wall clock (data
   generation, Q0 estimation and engine start count against it; [CR]'s TOPR rows run their fixed
   budget to the end instead); `--jobs` runs go side by side.
3. Every final model, and the SFT model, is evaluated here in one way (lab.evaluate: the scripts'
   own evaluation, on the problems that seed holds out, so that the sft row at seed s is every
   seed-s run's step 0) under two decodings: ours (greedy, and k samples at T = 1, the policy
   itself) and the report's (k samples at T = 0.15, top-p 0.9, top-k 30, [CR] §4), so that no
   script grades itself.
4. Writes --results (docs/RESULTS.md: command, commit, date, machine, seeds, the tables, the
   report's Table 1-2 figures beside ours, where the orderings differ), its plot,
   OUT/results.json, and the results block of README.md (between its `results:start` and
   `results:end` markers).

[CR] the course report "Off-Policy Finetuning for LLM Math Reasoning".
An interrupted comparison picks up where it stopped: finished runs (final/ and usage.json) and
finished evaluations (evaluation.json) are kept; an unfinished run starts again.
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import sys
import textwrap
import time

# the shared runner and tables
from lab import (ROOT, commit, evaluate_runs, machine, mean_sd, md_table, read_json, replace_block,
                 repo_relative, run_commands, run_flags, script_command, start_model, write_doc,
                 write_json)

sys.path.insert(0, ROOT)
import common  # noqa: E402
from tasks import get_task  # noqa: E402

# name -> (script, flags, timed). First the course report's configurations (Countdown only), then
# our defaults. Untimed rows run their fixed budget to the end ([CR]'s TOPR: 1,000 completions, 2
# epochs, so that "A then B" reaches B); timed rows get --time-limit. agro off-policy draws 512
# reference prompts, not 2048 (2048 x 8 take ~4 minutes on one thread).
ROWS = {
    "rloo": ("rloo.py", [], True),
    "topr (report: original)": ("topr.py", ["--report-variant", "original"], False),
    "topr (report: A)": ("topr.py", ["--report-variant", "A"], False),
    "topr (report: A then B)": ("topr.py", ["--report-variant", "A+B"], False),
    "topr": ("topr.py", [], True),
    "agro (on-policy)": ("agro.py", ["--mode", "onpolicy"], True),
    "agro (off-policy)": ("agro.py", ["--mode", "offpolicy", "--offline-prompts", "512"], True),
    "spo": ("spo.py", [], True),
}
# [CR] Tables 1 and 2: "average score" (mean reward) with the base Qwen2.5-0.5B, T = 0.15 decoding.
REPORT_TABLE1 = {"sft": 0.3385, "rloo": 0.2140, "topr (report: original)": 0.2270,
                 "topr (report: A)": 0.4060, "topr (report: A then B)": 0.4849}
REPORT_TABLE2 = {"rloo": 0.129, "topr (report: A)": 0.2656, "topr (report: A then B)": 0.1458}
REPORT_DECODING = dict(temperature=0.15, top_p=0.9, top_k=30)
REPORT_TASK = "countdown"  # the report's task: its rows, decoding and figures apply to it alone
REPORT_ROWS = [name for name in ROWS if name.startswith("topr (report")]
COLORS = ["black", "tab:blue", "tab:purple", "tab:pink", "tab:brown", "tab:orange", "tab:olive",
          "tab:green", "tab:red"]
README_START, README_END = "<!-- results:start -->", "<!-- results:end -->"


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    run_flags(p)  # --task, --model, --sft, --seeds, --jobs, --threads, --engine, --eval-*
    p.add_argument("--rows", default=None,
                   help="comma-separated subset of: " + ", ".join(ROWS) + " (default: all; the "
                   "report's rows on Countdown only)")
    p.add_argument("--time-limit", type=common.positive_float, default=3.0, metavar="MIN",
                   help="wall-clock minutes per RL run, all included but the final evaluation")
    p.add_argument("--sizes", default=None,
                   help="held-out sizes, comma-separated (default: the task's)")
    p.add_argument("--out", default=None, help="folder for the runs and results.json (default: "
                   "runs/compare, runs/compare-TASK for another task)")
    p.add_argument("--results", default=None, help="the generated results file, its plot beside "
                   "it (default: docs/RESULTS.md, docs/RESULTS-TASK.md for another task)")
    p.add_argument("--readme", default=None, help="README whose results block is replaced ('' to "
                   "leave it alone; default: README.md for Countdown, none for another task)")
    args = p.parse_args(argv)
    main_task = args.task == REPORT_TASK
    if args.out is None:
        args.out = "runs/compare" if main_task else f"runs/compare-{args.task}"
    if args.results is None:
        args.results = "docs/RESULTS.md" if main_task else f"docs/RESULTS-{args.task}.md"
    if args.readme is None:
        args.readme = "README.md" if main_task else ""
    return p, args


# -------------------------------------------------------------------------------------------------
# RESULTS.md, its plot, the README block
# -------------------------------------------------------------------------------------------------
def table(results: dict, cols: list[tuple[str, str, float]], usage: bool = False) -> str:
    """A markdown table: a row per configuration, mean ± sd over seeds of each (label, key, x)."""
    head = ["configuration"] + [c[0] for c in cols]
    head += ["wall clock (s)", "peak memory (MB)"] * usage
    rows = []
    for name, runs in results["runs"].items():
        cells = [mean_sd([r["eval"][key] for r in runs], scale, 3 if scale == 1 else 1)
                 for _, key, scale in cols]
        if usage:
            cells += [mean_sd([r["usage"]["wall_s"] for r in runs], digits=0),
                      mean_sd([r["usage"]["peak_rss_mb"] for r in runs], digits=0)]
        rows.append([name, *cells])
    return "\n".join(md_table(head, rows)) + "\n"


def main_table(results: dict, sizes: list[int]) -> str:
    """Accuracy (%) every size, greedy and at T = 1; on Countdown also under [CR]'s decoding with
    its mean reward (original), elsewhere the mean reward (the task's default) at T = 1."""
    cols = []
    for n in sizes:
        cols += [(f"{n}: greedy acc", f"eval{n}/greedy/accuracy", 100),
                 (f"{n}: T=1 acc", f"eval{n}/sampled/accuracy", 100)]
        if results["task"] == REPORT_TASK:
            cols += [(f"{n}: [CR] decoding acc", f"eval{n}/report-sampled/accuracy", 100),
                     (f"{n}: [CR] decoding reward", f"eval{n}/report-sampled/reward_original", 1)]
        else:
            reward = results["variants"][0]
            cols += [(f"{n}: T=1 reward {reward}", f"eval{n}/sampled/reward_{reward}", 1)]
    return table(results, cols, usage=True)


def ordering_note(results: dict, first: int) -> str:
    """Where our order of the report's configurations (by mean reward under the report's decoding)
    differs from [CR] Table 1's order."""
    names = [n for n in REPORT_TABLE1 if n in results["runs"]]
    if len(names) < 2:
        return ""
    ours = {n: statistics.mean(r["eval"][f"eval{first}/report-sampled/reward_original"]
                               for r in results["runs"][n]) for n in names}
    theirs = sorted(names, key=REPORT_TABLE1.get, reverse=True)
    mine = sorted(names, key=ours.get, reverse=True)
    if mine == theirs:
        return f"Our order of these rows is the report's: {' > '.join(theirs)}.\n"
    return (f"**The orders differ.** [CR] Table 1: {' > '.join(theirs)}. Ours ({first} numbers, "
            f"[CR] decoding, mean reward): {' > '.join(mine)}.\n")


def curve(run_dir: str, key: str):
    """(wall-clock s, completions trained on, value) at each periodic evaluation of a run."""
    xs_t, xs_n, ys, seen = [], [], [], 0
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        for line in f:
            row = json.loads(line)
            seen += row.get("samples", 0)
            if key in row:
                xs_t.append(row["time"]), xs_n.append(seen), ys.append(row[key])
    return xs_t, xs_n, ys


def plot(results: dict, first: int, task: str, path: str) -> None:
    """Held-out sampled accuracy (T = 1, each run's own evaluations) against wall clock."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    key = f"eval{first}/sampled/accuracy"
    fig, ax = plt.subplots(figsize=(9, 5.5), constrained_layout=True)
    for color, (name, runs) in zip(COLORS, results["runs"].items()):
        if name == "sft":
            sft = statistics.mean(r["eval"][key] for r in runs)
            ax.axhline(sft, color=color, ls="--", lw=1, label="sft (start)")
            continue
        for i, r in enumerate(runs):
            xt, _, ys = curve(r["dir"], key)
            ax.plot(xt, ys, color=color, alpha=0.8, lw=1.2, marker=".",
                    label=name if i == 0 else None)
    ax.set_xlabel("wall clock of the RL run (s)")
    ax.set_ylabel(f"held-out accuracy, size {first}, T = 1")
    ax.grid(alpha=0.3)
    ax.legend(loc="best", fontsize=8, title="one line per seed")
    ax.set_title(f"{task}: RL from one SFT checkpoint, same wall-clock budget")
    fig.savefig(path, dpi=100)


def report_section(results: dict, first: int) -> str:
    """[CR]'s Table 1-2 figures beside ours, and where the orders differ (Countdown only)."""
    if results["task"] != REPORT_TASK:
        return ""
    report = ["| configuration | [CR] Table 1 (200 puzzles) | [CR] Table 2 (1,000 harder) |",
              "|---|---|---|"]
    report += [f"| {n} | {REPORT_TABLE1[n]} | {REPORT_TABLE2.get(n, '')} |" for n in REPORT_TABLE1]
    return f"""## The course report's own figures

[CR] Tables 1 and 2 report the mean reward of the base Qwen2.5-0.5B under its decoding; hold them
beside the "[CR] decoding reward" column above (our model is a 1M-parameter character-level model,
so levels differ; the order of rows is what can agree).

{chr(10).join(report)}

{ordering_note(results, first)}
"""


def write_results(results: dict, args, sizes: list[int], argv: list[str]) -> str:
    first, k = sizes[0], args.eval_k
    extra = table(results, [(f"{first}: pass@{k}", f"eval{first}/pass@{k}", 100),
                            (f"{first}: format", f"eval{first}/sampled/format_rate", 100),
                            (f"{first}: length", f"eval{first}/sampled/length", 1)]
                  + [(f"{first}: reward {v}", f"eval{first}/sampled/reward_{v}", 1)
                     for v in results["variants"]])
    rows = "\n".join(f"- {name}: `python {ROWS[name][0]} {shlex.join(ROWS[name][1])}`"
                     + ("" if ROWS[name][2] else " (its fixed budget, untimed)")
                     for name in results["runs"] if name in ROWS)
    if args.task == REPORT_TASK:
        budget = ("except [CR]'s TOPR rows, which run their fixed budget (1,000 completions, 2 "
                  "epochs) to the end")
        decoding = (f"[CR] decoding: {k} samples at T = 0.15, top-p 0.9, top-k 30, the course "
                    "report's evaluation. Reward: \"original\" ([CR] §3.3).")
    else:
        budget = "every row its script's defaults"
        decoding = f"Reward: \"{results['variants'][0]}\" (the task's default)."
    facts = [f"commit {commit()}, {time.strftime('%Y-%m-%d %H:%M %Z')}{runs_commit(args)}",
             f"machine: {machine()}",
             f"task {args.task}; every RL run starts from one SFT checkpoint and has "
             f"{args.time_limit} minutes of wall clock, {budget} ({args.jobs} runs side by side, "
             f"{args.threads} torch thread(s) each, engine {args.engine}); seeds {args.seeds}; "
             "mean ± sd over seeds",
             f"held-out: the {args.eval_size} problems of each size ({', '.join(map(str, sizes))}) "
             "that the seed holds out, the same for every row (the scripts' own evaluation: the "
             "sft row at seed s is each seed-s run's step 0). Greedy: one completion. T=1: "
             f"{k} samples at temperature 1. {decoding}"]
    facts = "\n".join(textwrap.fill(f, 100, initial_indent="- ", subsequent_indent="  ")
                      for f in facts)
    command = shlex.join(map(repo_relative, argv))
    text = f"""# Results{"" if args.task == REPORT_TASK else f": {args.task}"}

Generated by `python scripts/compare.py {command}`; do not edit by hand.

{facts}

## Accuracy (%) and mean reward

{main_table(results, sizes)}
![learning curves]({os.path.basename(plot_path(args))})

{report_section(results, first)}## More metrics (T = 1, size {first})

{extra}
## Commands of the rows

{rows}"""
    return write_doc(args.results, text)  # the notes and time_to_accuracy.py's block after it


def plot_path(args) -> str:
    return os.path.splitext(args.results)[0] + ".png"


# README's first screen: where every script starts, and each at its defaults (agro.py's: on-policy)
README_ROWS = {"sft": "sft.py (the start)", "rloo": "rloo.py", "topr": "topr.py",
               "agro (on-policy)": "agro.py", "spo": "spo.py"}


def update_readme(path: str, results: dict, sizes: list[int], args) -> None:
    """Replace README's results block with a five-row table (held-out accuracy at T = 1 and
    greedy of each script at its defaults) linking RESULTS.md and its curves."""
    here = os.path.dirname(os.path.abspath(path))
    cols = [(f"{n} numbers: {label}", f"eval{n}/{mode}/accuracy", 100)
            for n in sizes for label, mode in (("T = 1", "sampled"), ("greedy", "greedy"))]
    runs = {README_ROWS[k]: v for k, v in results["runs"].items() if k in README_ROWS}
    seeds = len(next(iter(runs.values())))
    new = (f"{README_START}\n<!-- generated by scripts/compare.py; do not edit -->\n"
             + table({**results, "runs": runs}, cols).replace("| configuration", "| script")
             + f"\nHeld-out accuracy (%), mean ± sd over {seeds} seeds; every RL script had "
             f"{args.time_limit:g} minutes of wall clock from the same SFT model. The scripts "
             "train the policy sampled at T = 1; greedy accuracy is not what they optimise. "
             "Command, more metrics and configurations: "
             f"[{os.path.relpath(args.results, here)}]({os.path.relpath(args.results, here)}); "
             f"[the learning curves]({os.path.relpath(plot_path(args), here)}).\n{README_END}")
    replace_block(path, README_START, README_END, new)


# -------------------------------------------------------------------------------------------------
# main
# -------------------------------------------------------------------------------------------------
def int_list(text: str, flag: str) -> list[int]:
    try:
        return [int(s) for s in text.split(",")]
    except ValueError:
        raise ValueError(f"{flag}: expected comma-separated integers, got {text!r}") from None


def row_list(text: str, known) -> list[str]:
    """--rows: comma-separated names of `known`, or ValueError naming the unknown ones."""
    rows = [r.strip() for r in text.split(",") if r.strip()]
    unknown = [r for r in rows if r not in known]
    if unknown:
        raise ValueError(f"--rows: unknown {', '.join(unknown)}; choose from {', '.join(known)}")
    return rows


def check_args(args, parser):
    """Every bad input as one line and exit status 2, before anything runs."""
    try:
        task = get_task(args.task)
        main_task = args.task == REPORT_TASK
        rows = row_list(args.rows, ROWS) if args.rows else [
            r for r in ROWS if main_task or r not in REPORT_ROWS]
        if not main_task and set(rows) & set(REPORT_ROWS):
            raise ValueError(f"--rows: the course report's rows run on {REPORT_TASK} only")
        seeds = int_list(args.seeds, "--seeds")
        sizes = int_list(args.sizes, "--sizes") if args.sizes else list(task.SIZES)
        if args.sft is not None and not os.path.isdir(args.sft):
            raise ValueError(f"--sft {args.sft}: no such checkpoint")
        check_out_folder(args)
    except ValueError as e:
        parser.error(str(e))
    return task, rows, seeds, sizes


SETTINGS = ("task", "model", "sft", "time_limit", "threads", "engine", "eval_size", "eval_k",
            "sizes")


def check_out_folder(args) -> None:
    """Finished runs in --out are reused only if they were made with the same settings."""
    path = os.path.join(args.out, "settings.json")
    mine = {k: getattr(args, k) for k in SETTINGS}
    if os.path.exists(path):
        try:
            with open(path) as f:
                theirs = json.load(f)
        except (OSError, json.JSONDecodeError):
            raise ValueError(f"--out {args.out}: settings.json there is unreadable") from None
        other = [f"{k} {theirs.get(k)!r} (now {mine[k]!r})" for k in SETTINGS
                 if theirs.get(k) != mine[k]]
        if other:
            raise ValueError(f"--out {args.out} holds runs made with other settings: "
                             f"{', '.join(other)}; choose another --out")
        mine["commit"] = theirs.get("commit", "unknown")  # the code its first runs were made with
    elif os.path.isdir(args.out) and os.listdir(args.out):
        raise ValueError(f"--out {args.out} exists and is not a comparison's folder")
    else:
        mine["commit"] = commit()
    os.makedirs(args.out, exist_ok=True)
    write_json(path, mine)


def runs_commit(args) -> str:
    """The commit --out's first runs were made at (settings.json), if not the one writing now."""
    path = os.path.join(args.out, "settings.json")
    made = read_json(path).get("commit") if os.path.exists(path) else None
    return f"; runs made at commit {made}" if made and made != commit() else ""


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    parser, args = parse_args(argv)
    task, rows, seeds, sizes = check_args(args, parser)
    out = os.path.abspath(args.out)
    log_dir = os.path.join(out, "logs")
    os.makedirs(log_dir, exist_ok=True)
    started = time.time()
    sft_path, sft_usage = start_model(args, out, log_dir)  # 1. where every RL run starts

    # 2. the RL runs, --jobs at a time: timed rows get --time-limit, [CR]'s TOPR rows run to the end
    runs = {(name, s): os.path.join(out, f"{name.replace(' ', '_').replace(':', '')}-s{s}")
            for s in seeds for name in rows}
    usage = run_commands({d: script_command(ROWS[name][0], ROWS[name][1], sft_path, s, d, args,
                                            args.time_limit if ROWS[name][2] else None)
                          for (name, s), d in runs.items()}, args.jobs, log_dir)

    # 3. one evaluation of every final model and of the SFT model (lab.evaluate), --jobs at a time
    extra = {"report": REPORT_DECODING} if args.task == REPORT_TASK else None  # [CR]'s too
    sft_evals, evals = evaluate_runs(sft_path, {d: s for (_, s), d in runs.items()}, seeds, out,
                                     sizes, args, extra)
    results = {"task": args.task, "variants": list(task.REWARD_VARIANTS), "runs": {
        "sft": [{"dir": None, "usage": sft_usage, "eval": sft_evals[s]} for s in seeds]}}
    for name in rows:
        dirs = [runs[name, s] for s in seeds]
        results["runs"][name] = [{"dir": d, "usage": usage[d], "eval": evals[d]} for d in dirs]

    # 4. RESULTS.md, its plot, results.json, README's block
    write_json(os.path.join(out, "results.json"), results)
    os.makedirs(os.path.dirname(os.path.abspath(args.results)), exist_ok=True)
    plot(results, sizes[0], args.task, plot_path(args))
    print(write_results(results, args, sizes, argv))
    if args.readme:
        update_readme(args.readme, results, sizes, args)
    print(f"[compare] {time.time() - started:.0f} s in all; {args.results}, {plot_path(args)}")


if __name__ == "__main__":
    main()
