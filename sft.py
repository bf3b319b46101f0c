"""sft.py: supervised fine-tuning, the warm start every RL script begins from.

[CR] the course report "Off-Policy Finetuning for LLM Math Reasoning", §3.4, Eq. 1, and §4.4.

    L_SFT = -(1/N) sum_i log P(y_i | x_i)                                       ([CR] Eq. 1)

the negative log-likelihood of the completion tokens only (prompt and padding are masked out), with
the EOS token appended to every completion so that the model learns to stop (a completion cut at
--max-len loses it). Warm-up then cosine decay, gradient clipping at 1.0 and gradient accumulation
as in [CR] §4.4; the optimizer, AdamW, is ours ([CR] names none).

Data: the task solver's demonstrations (Countdown: "<answer>(45-12)+3</answer>", with
--demo-steps "45-12=33,33+3=36 <answer>(45-12)+3</answer>"), or --data, a JSONL file or hub
dataset of rows with the task's problem fields (`task.FIELDS`) and a "completion". The prompt x is
built from the problem as the RL scripts build it (common.encode_prompts), so that they condition
on the same token ids; a row's own "prompt"/"query" text is not used (the run counts those that
differ).

Run:  python sft.py --task countdown          (tiny model, CPU, ~5 minutes)
      python sft.py --model Qwen/Qwen2.5-0.5B-Instruct --lr 1e-5 --warmup 500 --batch-size 32 ...
The model in RUN/final is what rloo.py, topr.py, agro.py and spo.py take as --model.
"""
import argparse
import math
import os
import sys
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import torch
from tqdm import tqdm

import common
from tasks import get_task


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--task", default="countdown", help="task module in tasks/")
    p.add_argument("--model", default="tiny", help="`tiny` (built here), a folder or a hub id")
    p.add_argument("--data", default=None,
                   help="JSONL file or hub dataset of problems (the task's fields) with a "
                        "'completion'; default: the task's solver demonstrations")
    p.add_argument("--out", default=None, help="run folder (default runs/sft-TASK-TIME)")
    p.add_argument("--resume", default=None, metavar="RUN_DIR", help="continue the run in RUN_DIR")
    # optimisation
    p.add_argument("--steps", type=common.positive_int, default=700, help="optimizer steps")
    p.add_argument("--batch-size", type=common.positive_int, default=128, help="examples a step")
    p.add_argument("--grad-accum", type=common.positive_int, default=1,
                   help="split each batch into this many micro-batches (same maths, less memory)")
    p.add_argument("--lr", type=common.positive_float, default=1e-3, help="peak learning rate")
    p.add_argument("--warmup", type=common.nonnegative_int, default=50,
                   help="linear warm-up steps ([CR]: 500)")
    p.add_argument("--weight-decay", type=common.nonnegative_float, default=0.0, help="AdamW's")
    p.add_argument("--clip", type=common.positive_float, default=1.0, help="gradient-norm clip")
    p.add_argument("--loss-norm", choices=["token", "seq"], default="token",
                   help="token: mean over completion tokens (HF convention); seq: Eq. 1 literally")
    p.add_argument("--max-len", type=common.positive_int, default=1024,
                   help="max prompt+completion tokens; the completion is cut, never the prompt")
    # data made by the task
    p.add_argument("--sizes", type=common.int_list, default=None, help="difficulty levels, e.g. "
                   "3,4 (Countdown: numbers a puzzle); default: the task's SIZES")
    p.add_argument("--train-size", type=common.positive_int, default=20000, help="problems a size")
    p.add_argument("--demo-steps", action="store_true", help="demonstrations show steps first")
    # evaluation
    p.add_argument("--eval-sizes", type=common.int_list, default=None,
                   help="held-out difficulty levels; default: the task's SIZES")
    p.add_argument("--eval-every", type=common.positive_int, default=200,
                   help="steps between evaluations (greedy; the final one also samples --eval-k)")
    p.add_argument("--eval-size", type=common.positive_int, default=200, help="problems a size")
    p.add_argument("--eval-k", type=common.nonnegative_int, default=8,
                   help="samples per problem for sampled accuracy/pass@k (0: none)")
    p.add_argument("--max-new-tokens", type=common.positive_int, default=64)
    p.add_argument("--reward", default=None,
                   help="reward variant reported in evaluation; default: the task's first")
    p.add_argument("--engine", default="auto", choices=common.ENGINES,
                   help="generation engine; auto: vLLM, else hf on a GPU; kv on a CPU "
                        "(common.make_engine)")
    # system
    p.add_argument("--seed", type=common.nonnegative_int, default=0)
    p.add_argument("--threads", type=common.positive_int, default=None,
                   help="torch CPU threads (default: $TORCH_THREADS or all cores)")
    common.add_memory_flags(p)  # --bf16, --grad-checkpoint
    return p, p.parse_args(argv)


# ---- The loss and the schedule: pure functions ---------------------------------------------------
def sft_loss(logprobs: torch.Tensor, mask: torch.Tensor, norm: str = "token") -> torch.Tensor:
    """Masked negative log-likelihood of the completions, [CR] Eq. 1.

    logprobs: [B, T] log P(y_t | x, y_<t) of the completion tokens (EOS included), 0 on padding
    mask:     [B, T] 1 on completion tokens, 0 on padding
    norm:     "token" -> sum / number of completion tokens;  "seq" -> mean over sequences of each
              sum (with equal lengths L, seq = L x token).
    """
    nll = -(logprobs * mask).sum(-1)  # [B] -log P(y_i | x_i)
    if norm == "token":
        return nll.sum() / mask.sum()
    if norm == "seq":
        return nll.mean()
    raise ValueError(f"unknown loss normalisation {norm!r}")


def lr_lambda(step: int, warmup: int, total: int) -> float:
    """Multiplier of the peak lr: linear warm-up for `warmup` steps, then cosine to 0 at `total`
    ([CR] §4.4)."""
    if step < warmup:
        return step / warmup
    progress = (step - warmup) / max(1, total - warmup)
    return 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))


# ---- Data: (problem, completion) -> token ids, the prompt built as the RL scripts build it -------
class Example(NamedTuple):
    """One training pair: prompt ids (common.encode_prompts) and completion ids (EOS appended)."""
    prompt: list[int]
    completion: list[int]


def encode_examples(task, problems, completions, tokenizer, style, max_len) -> list[Example]:
    """Token ids of each (problem, completion text); a prompt longer than max_len drops its pair."""
    out = []
    for ids, text in zip(common.encode_prompts(task, problems, tokenizer, style), completions):
        c = tokenizer(text, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
        if len(ids) < max_len:  # never cut a prompt
            out.append(Example(ids, c[:max_len - len(ids)]))
    if not out:
        raise common.UsageError(f"no example fits in --max-len {max_len}")
    return out


def task_demonstrations(task, sizes, per_size, seed, steps=False):
    """(problems, completion texts) from the task's solver."""
    problems = [p for n in sizes for p in task.get_problems("train", per_size, size=n, seed=seed)]
    demos = [(p, task.demonstration(p, steps=steps)) for p in problems]
    demos = [(p, d) for p, d in demos if d is not None]
    return [p for p, _ in demos], [d for _, d in demos]


def data_rows(source: str) -> list[dict]:
    """The rows of a JSONL file or a hub dataset; UsageError naming the file (and line)."""
    if source.endswith(".jsonl") or os.path.exists(source) or not common.HUB_ID.match(source):
        return common.read_jsonl(source, "data file")
    try:
        import datasets
        return list(datasets.load_dataset(source, split="train"))
    except Exception as e:  # no `datasets`, no hub, no such dataset: one line
        first = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise common.UsageError(f"could not load hub dataset {source} (needs `datasets` and the "
                                f"hub): {first}") from None


def data_examples(task, rows: list[dict], source: str):
    """(problems, completion texts, the rows' own prompt texts or None) of --data rows."""
    if not rows:
        raise common.UsageError(f"{source} holds no examples")
    problems, completions, given = [], [], []
    for i, row in enumerate(rows, 1):
        try:
            problem = task.problem_from_row(row)
        except ValueError as e:
            raise common.UsageError(f"{source}: example {i}: {e} (the prompt is built from the "
                                    f"problem fields {', '.join(task.FIELDS)})") from None
        if not isinstance(row.get("completion"), str):
            raise common.UsageError(f"{source}: example {i}: needs a string field 'completion'")
        problems.append(problem)
        completions.append(row["completion"])
        given.append(row.get("prompt", row.get("query")))
    return problems, completions, given


# ---- One optimizer step --------------------------------------------------------------------------
def sft_step(model, optimizer, scheduler, batch: list[Example], args, pad_id: int,
             step: int) -> dict:
    """One optimizer step of Eq. 1 on `batch` (in --grad-accum micro-batches); returns its metrics.

    Stops (common.check_finite) before the optimizer touches the weights if the loss or the gradient
    norm is not finite.
    """
    model.train()
    optimizer.zero_grad(set_to_none=True)
    n_tokens = sum(len(ex.completion) for ex in batch)
    total = 0.0
    for micro in np.array_split(np.arange(len(batch)), args.grad_accum):
        if len(micro) == 0:
            continue
        prompts = [batch[i].prompt for i in micro]
        completions = [batch[i].completion for i in micro]
        logprobs, mask = common.completion_logprobs(model, prompts, completions, pad_id,
                                                    bf16=args.bf16)
        loss = sft_loss(logprobs, mask, args.loss_norm)
        # weight each micro-batch by its share, so the sum equals the loss of the whole batch
        token = args.loss_norm == "token"
        share = mask.sum().item() / n_tokens if token else len(micro) / len(batch)
        (loss * share).backward()
        total += loss.item() * share
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip).item()
    common.check_finite(step + 1, "too high --lr", loss=total, grad_norm=grad_norm)
    optimizer.step()
    scheduler.step()
    return {"loss": total, "grad_norm": grad_norm, "lr": scheduler.get_last_lr()[0]}


# ---- Inputs --------------------------------------------------------------------------------------
@dataclass
class Inputs:
    """Everything main() needs, checked before training starts."""
    task: object
    train: list[Example]
    eval_sets: dict              # size -> (problems, prompt ids)
    model: object
    tokenizer: object
    model_path: str
    run: common.Run
    state: dict | None           # the trainer state of the checkpoint resumed from


def load_inputs(args, parser, device: str) -> Inputs:
    """Check every input (flags, data, checkpoint) and load it; bad input: one line, exit 2."""
    try:
        if args.model != common.TINY:  # a bad path fails here, before a run folder is made
            common.resolve_model_path(args.model)
        task = get_task(args.task)
        args.reward = common.check_reward(task, args.reward)
        rows = data_rows(args.data) if args.data else None
        args.out = args.out or common.default_out_dir("sft", args.task)
        ckpt, state = common.resume_checkpoint(args, ("step", "optimizer", "scheduler", "rng"))
        if rows is not None:
            problems, completions, given = data_examples(task, rows, args.data)
        else:
            problems, completions = task_demonstrations(task, args.sizes or task.SIZES,
                                                        args.train_size, args.seed, args.demo_steps)
        eval_problems = {n: task.get_problems("test", args.eval_size, size=n, seed=args.seed)
                         for n in args.eval_sizes or task.SIZES}
        run = common.Run(args.out, vars(args), resume=bool(args.resume))
        model_path = ckpt or common.resolve_model_path(args.model, run.dir)
        model, tokenizer = common.load_model(model_path, device=device,
                                             grad_checkpoint=args.grad_checkpoint)
        style = common.prompt_style(model, tokenizer)
        train = encode_examples(task, problems, completions, tokenizer, style, args.max_len)
        if args.batch_size > len(train):
            raise common.UsageError(f"--batch-size {args.batch_size} is more than the {len(train)} "
                                    "training examples")
    except (common.UsageError, ValueError) as e:
        parser.error(str(e))
    if rows is not None:
        differ = sum(g is not None and g != common.prompt_text(task, p, tokenizer, style)
                     for p, g in zip(problems, given))
        if differ:
            print(f"note: {differ} of {len(rows)} rows of {args.data} carry another prompt text; "
                  "trained on the one the RL scripts use (common.prompt_text)")
    eval_sets = {n: (ps, common.encode_prompts(task, ps, tokenizer, style))
                 for n, ps in eval_problems.items()}
    return Inputs(task, train, eval_sets, model, tokenizer, model_path, run, state)


# ---- The algorithm -------------------------------------------------------------------------------
def main(argv=None):
    parser, args = parse_args(argv)
    args = common.resumed_args(args, parser)  # a resumed run keeps the flags it was started with
    common.setup(args.seed, args.threads)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    inputs = load_inputs(args, parser, device)
    model, run, train = inputs.model, inputs.run, inputs.train
    print(f"sft: {common.count_parameters(model) / 1e6:.2f}M parameters, {len(train)} training "
          f"pairs, run folder {run.dir}")
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=args.weight_decay)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: lr_lambda(s, args.warmup, args.steps))
    step = common.restore(inputs.state, optimizer, run)
    if inputs.state:
        scheduler.load_state_dict(inputs.state["scheduler"])
    engine = common.make_engine(args.engine, model, inputs.tokenizer, inputs.model_path,
                                seed=args.seed)
    bar = tqdm(total=args.steps, initial=step, desc="sft", dynamic_ncols=True)
    with common.StopOnInterrupt() as stop:
        for step in range(step, args.steps):
            # the batch is a function of (seed, step) alone, so a resumed run sees the same batches
            rng = np.random.default_rng([args.seed, step])
            batch = [train[i] for i in rng.choice(len(train), args.batch_size, replace=False)]
            row = sft_step(model, optimizer, scheduler, batch, args, inputs.tokenizer.pad_token_id,
                           step)
            done = step + 1  # steps taken
            bar.update(1)
            bar.set_postfix(loss=f"{row['loss']:.4f}", lr=f"{row['lr']:.2e}")
            evaluate = done % args.eval_every == 0 or done == args.steps
            if evaluate:  # greedy; the last evaluation also samples --eval-k at T = 1
                model.eval()
                engine.sync(model)  # vLLM: push the current weights
                row.update(common.evaluate_sizes(
                    engine, inputs.task, inputs.eval_sets, max_new_tokens=args.max_new_tokens,
                    k=args.eval_k if done == args.steps else 0, reward_variant=args.reward))
                common.report(done, row, ("loss", "greedy/format_rate"))
            run.log(done, row)
            if evaluate or stop.requested:
                common.save_state(run, model, inputs.tokenizer, optimizer, step=done,
                                  scheduler=scheduler.state_dict())
            if stop.requested:
                bar.close()
                common.exit_interrupted("sft.py", run.dir, done)
    bar.close()
    return common.finish(run, model, inputs.tokenizer, engine, None, args.steps)


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
