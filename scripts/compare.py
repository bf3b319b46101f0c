"""Compare the five algorithms on one task: one SFT checkpoint, the same wall-clock budget, several seeds.

    python scripts/compare.py                       # CPU: tiny model, 3 seeds, 3 minutes per RL run
    python scripts/compare.py --sft runs/sft-countdown-TIME/final --time-limit 30 --jobs 1 --engine vllm  # GPU
(`--model` only reaches sft.py, whose other defaults are the tiny model's: train a real model's SFT checkpoint
as in the README's GPU section and pass it as --sft.)

1. sft.py trains the starting checkpoint once (or `--sft PATH` reuses one).
2. rloo.py, topr.py, agro.py and spo.py each start from it with their own defaults, `--seed s` for every
   seed and `--time-limit` minutes of wall-clock (data generation, Q0 estimation and engine start count
   against it); `--jobs` runs go side by side, each with `--threads` torch threads.
3. Every final model, and the SFT model, is evaluated here in the same way (common.evaluate, same held-out
   puzzles, greedy and k samples at temperature 1, rewards under every variant), so that no script grades
   itself. The SFT row's spread is over evaluation seeds only.
4. Writes OUT/results.md (mean ± standard deviation over seeds), OUT/results.json and OUT/curves.png
   (held-out sampled accuracy and reward against wall-clock and against completions trained on, from each
   run's own periodic evaluations; one thin line per seed).

An interrupted comparison picks up where it stopped: finished runs (those with final/) and finished
evaluations (eval.json) are kept; an unfinished run is started again.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
import common  # noqa: E402
from tasks import get_task  # noqa: E402

ALGORITHMS = ("rloo", "topr", "agro", "spo")
# Each script runs with its own defaults, except: agro.py draws fewer reference samples up front (2048 prompts
# x 8 take about 4 minutes on one CPU thread, which would eat the whole budget of a short comparison).
EXTRA = {"agro": ["--offline-prompts", "512"]}
COLORS = {"sft": "black", "rloo": "tab:blue", "topr": "tab:orange", "agro": "tab:green", "spo": "tab:red"}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--task", default="countdown")
    p.add_argument("--model", default="tiny", help="the model sft.py starts from (tiny, a folder or a hub id)")
    p.add_argument("--sft", default=None, help="reuse this SFT checkpoint instead of running sft.py")
    p.add_argument("--algorithms", default=",".join(ALGORITHMS), help="comma-separated subset of " + ", ".join(ALGORITHMS))
    p.add_argument("--seeds", default="0,1,2", help="comma-separated seeds for the RL runs")
    p.add_argument("--time-limit", type=common.positive_float, default=3.0, metavar="MIN",
                   help="wall-clock minutes per RL run, everything included but the final evaluation")
    p.add_argument("--jobs", type=common.positive_int, default=2, help="runs side by side")
    p.add_argument("--threads", type=common.positive_int, default=1, help="torch threads per run")
    p.add_argument("--engine", default="hf", choices=["auto", "vllm", "hf"],
                   help="generation engine of the RL runs (hf: fastest for the tiny model on a CPU; vllm on a GPU)")
    p.add_argument("--eval-size", type=common.positive_int, default=200, help="held-out puzzles per size")
    p.add_argument("--eval-k", type=common.positive_int, default=8, help="samples per puzzle (pass@k)")
    p.add_argument("--num-numbers", default="3,4", help="held-out puzzle sizes")
    p.add_argument("--out", default="runs/compare", help="folder for runs, table and plot")
    return p, p.parse_args(argv)


# ---------------------------------------------------------------------------------------------------
# Running the scripts
# ---------------------------------------------------------------------------------------------------
def run_script(name: str, cmd: list[str], out_dir: str, log_dir: str) -> dict:
    """Run one training script to completion; wall-clock and peak resident memory of that process."""
    if os.path.isdir(os.path.join(out_dir, "final")) and os.path.exists(os.path.join(out_dir, "usage.json")):
        with open(os.path.join(out_dir, "usage.json")) as f:
            return json.load(f)  # finished in an earlier invocation
    shutil.rmtree(out_dir, ignore_errors=True)  # an unfinished run starts again
    print(f"[compare] start {name}: {' '.join(cmd)}", flush=True)
    t0 = time.time()
    with open(os.path.join(log_dir, f"{name}.log"), "w") as log:
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
        _, status, rusage = os.wait4(proc.pid, 0)  # rusage of this child alone
    usage = {"wall_s": time.time() - t0, "peak_rss_mb": rusage.ru_maxrss / 1024}
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"compare.py: {name} failed (exit {os.waitstatus_to_exitcode(status)}), see {log_dir}/{name}.log")
    with open(os.path.join(out_dir, "usage.json"), "w") as f:
        json.dump(usage, f)
    print(f"[compare] done  {name}: {usage['wall_s']:.0f} s, {usage['peak_rss_mb']:.0f} MB", flush=True)
    return usage


def evaluate_model(path: str, task, eval_sets: dict, args, seed: int) -> dict:
    """The one evaluation of every final model: HF generate, same puzzles, all reward variants."""
    common.setup(seed, args.threads)
    model, tokenizer = common.load_model(path)
    style = common.prompt_style(model, tokenizer)
    engine = common.HFEngine(model, tokenizer)
    metrics = {}
    for n, problems in eval_sets.items():
        prompts = common.encode_prompts(task, problems, tokenizer, style)
        metrics.update(common.evaluate(engine, task, problems, prompts, k=args.eval_k, prefix=f"eval{n}/",
                                       all_rewards=True))
    return metrics


# ---------------------------------------------------------------------------------------------------
# Table and plot
# ---------------------------------------------------------------------------------------------------
def mean_sd(values: list[float], scale: float = 1.0, digits: int = 1) -> str:
    values = [v * scale for v in values]
    if len(values) == 1:
        return f"{values[0]:.{digits}f}"
    return f"{statistics.mean(values):.{digits}f} ± {statistics.stdev(values):.{digits}f}"


def write_table(results: dict, args, sizes: list[int], path: str) -> str:
    k, first = args.eval_k, sizes[0]
    cols = ([(f"greedy acc {n} (%)", f"eval{n}/greedy/accuracy", 100) for n in sizes]
            + [(f"sampled acc {n} (%)", f"eval{n}/sampled/accuracy", 100) for n in sizes]
            + [(f"reward {v} ({first})", f"eval{first}/sampled/reward_{v}", 1) for v in results["variants"]]
            + [(f"format ({first}, %)", f"eval{first}/sampled/format_rate", 100),
               (f"pass@{k} ({first}, %)", f"eval{first}/pass@{k}", 100),
               (f"length ({first})", f"eval{first}/sampled/length", 1)])
    lines = ["| algorithm | " + " | ".join(c[0] for c in cols) + " | wall-clock (s) | peak memory (MB) |",
             "|---" * (len(cols) + 3) + "|"]
    for name, runs in results["runs"].items():
        cells = [mean_sd([r["eval"][key] for r in runs], scale, 3 if "reward" in key else 1) for _, key, scale in cols]
        cells += [mean_sd([r["usage"]["wall_s"] for r in runs], digits=0),
                  mean_sd([r["usage"]["peak_rss_mb"] for r in runs], digits=0)]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    text = "\n".join(lines) + "\n"
    with open(path, "w") as f:
        f.write(f"Held-out {args.task}, {args.eval_size} puzzles per size, sampled = {k} samples at temperature 1; "
                f"mean ± sd over seeds {args.seeds}; RL runs {args.time_limit} min each from one SFT checkpoint.\n\n")
        f.write(text)
    return text


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


def plot(results: dict, first: int, path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(11, 8), constrained_layout=True)
    for row, (key, label) in enumerate([(f"eval{first}/sampled/accuracy", f"held-out accuracy, {first} numbers (T=1)"),
                                        (f"eval{first}/sampled/reward", f"held-out mean reward, {first} numbers")]):
        for col, xlabel in enumerate(["wall-clock of the RL run (s)", "completions trained on"]):
            ax = axes[row][col]
            sft = [r["eval"][key] for r in results["runs"]["sft"]]
            ax.axhline(statistics.mean(sft), color=COLORS["sft"], ls="--", lw=1, label="SFT start")
            for name, runs in results["runs"].items():
                if name == "sft":
                    continue
                for i, r in enumerate(runs):
                    xt, xn, ys = curve(r["dir"], key)
                    ax.plot(xt if col == 0 else xn, ys, color=COLORS.get(name), alpha=0.7, lw=1.2, marker=".",
                            label=name if i == 0 else None)
            ax.set_xlabel(xlabel)
            ax.set_ylabel(label)
            ax.grid(alpha=0.3)
    axes[0][0].legend(loc="best", fontsize=9, title="one line per seed")
    fig.suptitle("Countdown: RL from one SFT checkpoint, same wall-clock budget")
    fig.savefig(path, dpi=110)


def int_list(text: str, flag: str) -> list[int]:
    try:
        return [int(s) for s in text.split(",")]
    except ValueError:
        raise ValueError(f"{flag}: expected comma-separated integers, got {text!r}") from None


def main(argv=None):
    parser, args = parse_args(argv)
    try:
        task = get_task(args.task)
        algorithms = [a for a in args.algorithms.split(",") if a]
        unknown = [a for a in algorithms if a not in ALGORITHMS]
        if unknown:
            raise ValueError(f"--algorithms: unknown {', '.join(unknown)}; choose from {', '.join(ALGORITHMS)}")
        seeds, sizes = int_list(args.seeds, "--seeds"), int_list(args.num_numbers, "--num-numbers")
        if args.sft and common.checkpoint_path(args.sft) is None and not os.path.isdir(args.sft):
            raise ValueError(f"--sft {args.sft}: no such checkpoint")
    except ValueError as e:
        parser.error(str(e))
    out = os.path.abspath(args.out)
    log_dir = os.path.join(out, "logs")
    os.makedirs(log_dir, exist_ok=True)
    py = sys.executable
    started = time.time()

    # 1. the SFT checkpoint every RL run starts from
    if args.sft:
        sft_path, sft_usage = os.path.abspath(args.sft), {"wall_s": float("nan"), "peak_rss_mb": float("nan")}
    else:
        sft_dir = os.path.join(out, "sft")
        sft_usage = run_script("sft", [py, "sft.py", "--task", args.task, "--model", args.model, "--out", sft_dir,
                                       "--threads", str(args.threads * args.jobs)], sft_dir, log_dir)
        sft_path = os.path.join(sft_dir, "final")

    # 2. the RL runs, --jobs at a time
    jobs = [(a, s) for s in seeds for a in algorithms]
    def train(job):
        algo, seed = job
        run_dir = os.path.join(out, f"{algo}-s{seed}")
        cmd = [py, f"{algo}.py", "--task", args.task, "--model", sft_path, "--out", run_dir, "--seed", str(seed),
               "--time-limit", str(args.time_limit), "--threads", str(args.threads), "--engine", args.engine,
               *EXTRA.get(algo, [])]
        return run_script(f"{algo}-s{seed}", cmd, run_dir, log_dir)
    with ThreadPoolExecutor(args.jobs) as pool:
        usages = dict(zip(jobs, pool.map(train, jobs)))

    # 3. one evaluation for every final model, on the same held-out puzzles
    eval_sets = {n: task.get_problems("test", args.eval_size, size=n, seed=0) for n in sizes}
    results = {"variants": list(task.REWARD_VARIANTS), "runs": {"sft": []}}
    for seed in seeds:
        results["runs"]["sft"].append({"dir": None, "usage": sft_usage,
                                       "eval": cached_eval(os.path.join(out, f"sft-eval-s{seed}.json"), sft_path,
                                                           task, eval_sets, args, seed)})
    for (algo, seed), usage in usages.items():
        run_dir = os.path.join(out, f"{algo}-s{seed}")
        metrics = cached_eval(os.path.join(run_dir, "eval.json"), os.path.join(run_dir, "final"), task, eval_sets, args, seed)
        results["runs"].setdefault(algo, []).append({"dir": run_dir, "usage": usage, "eval": metrics})

    # 4. table and plot
    with open(os.path.join(out, "results.json"), "w") as f:
        json.dump(results, f, indent=1)
    print(write_table(results, args, sizes, os.path.join(out, "results.md")))
    plot(results, sizes[0], os.path.join(out, "curves.png"))
    print(f"[compare] {time.time() - started:.0f} s in all; {out}/results.md, {out}/curves.png")


def cached_eval(path: str, model_path: str, task, eval_sets: dict, args, seed: int) -> dict:
    if not os.path.exists(path):
        metrics = evaluate_model(model_path, task, eval_sets, args, seed)
        with open(path + ".tmp", "w") as f:
            json.dump(metrics, f)
        os.replace(path + ".tmp", path)
    with open(path) as f:
        return json.load(f)


if __name__ == "__main__":
    main()
