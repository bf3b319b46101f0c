"""Offline trajectories for spo.py --offline-data: samples of a model (e.g. the SFT model, pi_0) on the training
puzzles, written as JSON lines {"nums", "target", "completion", "finished", "temperature", "correct"}.

As in the paper's offline set (../shared/papers/001_*, §5): each chunk of prompts is sampled at a random
temperature ~ U(lo, hi) with top-p 0.95; --correct-only keeps only the correct ones (the paper filtered its
offline data to correct solutions). spo.py recomputes every reward from the text; "correct" is for reading.
By default the puzzles are spo.py's own training pool (same --num-numbers, --train-prompts and --seed).

Run:  python scripts/spo_offline_data.py --model runs/sft-.../final --out runs/spo-offline.jsonl
"""
import argparse
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import common  # noqa: E402
from tasks import get_task  # noqa: E402


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", required=True, help="`sft`, a folder or a hub id")
    p.add_argument("--out", required=True, help="JSONL file to write")
    p.add_argument("--task", default="countdown")
    p.add_argument("--num-numbers", default="3,4")
    p.add_argument("--train-prompts", type=common.positive_int, default=256, help="training puzzles per size")
    p.add_argument("--samples", type=common.positive_int, default=8, help="samples per puzzle")
    p.add_argument("--temperature", default="0.1,1.0", help="temperature ~ U(lo, hi) per chunk of prompts")
    p.add_argument("--top-p", type=common.positive_float, default=0.95)
    p.add_argument("--chunk", type=common.positive_int, default=16, help="prompts per temperature draw")
    p.add_argument("--correct-only", action="store_true", help="keep only correct completions")
    p.add_argument("--max-new-tokens", type=common.positive_int, default=64)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=common.positive_int, default=None)
    args = p.parse_args(argv)
    common.setup(args.seed, args.threads)
    try:
        task = get_task(args.task)
        sizes = [int(s) for s in args.num_numbers.split(",")]
        lo, hi = (float(t) for t in args.temperature.split(","))
        if not 0 < lo <= hi:
            raise ValueError(f"--temperature lo,hi needs 0 < lo <= hi, got {args.temperature}")
        model, tok = common.load_model(common.resolve_model_path(args.model, task=args.task))
    except (common.UsageError, ValueError) as e:
        p.error(str(e))
    pool = [q for n in sizes for q in task.get_problems("train", args.train_prompts, size=n, seed=args.seed)]
    prompts = common.encode_prompts(task, pool, tok, common.prompt_style(model, tok))
    engine, rng = common.HFEngine(model, tok), np.random.default_rng(args.seed)
    kept = total = 0
    with open(args.out + ".tmp", "w") as f:
        for start in range(0, len(pool), args.chunk):
            temperature = float(rng.uniform(lo, hi))
            sc = common.SamplingConfig(args.samples, args.max_new_tokens, temperature, args.top_p)
            for problem, group in zip(pool[start:start + args.chunk], engine.generate(prompts[start:start + args.chunk], sc)):
                for s in group:
                    correct = task.is_correct(problem, s.text)
                    total += 1
                    if correct or not args.correct_only:
                        kept += 1
                        f.write(json.dumps({"nums": problem["nums"], "target": problem["target"], "completion": s.text,
                                            "finished": s.finished, "temperature": round(temperature, 4),
                                            "correct": correct}) + "\n")
    os.replace(args.out + ".tmp", args.out)
    print(f"wrote {kept} of {total} samples ({len(pool)} puzzles) to {args.out}")


if __name__ == "__main__":
    main()
