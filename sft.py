"""sft.py: supervised fine-tuning, the warm start every RL script begins from.

Course report (../shared/papers/000_*, §3.4, Eq. 1; ../shared/ALGORITHMS.md §1):

    L_SFT = -(1/N) sum_i log P(y_i | x_i)                                           (Eq. 1)

the negative log-likelihood of the completion tokens only (prompt and padding are masked out), with the
EOS token appended to every completion so that the model learns to stop. AdamW, linear warm-up then
cosine decay, gradient clipping at 1.0 and gradient accumulation, as in the report (§4.4).

Data
  * default: demonstrations made by the task's solver (tasks/countdown.py `demonstration`), e.g. the
    prompt "45 12 3=36:" with the completion "<answer>(45-12)+3</answer>"; with --demo-steps the
    completion first writes the steps: "45-12=33,33+3=36 <answer>(45-12)+3</answer>".
  * --data FILE.jsonl: prompt/completion pairs ("prompt" or "query", and "completion"), the prompt used
    as written; or --data ORG/NAME: a hub dataset with those columns (the report used
    Asap7772/cog_behav_all_strategies; needs `datasets` and the hub).

Run:  python sft.py --task countdown          (tiny model, CPU, ~5 minutes)
      python sft.py --model Qwen/Qwen2.5-0.5B-Instruct --lr 1e-5 --warmup 500 --batch-size 32 ...
The model in RUN/final is what rloo.py, topr.py, agro.py and spo.py take as --model.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys

import numpy as np
import torch
from tqdm import tqdm

import common
from tasks import get_task


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--task", default="countdown", help="task module in tasks/")
    p.add_argument("--model", default="tiny", help="`tiny` (built locally), a local HF folder or a hub id")
    p.add_argument("--data", default=None, help="JSONL of prompt/completion pairs or a hub dataset id; "
                   "default: the task's solver demonstrations")
    p.add_argument("--out", default=None, help="run folder (default runs/sft-TASK-TIME)")
    p.add_argument("--resume", default=None, metavar="RUN_DIR", help="continue the run in RUN_DIR")
    # optimisation
    p.add_argument("--steps", type=common.positive_int, default=700, help="optimizer steps")
    p.add_argument("--batch-size", type=common.positive_int, default=128, help="examples per optimizer step")
    p.add_argument("--grad-accum", type=common.positive_int, default=1,
                   help="split each batch into this many micro-batches (same maths, less memory)")
    p.add_argument("--lr", type=common.positive_float, default=1e-3, help="peak learning rate")
    p.add_argument("--warmup", type=int, default=50, help="linear warm-up steps (report: 500)")
    p.add_argument("--weight-decay", type=float, default=0.0)
    p.add_argument("--clip", type=common.positive_float, default=1.0, help="gradient-norm clip")
    p.add_argument("--loss-norm", choices=["token", "seq"], default="token",
                   help="token: mean over completion tokens (HF convention); seq: Eq. 1 read literally")
    p.add_argument("--max-len", type=common.positive_int, default=1024,
                   help="max prompt+completion tokens; the completion is cut, never the prompt")
    # data made by the task
    p.add_argument("--num-numbers", default="3,4", help="puzzle sizes to train on, comma-separated")
    p.add_argument("--train-size", type=common.positive_int, default=20000, help="puzzles per size")
    p.add_argument("--demo-steps", action="store_true",
                   help="demonstrations write the solution's steps before the answer (default: the answer alone)")
    # evaluation
    p.add_argument("--eval-every", type=common.positive_int, default=200,
                   help="steps between evaluations (greedy only; the final one also samples --eval-k)")
    p.add_argument("--eval-size", type=common.positive_int, default=200, help="held-out puzzles per size")
    p.add_argument("--eval-k", type=int, default=8, help="samples per puzzle for sampled accuracy/pass@k")
    p.add_argument("--max-new-tokens", type=common.positive_int, default=64)
    p.add_argument("--reward", default="original", help="reward variant reported in evaluation")
    p.add_argument("--engine", default="hf", choices=["auto", "vllm", "hf"], help="generation engine")
    # system
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=common.positive_int, default=None, help="torch CPU threads (default: $TORCH_THREADS or all cores)")
    p.add_argument("--bf16", action="store_true", help="bf16 autocast (GPU)")
    return p, p.parse_args(argv)


# ---------------------------------------------------------------------------------------------------
# The loss and the schedule: pure functions
# ---------------------------------------------------------------------------------------------------
def sft_loss(logprobs: torch.Tensor, mask: torch.Tensor, norm: str = "token") -> torch.Tensor:
    """Masked negative log-likelihood of the completions, [CR] Eq. 1.

    logprobs: [B, T] log P(y_t | x, y_<t) of the completion tokens (EOS included), 0 on padding
    mask:     [B, T] 1 on completion tokens, 0 on padding
    norm:     "token" -> sum / number of completion tokens;  "seq" -> mean over sequences of each sum
              (with equal lengths L, seq = L x token).
    """
    nll = -(logprobs * mask).sum(-1)  # [B] -log P(y_i | x_i)
    if norm == "token":
        return nll.sum() / mask.sum()
    if norm == "seq":
        return nll.mean()
    raise ValueError(f"unknown loss normalisation {norm!r}")


def lr_lambda(step: int, warmup: int, total: int) -> float:
    """Multiplier of the peak lr: linear warm-up for `warmup` steps, then cosine to 0 at `total` ([CR] §4.4)."""
    if step < warmup:
        return step / warmup
    progress = (step - warmup) / max(1, total - warmup)
    return 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))


# ---------------------------------------------------------------------------------------------------
# Data
# ---------------------------------------------------------------------------------------------------
def task_demonstrations(task, tokenizer, style, sizes, per_size, seed, steps=False):
    """(prompt_ids, completion_ids) pairs from the task's solver; EOS appended to each completion."""
    pairs = []
    for n in sizes:
        problems = task.get_problems("train", per_size, size=n, seed=seed)
        demos = [(p, task.demonstration(p, steps=steps)) for p in problems]
        demos = [(p, d) for p, d in demos if d is not None]
        prompts = common.encode_prompts(task, [p for p, _ in demos], tokenizer, style)
        for ids, (_, d) in zip(prompts, demos):
            pairs.append((ids, tokenizer(d, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]))
    return pairs


def load_pairs(source: str) -> list[tuple[str, str]]:
    """Prompt/completion text pairs from a JSONL file or a hub dataset (columns prompt|query, completion)."""
    def pick(row, where):
        prompt = row.get("prompt", row.get("query"))
        if not isinstance(prompt, str) or not isinstance(row.get("completion"), str):
            raise ValueError(f"{where}: needs string fields 'prompt' (or 'query') and 'completion'")
        return prompt, row["completion"]

    if source.endswith(".jsonl") or os.path.exists(source):
        if not os.path.isfile(source):
            raise ValueError(f"no such data file: {source}")
        pairs = []
        with open(source) as f:
            for i, line in enumerate(f, 1):
                if line.strip():
                    try:
                        row = json.loads(line)
                    except json.JSONDecodeError:
                        raise ValueError(f"{source}:{i}: not valid JSON") from None
                    if not isinstance(row, dict):
                        raise ValueError(f"{source}:{i}: expected a JSON object")
                    pairs.append(pick(row, f"{source}:{i}"))
        if not pairs:
            raise ValueError(f"{source} holds no examples")
        return pairs
    try:
        import datasets
        rows = datasets.load_dataset(source, split="train")
    except Exception as e:
        raise ValueError(f"could not load hub dataset {source} (needs `datasets` and the hub): "
                         f"{str(e).splitlines()[0] if str(e) else type(e).__name__}") from None
    return [pick(r, source) for r in rows]


def encode_pairs(pairs, tokenizer, max_len):
    out = []
    for prompt, completion in pairs:
        p = tokenizer(prompt, add_special_tokens=False)["input_ids"]
        c = tokenizer(completion, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
        if len(p) >= max_len:
            continue  # never cut a prompt: drop the example instead
        out.append((p, c[:max_len - len(p)]))
    if not out:
        raise ValueError(f"no example fits in --max-len {max_len}")
    return out


# ---------------------------------------------------------------------------------------------------
# Training
# ---------------------------------------------------------------------------------------------------
def run_eval(engine, model, task, eval_sets, args, k: int) -> dict:
    """Held-out evaluation on each puzzle size: greedy, plus k samples at temperature 1 when k > 0."""
    metrics = {}
    engine.sync(model)  # vLLM: push the current weights; HF generate uses the model itself
    for n, (problems, prompts) in eval_sets.items():
        metrics.update(common.evaluate(engine, task, problems, prompts, k=k, prefix=f"eval{n}/",
                                       max_new_tokens=args.max_new_tokens, reward_variant=args.reward))
    return metrics


def summary(metrics: dict) -> str:
    keys = [k for k in metrics if k.endswith(("greedy/accuracy", "sampled/accuracy", "greedy/format_rate"))]
    return "  ".join(f"{k}={metrics[k]:.3f}" for k in keys)


def main(argv=None):
    parser, args = parse_args(argv)
    args = common.resumed_args(args, parser)  # a resumed run keeps the flags it was started with
    common.setup(args.seed, args.threads)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    out = args.out or common.default_out_dir("sft", args.task)

    try:  # every bad input surfaces here, before any training: one line, exit status 2
        task = get_task(args.task)
        if args.reward not in task.REWARD_VARIANTS:
            raise ValueError(f"unknown --reward {args.reward!r}; choose from {', '.join(task.REWARD_VARIANTS)}")
        try:
            sizes = [int(s) for s in str(args.num_numbers).split(",")]
        except ValueError:
            raise ValueError(f"--num-numbers: expected comma-separated integers, got {args.num_numbers!r}") from None
        if args.warmup < 0 or args.eval_k < 0:
            raise ValueError("--warmup and --eval-k must be >= 0")
        pairs = load_pairs(args.data) if args.data else None
        ckpt = common.checkpoint_path(os.path.join(out, "checkpoint")) if args.resume else None
        if args.resume and ckpt is None:
            raise ValueError(f"--resume {args.resume}: no checkpoint to resume from")
        if args.model != common.TINY:
            common.resolve_model_path(args.model)  # a bad path fails here, before a run folder is made
        eval_problems = {n: task.get_problems("test", args.eval_size, size=n, seed=args.seed) for n in sizes}
        run = common.Run(out, vars(args), resume=bool(args.resume))
        model_path = ckpt or common.resolve_model_path(args.model, run.dir)
        model, tokenizer = common.load_model(model_path, device=device)
    except (common.UsageError, ValueError) as e:
        parser.error(str(e))

    style = common.prompt_style(model, tokenizer)
    if pairs is not None:
        train = encode_pairs(pairs, tokenizer, args.max_len)
    else:
        train = task_demonstrations(task, tokenizer, style, sizes, args.train_size, args.seed, args.demo_steps)
    eval_sets = {n: (ps, common.encode_prompts(task, ps, tokenizer, style)) for n, ps in eval_problems.items()}
    print(f"sft: {common.count_parameters(model) / 1e6:.2f}M parameters, {len(train)} training pairs, "
          f"run folder {run.dir}")
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=args.weight_decay)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: lr_lambda(s, args.warmup, args.steps))
    step = 0
    if ckpt:
        state = common.load_trainer_state(ckpt)
        optimizer.load_state_dict(state["optimizer"])
        scheduler.load_state_dict(state["scheduler"])
        common.set_rng_state(state["rng"])
        step = state["step"]
        run.truncate(step)  # rows logged after the checkpoint will be logged again
        print(f"resumed from {ckpt} at step {step}")
    engine = common.make_engine(args.engine, model, tokenizer, model_path, seed=args.seed)

    def save(path, final=False):
        state = None if final else {"step": step, "optimizer": optimizer.state_dict(),
                                    "scheduler": scheduler.state_dict(), "rng": common.rng_state()}
        common.save_checkpoint(path, model, tokenizer, state)

    autocast = torch.autocast("cuda", dtype=torch.bfloat16, enabled=args.bf16 and device == "cuda")
    bar = tqdm(total=args.steps, initial=step, desc="sft", dynamic_ncols=True)
    while step < args.steps:
        model.train()
        # batch for this step: a function of (seed, step) alone, so a resumed run sees the same batches
        idx = np.random.default_rng([args.seed, step]).choice(len(train), args.batch_size, replace=False)
        batch = [train[i] for i in idx]
        n_tokens = sum(len(c) for _, c in batch)
        optimizer.zero_grad(set_to_none=True)
        total = 0.0
        for micro in np.array_split(np.arange(len(batch)), args.grad_accum):
            if len(micro) == 0:
                continue
            prompts, completions = [batch[i][0] for i in micro], [batch[i][1] for i in micro]
            with autocast:
                logprobs, mask = common.completion_logprobs(model, prompts, completions, tokenizer.pad_token_id)
            loss = sft_loss(logprobs, mask, args.loss_norm)
            # weight each micro-batch by its share, so the sum equals the loss of the whole batch
            share = mask.sum().item() / n_tokens if args.loss_norm == "token" else len(micro) / len(batch)
            (loss * share).backward()
            total += loss.item() * share
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip).item()
        optimizer.step()
        scheduler.step()
        step += 1
        bar.update(1)
        bar.set_postfix(loss=f"{total:.4f}", lr=f"{scheduler.get_last_lr()[0]:.2e}")
        row = {"loss": total, "grad_norm": grad_norm, "lr": scheduler.get_last_lr()[0]}
        if step % args.eval_every == 0 or step == args.steps:
            model.eval()
            row.update(run_eval(engine, model, task, eval_sets, args, args.eval_k if step == args.steps else 0))
            tqdm.write(f"step {step}: loss {total:.4f}  {summary(row)}")
        run.log(step, row)
        if step % args.eval_every == 0 or step == args.steps:
            save(run.path("checkpoint"))
    bar.close()
    save(run.path("final"), final=True)
    engine.close()
    print(f"done: final model in {run.path('final')}  ({run.path('metrics.jsonl')})")
    return run.dir


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
