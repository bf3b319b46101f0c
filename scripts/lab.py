"""The runner every experiment script uses: one command to completion, a finished run kept; the
flags, start model, commands, runs and kept held-out evaluations of an experiment from one start
model; jobs side by side on threads or in fresh processes; JSON files; mean ± sd cells and
Markdown tables; a generated doc written with its notes, and a marked block of one; the machine
and commit lines of a generated doc.
Nothing here knows an experiment (compare.py, sweep.py, time_to_accuracy.py, claims.py do).
"""
from __future__ import annotations

import argparse
import json
import math
import multiprocessing
import os
import platform
import shlex
import shutil
import statistics
import subprocess
import sys
import time
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# ---- Running -------------------------------------------------------------------------------------
def run_script(name: str, cmd: list[str], out_dir: str, log_dir: str) -> dict:
    """Run one training script to completion; wall clock and peak resident memory of its process.
    A finished run (final/ and usage.json in out_dir) is kept, so an interrupted experiment goes on
    where it stopped."""
    me = os.path.basename(sys.argv[0])  # the experiment that runs it, in its messages
    usage_file = os.path.join(out_dir, "usage.json")
    if os.path.isdir(os.path.join(out_dir, "final")) and os.path.exists(usage_file):
        return read_json(usage_file)  # finished in an earlier invocation
    shutil.rmtree(out_dir, ignore_errors=True)  # an unfinished run starts again
    print(f"[{me}] start {name}: {shlex.join(cmd)}", flush=True)
    t0 = time.time()
    with open(os.path.join(log_dir, f"{name}.log"), "w") as log:
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
        _, status, rusage = os.wait4(proc.pid, 0)  # rusage of this child alone
    usage = {"wall_s": time.time() - t0, "peak_rss_mb": rusage.ru_maxrss / 1024, "cmd": cmd}
    code = os.waitstatus_to_exitcode(status)
    if code in (130, -2):  # Ctrl-C reached the run too: its last checkpoint stands
        print(f"{me}: interrupted; run the same command again to continue (finished runs and "
              "evaluations are kept)", file=sys.stderr)
        raise SystemExit(130)
    if code != 0:
        raise SystemExit(f"{me}: {name} failed (exit {code}), see {log_dir}/{name}.log")
    write_json(usage_file, usage)
    print(f"[{me}] done  {name}: {usage['wall_s']:.0f} s, {usage['peak_rss_mb']:.0f} MB",
          flush=True)
    return usage


def eval_tokens(model) -> int:
    """New tokens a completion gets in an experiment's own evaluation: the scripts' default
    --max-new-tokens for this model (64 for tiny, 512 for a pretrained one: its answers are
    longer)."""
    sys.path.insert(0, ROOT)
    import common  # the model side; imported here so that lab stays light for the renderers
    return 64 if common.is_tiny(model) else 512


EVAL_SEED = 0  # the scripts' own (rloo.py, topr.py, ...): every model meets the same T = 1 draws


def evaluate(model_path: str, task_name: str, seed: int, k: int, size: int, threads: int,
             sizes: list[int] | None = None, extra: dict | None = None) -> dict:
    """The scripts' own held-out evaluation of one model, in this process (a seed-s run's step-0
    figures are this of its start model): the `size` test problems of each of `sizes` (None: the
    task's) that --seed seed holds out, a greedy completion and k samples at T = 1 drawn with
    EVAL_SEED, every reward variant (keys eval{n}/greedy/..., eval{n}/sampled/..., eval{n}/pass@k);
    `extra` {name: decoding} adds k samples under each (keys eval{n}/name-sampled/...)."""
    sys.path.insert(0, ROOT)
    import common
    from tasks import get_task, problem_sets, scoring
    common.setup(seed, threads)
    task = get_task(task_name)
    model, tokenizer = common.load_model(model_path)
    engine = common.make_engine("auto", model, tokenizer, model_path, seed=seed)
    style, tokens = common.prompt_style(model, tokenizer), eval_tokens(model)
    ours = {"greedy": common.SamplingConfig(1, tokens, 0.0),
            "sampled": common.SamplingConfig(k, tokens, seed=EVAL_SEED)}
    metrics = {}
    _, held_out = problem_sets(task, sizes=None, train_size=1, eval_sizes=sizes, eval_size=size,
                               seed=seed)  # the scripts' own held-out sets (a pool of 1, unused)
    for n, problems in held_out.items():
        prompts = common.encode_prompts(task, problems, tokenizer, style)
        metrics.update(scoring.evaluate(engine, task, problems, prompts, ours,
                                        prefix=f"eval{n}/", all_rewards=True))
        for name, decoding in (extra or {}).items():
            sampled = {"sampled": common.SamplingConfig(k, tokens, seed=EVAL_SEED, **decoding)}
            metrics.update(scoring.evaluate(engine, task, problems, prompts, sampled,
                                            prefix=f"eval{n}/{name}-", all_rewards=True))
    return metrics


def run_flags(p: argparse.ArgumentParser) -> None:
    """The flags of an experiment that makes or takes a start model and evaluates runs from it
    (compare.py, time_to_accuracy.py): task and start model, seeds, how the runs run, and how
    evaluate() and start_model() read them."""
    sys.path.insert(0, ROOT)
    import common
    p.add_argument("--task", default="countdown")
    p.add_argument("--model", default="tiny",
                   help="the model sft.py starts from (tiny, a folder, a hub id)")
    p.add_argument("--sft", default=None,
                   help="reuse this SFT checkpoint instead of running sft.py")
    p.add_argument("--seeds", default="0,1,2", help="comma-separated seeds for the RL runs")
    p.add_argument("--jobs", type=common.positive_int, default=2, help="runs side by side")
    p.add_argument("--threads", type=common.positive_int, default=1, help="torch threads per run")
    p.add_argument("--engine", default="auto", choices=common.ENGINES,
                   help="engine of the RL runs; auto: vLLM on a GPU, else kv (common.make_engine)")
    p.add_argument("--eval-size", type=common.positive_int, default=200,
                   help="held-out problems per size")
    p.add_argument("--eval-k", type=common.positive_int, default=8, help="samples per problem")


def start_model(args, out: str, log_dir: str) -> tuple[str, dict]:
    """The SFT checkpoint every run starts from, and its usage: --sft's (not measured here: NaN),
    else sft.py's run from --model on --task in OUT/sft, on the threads of every run at once."""
    if args.sft:
        return os.path.abspath(args.sft), {"wall_s": math.nan, "peak_rss_mb": math.nan}
    sft_dir = os.path.join(out, "sft")
    cmd = [sys.executable, "sft.py", "--task", args.task, "--model", args.model, "--out", sft_dir,
           "--threads", str(args.threads * args.jobs)]
    return os.path.join(sft_dir, "final"), run_script("sft", cmd, sft_dir, log_dir)


def evaluate_kept(path: str, model_path: str, task_name: str, sizes: list[int] | None, args,
                  seed: int, extra: dict | None = None) -> dict:
    """evaluate() of one model at --eval-k, --eval-size and --threads, computed once and kept in
    `path` (JSON)."""
    if not os.path.exists(path):
        write_json(path, evaluate(model_path, task_name, seed, args.eval_k, args.eval_size,
                                  args.threads, sizes, extra))
    return read_json(path)


def side_by_side(fn, jobs: list, n: int) -> list:
    """fn(*job) for every job, n at a time on threads (each waits on a subprocess), in order."""
    with ThreadPoolExecutor(n) as pool:
        return list(pool.map(lambda job: fn(*job), jobs))


def in_processes(fn, jobs: list, n: int) -> list:
    """fn(*job) for every job, n at a time, each in a fresh interpreter (torch's state is per
    process), in order."""
    with ProcessPoolExecutor(n, mp_context=multiprocessing.get_context("spawn")) as pool:
        return list(pool.map(fn, *zip(*jobs)))


EVAL_FILE = "evaluation.json"  # evaluate_kept's in a run's folder (eval.json: an older protocol)


def script_command(script: str, flags: list[str], start: str, seed: int, out: str, args,
                   minutes: float | None = None) -> list[str]:
    """The command of one run of an algorithm script from the start model, into `out`: the
    experiment's --task, --threads and --engine, --time-limit `minutes` (None: the script's own
    budget, run to its end), then the row's flags."""
    limit = ["--time-limit", f"{minutes:g}"] if minutes else []
    return [sys.executable, script, "--task", args.task, "--model", start, "--out", out,
            "--seed", str(seed), "--threads", str(args.threads), "--engine", args.engine, *limit,
            *flags]


def run_commands(commands: dict, n: int, log_dir: str) -> dict:
    """Every command {run folder: command} to completion (run_script: a finished run kept), n side
    by side: {run folder: its usage}."""
    folders = list(commands)
    usage = side_by_side(lambda out: run_script(os.path.basename(out), commands[out], out, log_dir),
                         [(out,) for out in folders], n)
    return dict(zip(folders, usage))


def evaluate_runs(start: str, runs: dict, seeds: list[int], out: str, sizes: list[int] | None,
                  args, extra: dict | None = None) -> tuple[dict, dict]:
    """evaluate_kept of the start model at every seed (kept in OUT/sft-sSEED-evaluation.json) and
    of every run's final model (runs: {run folder: its seed}; kept in the run's folder), --jobs at
    a time in fresh processes: ({seed: the start model's figures}, {run folder: its figures})."""
    todo = [(os.path.join(out, f"sft-s{s}-{EVAL_FILE}"), start, s) for s in seeds]
    todo += [(os.path.join(d, EVAL_FILE), os.path.join(d, "final"), s) for d, s in runs.items()]
    evals = in_processes(evaluate_kept, [(path, model, args.task, sizes, args, s, extra)
                                         for path, model, s in todo], args.jobs)
    return dict(zip(seeds, evals)), dict(zip(runs, evals[len(seeds):]))


def write_json(path: str, obj) -> None:
    """Written into a temporary sibling and renamed: an interrupted run never leaves half a file."""
    with open(path + ".tmp", "w") as f:
        json.dump(obj, f)
    os.replace(path + ".tmp", path)


def read_json(path: str) -> dict:
    """A JSON file of the output folder, or one line naming it (exit status 2)."""
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        raise SystemExit(f"{os.path.basename(sys.argv[0])}: error: {path} is unreadable ({e}); "
                         "delete it to redo that step, or choose another --out") from None


# ---- Tables --------------------------------------------------------------------------------------
def mean_sd(values: list[float], scale: float = 1.0, digits: int = 1) -> str:
    """A cell: mean ± sd of the scaled values over seeds, one value alone, "-" if any is NaN."""
    values = [v * scale for v in values]
    if any(math.isnan(v) for v in values):  # not measured (compare.py's sft row under --sft)
        return "-"
    if len(values) == 1:
        return f"{values[0]:.{digits}f}"
    return f"{statistics.mean(values):.{digits}f} ± {statistics.stdev(values):.{digits}f}"


def md_table(header: list[str], rows: list[list[str]]) -> list[str]:
    """A Markdown table's lines: the header, its `|---|` line, the rows."""
    lines = ["| " + " | ".join(cells) + " |" for cells in [header, *rows]]
    return lines[:1] + ["|---" * len(header) + "|"] + lines[1:]


# ---- A marked block of a generated file ---------------------------------------------------------
def block(path: str, start: str, end: str) -> str | None:
    """The block of the file at path from the marker `start` to the marker `end`, both included;
    None where the file or a marker is missing."""
    text = open(path).read() if os.path.exists(path) else ""
    if start not in text or end not in text:
        return None
    return text[text.index(start):text.index(end) + len(end)]


def replace_block(path: str, start: str, end: str, new: str) -> bool:
    """The file at path with its block (as block() reads it) replaced by `new`, written into a
    temporary sibling and renamed; False, the file untouched, where a marker is missing."""
    text = open(path).read()
    if start not in text or end not in text:
        return False
    with open(path + ".tmp", "w") as f:
        f.write(text[:text.index(start)] + new + text[text.index(end) + len(end):])
    os.replace(path + ".tmp", path)
    return True


TIME_BLOCK = "<!-- time-to-accuracy:start -->", "<!-- time-to-accuracy:end -->"  # its markers


def write_doc(path: str, text: str) -> str:
    """A generated doc, written whole: `text` (its lines joined, no newline after the last), then
    its hand-written reading (PATH-notes.md beside it) where there is one, then the
    time-to-accuracy block it holds (time_to_accuracy.py's) as it is, a blank line between each;
    into a temporary sibling and renamed. Returns what it wrote."""
    parts = [text]
    notes = os.path.splitext(path)[0] + "-notes.md"
    if os.path.exists(notes):
        with open(notes) as f:
            parts.append(f.read().rstrip())
    if kept := block(path, *TIME_BLOCK):
        parts.append(kept)
    text = "\n\n".join(parts) + "\n"
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path + ".tmp", "w") as f:
        f.write(text)
    os.replace(path + ".tmp", path)
    return text


# ---- What made a generated doc -------------------------------------------------------------------
def machine() -> str:
    import torch
    cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo")
                if line.startswith("model name")), platform.processor() or "unknown CPU")
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU"
    return f"{len(os.sched_getaffinity(0))} cores ({cpu}), {gpu}, torch {torch.__version__}"


def repo_relative(arg: str) -> str:
    """A path inside the repository as the command would be typed from its root: no machine
    paths in generated files."""
    inside = os.path.isabs(arg) and os.path.commonpath([arg, ROOT]) == ROOT
    return os.path.relpath(arg, ROOT) if inside else arg


def commit() -> str:
    def git(*a):
        return subprocess.run(["git", *a], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    head = git("rev-parse", "--short", "HEAD") or "unknown"
    dirty = git("status", "--porcelain", "--", "*.py")
    return head + (" (with uncommitted changes)" if dirty else "")


if __name__ == "__main__":  # a module, not an experiment; like every file here it answers --help
    argparse.ArgumentParser(description=__doc__,
                            formatter_class=argparse.RawDescriptionHelpFormatter).parse_args()
