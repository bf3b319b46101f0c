"""Where the time of an rloo.py step goes, and its throughput, for several settings in one run.

    python scripts/bench_rloo.py --model runs/compare/sft/final
    python scripts/bench_rloo.py --model M --settings "--engine kv;--engine kv --micro-batch 64"
    python scripts/bench_rloo.py --model M --settings "--engine kv;trl"   # TRL's RLOOTrainer too

Each setting (rloo.py flags) runs --steps optimizer steps of rloo.py's own functions (draw_batch,
rloo_step, engine.sync) from the same checkpoint and seed, in a process of its own, after one
warm-up step; settings take turns --repeats times, so that a slower moment of a shared machine falls
on all of them. Prints seconds per step and per part (generation, rewards, the trainer's forward
pass, backward pass, optimizer, weight sync), completions generated and trained on per second
(trained: the batch's B x k, as TRL counts), and the peak resident memory of the process.

The setting `trl` is TRL's RLOOTrainer (pip install -r requirements-trl.txt) on rloo.py's defaults:
the same checkpoint, training prompts and reward, B x k = 64 x 4 completions a step, lr 6e-5 after
10 warm-up steps, T = 1, at most 64 new tokens, beta 0, fp32, transformers' generate (no vLLM);
only its whole step and its generation (with scoring) are timed.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import shlex
import subprocess
import sys
import tempfile
import time
from collections import defaultdict

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
import common  # noqa: E402


class Clock:
    """Seconds spent in wrapped functions, by part."""

    def __init__(self):
        self.parts = defaultdict(float)

    def wrap(self, part: str, fn):
        def timed(*a, **kw):
            t = time.perf_counter()
            try:
                return fn(*a, **kw)
            finally:
                self.parts[part] += time.perf_counter() - t
        return timed


def one_setting(args) -> dict:
    """Run rloo.py's step functions with the setting's flags; return per-step figures."""
    import torch
    import rloo
    from tasks import get_task, problem_sets
    rargs = rloo.parse_args(["--model", args.model, "--threads", str(args.threads),
                             "--out", os.path.join(args.tmp, "run"),
                             "--eval-size", "1"] + shlex.split(args.setting))[1]
    common.setup(rargs.seed, rargs.threads)
    task = get_task(rargs.task)  # the inputs as rloo.py's main() makes them
    rargs.reward = rargs.reward or task.REWARD_VARIANTS[0]
    pool, _ = problem_sets(task, sizes=rargs.sizes, train_size=rargs.train_size, eval_sizes=None,
                           eval_size=1, seed=rargs.seed, source=rargs.problems)
    rargs.model_path = common.resolve_model_path(rargs.model, task=rargs.task)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model, tokenizer = common.load_model(rargs.model_path, device=device,
                                         grad_checkpoint=rargs.grad_checkpoint)
    ref_model = common.load_model(rargs.model_path, device=device)[0].requires_grad_(False)
    common.fill_defaults(rargs, rloo.DEFAULTS, model)  # as rloo.py's main() does
    prompts = common.encode_prompts(task, pool, tokenizer, common.prompt_style(model, tokenizer))
    optimizer = torch.optim.AdamW(model.parameters(), lr=rargs.lr, weight_decay=0.0)
    engine = common.make_engine(rargs.engine, model, tokenizer, rargs.model_path)
    clock = Clock()
    engine.generate = clock.wrap("generate", engine.generate)
    task.reward = clock.wrap("rewards", task.reward)
    forward = common.completion_logprobs
    common.completion_logprobs = clock.wrap("forward", forward)
    optimizer.step = clock.wrap("optimizer", optimizer.step)
    torch.Tensor.backward = clock.wrap("backward", torch.Tensor.backward)
    engine.sync = clock.wrap("sync", engine.sync)
    totals = defaultdict(float)
    for step in range(args.steps + 1):  # step 0 warms up
        clock.parts.clear()
        t = time.perf_counter()
        batch = rloo.draw_batch(engine, task, pool, prompts, step, rargs)
        rloo.rloo_step(model, ref_model, optimizer, batch.groups, rargs, tokenizer.pad_token_id,
                       step)
        engine.sync(model)
        if step == 0:
            continue
        totals["step"] += time.perf_counter() - t
        for part, seconds in clock.parts.items():
            totals[part] += seconds
        totals["generated"] += batch.generated
        totals["trained"] += sum(len(g.samples) for g in batch.groups)
    row = {k: v / args.steps for k, v in totals.items()}
    row["peak_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return row


def one_trl(args) -> dict:
    """TRL's RLOOTrainer at rloo.py's default batch shape and lr; figures as one_setting's."""
    import torch
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import RLOOConfig, RLOOTrainer
    import rloo
    import trl_trainers
    from tasks import get_task
    rargs = rloo.parse_args(["--model", args.model])[1]
    common.setup(rargs.seed, args.threads)
    task = get_task(rargs.task)
    path = common.resolve_model_path(rargs.model, task=rargs.task)
    model, tokenizer = common.load_model(path)
    common.fill_defaults(rargs, rloo.DEFAULTS, model)
    problems = [p for n in task.SIZES
                for p in task.get_problems("train", rargs.train_size, size=n, seed=rargs.seed)]
    rows = trl_trainers.task_rows(task, problems, tokenizer, common.prompt_style(model, tokenizer))
    clock, ends = Clock(), []  # (time, generation seconds so far) at the end of every step

    class StepEnds(TrainerCallback):
        def on_step_end(self, *a, **kw):
            ends.append((time.perf_counter(), clock.parts["generate"]))
    config = RLOOConfig(
        output_dir=os.path.join(args.tmp, "trl"), max_steps=args.steps + 1,
        per_device_train_batch_size=rargs.prompts * rargs.group_size,
        num_generations=rargs.group_size,
        max_completion_length=rargs.max_new_tokens, temperature=1.0, learning_rate=rargs.lr,
        warmup_steps=rargs.warmup, lr_scheduler_type="constant_with_warmup", max_grad_norm=1.0,
        weight_decay=0.0, beta=0.0, seed=rargs.seed, report_to=[],
        use_cpu=not torch.cuda.is_available(),  # on the GPU where there is one, as rloo.py
        logging_steps=1, save_strategy="no", disable_dropout=True)
    trainer = RLOOTrainer(model=model, args=config, train_dataset=Dataset.from_list(rows),
                          reward_funcs=trl_trainers.task_reward(task, task.REWARD_VARIANTS[0]),
                          processing_class=tokenizer, callbacks=[StepEnds()])
    trainer._generate_and_score_completions = clock.wrap(
        "generate", trainer._generate_and_score_completions)
    trainer.train()
    (t0, g0), (t1, g1), n = ends[0], ends[-1], len(ends) - 1  # the steps after the warm-up one
    batch = rargs.prompts * rargs.group_size
    return {"step": (t1 - t0) / n, "generate": (g1 - g0) / n,
            "generated": batch, "trained": batch, "only": ["generate"],
            "peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


PARTS = ["generate", "rewards", "forward", "backward", "optimizer", "sync"]


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="sft", help="the checkpoint rloo.py starts from")
    p.add_argument("--settings", default="--engine hf;--engine kv",
                   help="rloo.py flags of each setting, separated by ';'")
    p.add_argument("--steps", type=common.positive_int, default=8, help="timed steps a setting")
    p.add_argument("--repeats", type=common.positive_int, default=2,
                   help="turns of every setting (the faster turn is kept)")
    p.add_argument("--threads", type=common.positive_int, default=2)
    p.add_argument("--setting", help=argparse.SUPPRESS)  # one setting, in a child process
    p.add_argument("--tmp", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.setting is not None:
        print(json.dumps(one_trl(args) if args.setting == "trl" else one_setting(args)))
        return
    settings = [s.strip() for s in args.settings.split(";")]
    best = {}
    for _ in range(args.repeats):
        for s in settings:
            with tempfile.TemporaryDirectory() as tmp:
                cmd = [sys.executable, __file__, "--model", args.model, "--steps",
                       str(args.steps), "--threads", str(args.threads), f"--setting={s}",
                       "--tmp", tmp]
                out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
            if out.returncode != 0:
                sys.exit(f"bench_rloo.py: setting {s!r} failed:\n{out.stderr[-2000:]}")
            row = json.loads(out.stdout.strip().splitlines()[-1])
            if s not in best or row["step"] < best[s]["step"]:
                best[s] = row
    print(f"Steps from {args.model}, {args.threads} thread(s), mean of {args.steps} steps "
          f"after one warm-up, best of {args.repeats} turns; seconds per step:")
    head = ["setting", "step"] + PARTS + ["generated/s", "trained/s", "peak MB"]
    print("| " + " | ".join(head) + " |\n" + "|---" * len(head) + "|")
    for s, r in best.items():
        cells = [f"{r['step']:.2f}"] + [f"{r.get(k, 0.0):.3f}" if k in r.get("only", PARTS)
                                         else "-" for k in PARTS]
        cells += [f"{r['generated'] / r['step']:.0f}", f"{r['trained'] / r['step']:.0f}",
                  f"{r['peak_mb']:.0f}"]
        print(f"| `{s or '(defaults)'}` | " + " | ".join(cells) + " |")
    rate = {s: r["trained"] / r["step"] for s, r in best.items()}
    for s in settings[1:]:
        print(f"trained/s of `{s or '(defaults)'}` / `{settings[0] or '(defaults)'}`: "
              f"{rate[s] / rate[settings[0]]:.2f}x")


if __name__ == "__main__":
    main()
