"""Offline trajectories for spo.py --offline-data: samples of a model (e.g. the SFT model, pi_0) on
the training problems, written as JSON lines {<the task's problem fields>, "completion", "finished",
"temperature", "correct"}.

[SPO] Cohen, Zhang, Zheng, Tang, Munos, Synnaeve, "Soft Policy Optimization: Online Off-Policy RL
for Sequence Models", 2025, arXiv:2503.05453.

As in [SPO]'s offline set (§5): each chunk of prompts is sampled at a temperature ~ U(lo, hi) with
top-p 0.95; --correct-only keeps only the correct ones (the paper filtered its offline data to
correct solutions). spo.py recomputes every reward from the text; "correct" is for reading. By
default the problems are spo.py's own training pool (same --sizes, --train-size and --seed).

Run:  python scripts/spo_offline_data.py --model runs/sft-.../final --out runs/spo-offline.jsonl
"""
import argparse
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import common  # noqa: E402
import spo  # noqa: E402
from tasks import get_task  # noqa: E402


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", required=True, help="`sft`, a folder or a hub id")
    p.add_argument("--out", required=True, help="JSONL file to write")
    p.add_argument("--task", default="countdown")
    p.add_argument("--sizes", type=common.int_list, default=None,
                   help="difficulty levels, comma-separated (Countdown: numbers a puzzle); "
                        "default: the task's SIZES")
    p.add_argument("--train-size", type=common.positive_int, default=256,
                   help="training problems per size")
    p.add_argument("--samples", type=common.positive_int, default=8, help="samples per problem")
    p.add_argument("--temperature", type=spo.temperature_range, default=(0.1, 1.0), metavar="LO,HI",
                   help="temperature ~ U(lo, hi) per chunk of prompts")
    p.add_argument("--top-p", type=common.positive_float, default=0.95)
    p.add_argument("--chunk", type=common.positive_int, default=16,
                   help="prompts per temperature draw")
    p.add_argument("--correct-only", action="store_true", help="keep only correct completions")
    p.add_argument("--max-new-tokens", type=common.positive_int, default=64)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=common.positive_int, default=None)
    args = p.parse_args(argv)
    common.setup(args.seed, args.threads)
    try:
        task = get_task(args.task)
        if args.top_p > 1:
            raise ValueError(f"--top-p must lie in (0, 1], got {args.top_p}")
        pool = [q for n in args.sizes or task.SIZES
                for q in task.get_problems("train", args.train_size, size=n, seed=args.seed)]
        model, tok = common.load_model(args.model, task=args.task)
    except ValueError as e:  # UsageError is one
        p.error(str(e))
    prompts = common.encode_prompts(task, pool, tok, common.prompt_style(model, tok))
    engine, rng = common.HFEngine(model, tok), np.random.default_rng(args.seed)
    kept = total = 0
    with open(args.out + ".tmp", "w") as f:  # renamed when complete: never half a file
        for start in range(0, len(pool), args.chunk):
            temperature = float(rng.uniform(*args.temperature))
            sc = common.SamplingConfig(args.samples, args.max_new_tokens, temperature, args.top_p)
            groups = engine.generate(prompts[start:start + args.chunk], sc)
            for problem, group in zip(pool[start:start + args.chunk], groups):
                for s in group:
                    correct = task.is_correct(problem, s.text)
                    total += 1
                    if correct or not args.correct_only:
                        kept += 1
                        row = {**{k: problem[k] for k in task.FIELDS}, "completion": s.text,
                               "finished": s.finished, "temperature": round(temperature, 4),
                               "correct": correct}
                        f.write(json.dumps(row) + "\n")
    os.replace(args.out + ".tmp", args.out)
    print(f"wrote {kept} of {total} samples ({len(pool)} problems) to {args.out}")


if __name__ == "__main__":
    main()
