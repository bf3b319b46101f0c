"""Rehearse the hub-model path on a CPU: every script, end to end, on a Qwen2-shaped stand-in.

Builds tests/hub_standin.py's stand-in (chat template, BPE tokenizer, two EOS ids, a
generation_config with its own sampling defaults, bf16 weights on disk), runs sft.py (task
demonstrations, and --data rows), rloo.py, topr.py, agro.py and spo.py on it with tiny budgets
under each engine, and prints the matrix script x engine: exit status, wall clock, final
metrics, the largest logprob_gap logged, and whether the run's final model reloads. It checks
that the path runs, syncs, evaluates and checkpoints, not that anything learns.

    python scripts/rehearse.py                       # both engines, into runs/rehearse-*
    python scripts/rehearse.py --engines hf --scripts sft,rloo
    python scripts/rehearse.py --engines kv,hf --from-sft 600   # every loss runs (a GPU's check)

The stand-in has random weights and earns no reward, so an RL script's loss may never run on it.
--from-sft N first trains the tiny model N sft.py steps and runs the RL scripts from that model,
with budgets in which its rewards differ within a group; `losses` then says whether a non-zero
loss was logged.
"""
import argparse
import json
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests"))

EVAL = ["--eval-size", "4", "--eval-k", "2", "--max-new-tokens", "16", "--sizes", "3",
        "--threads", "1"]
BUDGETS = {  # a step or two each: enough to sample, sync, train, evaluate and save
    "sft": ["--steps", "4", "--batch-size", "8", "--train-size", "32", "--eval-every", "4"],
    "sft --data": ["--steps", "4", "--batch-size", "4", "--eval-every", "4"],
    "rloo": ["--steps", "2", "--prompts", "4", "--group-size", "2", "--micro-batch", "8",
             "--eval-every", "2", "--save-every", "2", "--train-size", "64"],
    "topr": ["--iterations", "1", "--prompts", "4", "--group-size", "2", "--batch-size", "8",
             "--micro-batch", "8", "--train-size", "64"],
    "agro": ["--mode", "offpolicy", "--steps", "2", "--prompts", "4", "--group-size", "2",
             "--offline-prompts", "8", "--micro-batch", "8", "--eval-every", "2", "--save-every",
             "2", "--train-size", "64"],
    "spo": ["--steps", "2", "--train-size", "4", "--batch-size", "8",
            "--group-size", "2", "--micro-batch", "8", "--eval-every", "2",
            "--save-every", "2"],
}


# with --from-sft: 64 new tokens (the tiny model's answers are 30-40 characters), more samples
FROM_SFT = {"rloo": ["--prompts", "16", "--group-size", "4"],
            "topr": ["--prompts", "16", "--group-size", "4"],
            "agro": ["--prompts", "16", "--group-size", "4", "--offline-prompts", "16"],
            "spo": ["--train-size", "16", "--group-size", "4", "--batch-size", "32"]}


def pairs_file(path: str) -> str:
    """sft.py --data rows: the problem's fields, its prompt as the report wrote it, a completion."""
    from tasks import countdown
    rows = [{**p, "prompt": countdown.prompt(p, "instruct"),
             "completion": countdown.demonstration(p)}
            for p in countdown.get_problems("train", 16, size=3, seed=1)]
    with open(path, "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows if r["completion"])
    return path


def final_metrics(run_dir: str) -> tuple[dict, float | None]:
    """The last evaluation row's accuracies and the largest logprob_gap of any row."""
    rows = []
    if os.path.exists(os.path.join(run_dir, "metrics.jsonl")):
        with open(os.path.join(run_dir, "metrics.jsonl")) as f:
            rows = [json.loads(line) for line in f if line.strip()]
    evals = [r for r in rows if any("accuracy" in k for k in r)]
    last = {k: v for k, v in (evals[-1] if evals else {}).items() if k.endswith("accuracy")}
    gaps = [r["logprob_gap"] for r in rows if "logprob_gap" in r]
    last["losses"] = any(r.get("loss") for r in rows)  # a non-zero loss was logged
    return last, max(gaps) if gaps else None


def reloads(run_dir: str) -> bool:
    """The run's final model loads in plain transformers, tokenizer included."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    final = os.path.join(run_dir, "final")
    try:
        AutoTokenizer.from_pretrained(final)
        AutoModelForCausalLM.from_pretrained(final)
        return True
    except (OSError, ValueError):
        return False


def main():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--engines", default="hf,vllm")
    p.add_argument("--scripts", default=",".join(BUDGETS))
    stamp = time.strftime("%Y%m%d-%H%M%S")
    p.add_argument("--out", default=os.path.join("runs", f"rehearse-{stamp}"))
    p.add_argument("--timeout", type=float, default=900, help="seconds a run may take")
    p.add_argument("--from-sft", type=int, default=0, metavar="N",
                   help="RL scripts from the tiny model after N sft.py steps, not the stand-in")
    args = p.parse_args()
    unknown = set(args.scripts.split(",")) - set(BUDGETS)
    if unknown:
        p.error(f"unknown --scripts {', '.join(sorted(unknown))}; choose from {', '.join(BUDGETS)}")
    from hub_standin import build_standin
    os.makedirs(args.out, exist_ok=True)
    model = build_standin(os.path.join(args.out, "standin"))
    data = pairs_file(os.path.join(args.out, "pairs.jsonl"))
    env = {**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "0", "TOKENIZERS_PARALLELISM": "false"}
    sft_model = None
    if args.from_sft:
        sft_dir = os.path.join(args.out, "sft-tiny")
        subprocess.run([sys.executable, os.path.join(ROOT, "sft.py"), "--model", "tiny", "--steps",
                        str(args.from_sft), "--out", sft_dir, "--eval-size", "50", "--eval-k", "0",
                        "--sizes", "3"], cwd=ROOT, env=env, check=True, capture_output=True)
        sft_model = os.path.join(sft_dir, "final")
        print(f"sft-tiny: {args.from_sft} steps, {json.dumps(final_metrics(sft_dir)[0])}")
    table = []
    for engine in args.engines.split(","):
        for name in args.scripts.split(","):
            script = name.split()[0] + ".py"
            run_dir = os.path.join(args.out, f"{name.replace(' --', '-')}-{engine}")
            rl = sft_model and name in FROM_SFT
            argv = [sys.executable, os.path.join(ROOT, script), "--model",
                    sft_model if rl else model, "--engine", engine, "--out", run_dir,
                    *BUDGETS[name], *EVAL]
            argv += FROM_SFT[name] + ["--max-new-tokens", "64"] if rl else []
            argv += ["--data", data] if "--data" in name else []
            start = time.time()
            try:
                proc = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True,
                                      timeout=args.timeout)
                rc, tail = proc.returncode, (proc.stderr or proc.stdout).strip().splitlines()[-1:]
            except subprocess.TimeoutExpired:
                rc, tail = "timeout", []
            wall = time.time() - start
            metrics, gap = final_metrics(run_dir)
            ok = rc == 0 and reloads(run_dir)
            table.append((name, engine, rc, wall, metrics, gap, ok, tail))
            shown = "-" if gap is None else f"{gap:.1e}"
            print(f"{name:11s} {engine:5s} rc={rc} {wall:6.1f}s gap={shown} reloads={ok} "
                  f"{json.dumps(metrics)}" + ("" if rc == 0 else f"  | {tail}"), flush=True)
    print("\n| script | engine | exit | wall s | max logprob_gap | final reloads | final metrics |")
    print("|---|---|---|---|---|---|---|")
    for name, engine, rc, wall, metrics, gap, ok, _ in table:
        m = ", ".join(f"{k}={v:.2f}" for k, v in metrics.items())
        shown = "-" if gap is None else f"{gap:.1e}"
        print(f"| {name} | {engine} | {rc} | {wall:.0f} | {shown} | {ok} | {m} |")


if __name__ == "__main__":
    main()
