"""sft.py: supervised fine-tuning, the warm start every RL script begins from.

[CR] course report "Off-Policy Finetuning for LLM Math Reasoning", §3.4 and §4.4
Eq. 1  L_SFT = -(1/N) sum_i log P(y_i | x_i)     sft_loss (x: Example.prompt, y: .completion)
§4.4   warm-up, then cosine decay; gradient clip 1.0 and accumulation   lr_lambda, sft_step
Data: the task solver's demonstrations, or --data (rows of problem fields and a "completion").
Names: [B, L]: B sequences of L tokens; T the temperature (the evaluation's samples: T = 1).
Departures: the default loss is a mean over completion tokens; Eq. 1 as written: --loss-norm seq.
  EOS is appended to every completion, so that the model learns to stop.
  The prompt x is built from the problem as the RL scripts build it, never taken from --data.
  AdamW is ours: [CR] names no optimizer.
  50 warm-up steps (of 700) where [CR] has 500: the tiny model's run is shorter.
Run: python sft.py --task countdown  (700 steps, 7:08 on 2 CPU cores)   More: docs/PAPERS.md, [CR]
"""
import argparse
import inspect
import math
import os
import sys
from typing import NamedTuple

import numpy as np
import torch
from tqdm import tqdm

import common
from tasks import HUB_ID, get_task
from tasks.files import read_jsonl
from tasks.scoring import score


# ---- Settings: SFT's flags (those every script shares: common.add_common_flags) -----------------
# Each setting's default for the tiny model and for a pretrained one: a flag left at None takes it
# (common.fill_defaults); why: the flag's --help (max_new_tokens: the RL scripts', 512 [TOPR] §4).
DEFAULTS = {"lr": (2e-3, 2e-5), "max_new_tokens": (64, 512)}  # flag: (tiny, a pretrained model)
EVAL_SEED = 0  # the T = 1 evaluation samples' seed: every checkpoint meets the same random numbers


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    add = parser.add_argument
    # the loss and its optimisation ([CR] §4.4)
    add("--steps", type=common.positive_int, default=700, help="optimizer steps")
    add("--batch-size", type=common.positive_int, default=64, help="sequences (prompt and "
        "completion) per step; 64 and --lr 2e-3: the tiny model learns by steps, not examples")
    add("--grad-accum", type=common.positive_int, default=1,
        help="micro-batches per step, to save memory")
    add("--lr", type=common.positive_float, default=None, help="AdamW peak lr, then cosine decay "
        "(tiny: see --batch-size; a pretrained model: TRL SFTConfig's, docs/REAL-MODEL.md's start "
        "model; [CR] gives none)")
    add("--warmup", type=common.nonnegative_int, default=50, help="linear warm-up ([CR]: 500)")
    add("--weight-decay", type=common.nonnegative_float, default=0.0, help="AdamW's")
    add("--loss-norm", choices=["token", "seq"], default="token",
        help="token: mean over completion tokens (HF's); seq: Eq. 1 as written")
    add("--max-len", type=common.positive_int, default=1024,
        help="prompt + completion tokens; the completion is cut, never the prompt")
    # the data: the task's demonstrations, or --data
    add("--data", default=None, help="JSONL file or hub dataset of problems with a 'completion'")
    add("--demo-steps", action="store_true", help="demonstrations show their steps first")
    # evaluation: sft.py's own --eval-k may be 0, and it evaluates a --reward, never trains on one
    add("--eval-k", type=common.nonnegative_int, default=8,
        help="held-out samples per problem at T = 1 (0: greedy only)")
    add("--reward", default=None, help="reward variant evaluated; None: the task's first")
    common.add_common_flags(
        parser, __file__, DEFAULTS, "", skip=("problems", "eval_k"), eval_every=200, save_every=200,
        clip=dict(help="gradient-norm clip ([CR] §4.4)"),
        model=dict(default="tiny", help="`tiny` (built in, untrained), `smollm2` (SmolLM2-135M-"
                   "Instruct, a pretrained chat model from a PyPI wheel), a folder or a hub id"))
    return parser, parser.parse_args(argv)


# ---- The loss and the schedule: pure functions ---------------------------------------------------
def sft_loss(logprobs: torch.Tensor, mask: torch.Tensor, norm: str = "token") -> torch.Tensor:
    """Masked negative log-likelihood of the completions, [CR] Eq. 1.
    logprobs: [B, L] log P(y_t | x, y_<t), 0 on padding; mask: [B, L] 1 on completion tokens (EOS
    included), 0 on padding. norm "token": the sum over the number of completion tokens; "seq":
    the mean over sequences of each sum (Eq. 1 as written; equal lengths L: seq = L x token)."""
    nll = -(logprobs * mask).sum(-1)  # [B] -log P(y_i | x_i)
    if norm == "token":
        return nll.sum() / mask.sum()
    if norm == "seq":
        return nll.mean()
    raise ValueError(f"unknown loss normalisation {norm!r}")


def lr_lambda(step: int, warmup: int, total: int) -> float:
    """Peak lr multiplier: linear warm-up for `warmup` steps, cosine to 0 at `total` ([CR] §4.4)"""
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
    eos = [tokenizer.eos_token_id]  # appended to every completion: the model learns to stop
    examples = []
    for prompt, text in zip(common.encode_prompts(task, problems, tokenizer, style), completions):
        completion = tokenizer(text, add_special_tokens=False)["input_ids"] + eos
        if len(prompt) < max_len:  # never cut a prompt
            examples.append(Example(prompt, completion[:max_len - len(prompt)]))
    if not examples:
        raise ValueError(f"no example fits in --max-len {max_len}")
    return examples


def task_demonstrations(task, sizes, per_size, seed, show_steps=False):
    """(problems, completion texts) from the task's solver; `show_steps`: --demo-steps."""
    if show_steps and "steps" not in inspect.signature(task.demonstration).parameters:
        raise ValueError(f"--demo-steps: task {task.NAME}'s demonstration() has no steps=")
    problems = [problem for n in sizes
                for problem in task.get_problems("train", per_size, size=n, seed=seed)]
    demos = [(problem, task.demonstration(problem, steps=True) if show_steps
              else task.demonstration(problem))
             for problem in problems]  # None: the solver found no solution
    return ([problem for problem, d in demos if d is not None],
            [d for _, d in demos if d is not None])


def read_data(task, source: str):
    """(problems, completion texts, the rows' own prompt texts or None) of --data, a JSONL file or
    a hub dataset; ValueError naming the file (and line) or the example that is not one."""
    if source.endswith(".jsonl") or os.path.exists(source) or not HUB_ID.match(source):
        rows = read_jsonl(source, "data file")
    else:
        try:
            import datasets
            rows = list(datasets.load_dataset(source, split="train"))
        except Exception as e:  # no `datasets`, no hub, no such dataset: one line
            first = str(e).splitlines()[0] if str(e) else type(e).__name__
            raise ValueError(f"hub dataset {source}: {first} (needs `datasets`, the hub)") from None
    if not rows:
        raise ValueError(f"{source} holds no examples")
    problems = []
    for i, row in enumerate(rows, 1):
        try:
            problems.append(task.problem_from_row(row))
        except ValueError as e:
            raise ValueError(f"{source}: example {i}: {e} (the prompt is built from the problem "
                             f"fields {', '.join(task.FIELDS)})") from None
        if not isinstance(row.get("completion"), str):
            raise ValueError(f"{source}: example {i}: needs a string field 'completion'")
    given_prompts = [row.get("prompt", row.get("query")) for row in rows]
    return problems, [row["completion"] for row in rows], given_prompts


# ---- One optimizer step --------------------------------------------------------------------------
def sft_step(model, optimizer, scheduler, batch: list[Example], args, pad_id: int,
             step: int) -> dict:
    """One optimizer step of Eq. 1 on `batch` after `step` steps, in --grad-accum micro-batches."""
    model.train()
    optimizer.zero_grad(set_to_none=True)
    n_tokens = sum(len(ex.completion) for ex in batch)
    batch_loss = 0.0
    # at most one micro-batch an example: none is empty
    for micro in np.array_split(np.arange(len(batch)), min(args.grad_accum, len(batch))):
        prompts = [batch[i].prompt for i in micro]
        completions = [batch[i].completion for i in micro]
        logprobs, mask = common.completion_logprobs(model, prompts, completions, pad_id,
                                                    bf16=args.bf16)  # log P(y_t | x, y_<t)
        loss = sft_loss(logprobs, mask, norm=args.loss_norm)  # Eq. 1
        # weight each micro-batch by its share, so the sum equals the loss of the whole batch
        share = (mask.sum().item() / n_tokens if args.loss_norm == "token"
                 else len(micro) / len(batch))
        (loss * share).backward()
        batch_loss += loss.item() * share
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip).item()  # §4.4
    if not (math.isfinite(batch_loss) and math.isfinite(grad_norm)):  # before the weights move
        tqdm.write(f"error: step {step + 1}: non-finite loss={batch_loss} or grad_norm="
                   f"{grad_norm}; weights not updated, the last checkpoint is the last good state. "
                   "Likely cause: too high --lr", file=sys.stderr)
        raise SystemExit(1)
    optimizer.step()
    scheduler.step()  # the next step's lr: lr_lambda
    return {"loss": batch_loss, "grad_norm": grad_norm, "lr": scheduler.get_last_lr()[0]}


# ---- Evaluation ----------------------------------------------------------------------------------
def evaluate(engine, model, task, eval_sets, args, sampled: bool) -> dict:
    """Held-out metrics per size (eval3/greedy/accuracy, ...; tasks/scoring.py): one greedy
    completion a problem and, when `sampled`, --eval-k samples at T = 1 drawn with EVAL_SEED."""
    model.eval()
    engine.sync(model)  # copies the trained weights into the engine (vLLM; hf and kv share them)
    greedy = common.SamplingConfig(n=1, max_new_tokens=args.max_new_tokens, temperature=0.0)
    t_1 = common.SamplingConfig(n=args.eval_k, max_new_tokens=args.max_new_tokens, seed=EVAL_SEED)
    modes = [("greedy", greedy)] + ([("sampled", t_1)] if sampled and args.eval_k else [])
    metrics = {}
    for size, (problems, prompts) in eval_sets.items():
        for mode, sampling in modes:
            groups = engine.generate(prompts, sampling)
            metrics.update(score(task, problems, groups, mode=mode, reward_variant=args.reward,
                                 prefix=f"eval{size}/"))
    return metrics


# ---- main(): every input checked, then the loop (saving and resuming: common.Run) -----------
def main(argv=None):
    parser, args = parse_args(argv)
    # --resume, the run folder and its checkpoint (common.Run)
    run = common.Run(parser, args, __file__, keys={"model", "optimizer", "scheduler"})
    common.setup(args.seed, args.threads)  # seeds python, numpy and torch; torch's CPU threads
    try:  # every input is checked before anything long starts: bad input is one line and exit 2
        task = get_task(args.task)
        # the flags left at None that the task decides (--lr, --max-new-tokens: the model, below)
        args.reward = args.reward or task.REWARD_VARIANTS[0]
        args.sizes = args.sizes or task.SIZES
        args.eval_sizes = args.eval_sizes or task.SIZES
        if args.reward not in task.REWARD_VARIANTS:
            raise ValueError(f"unknown --reward {args.reward!r}; choose from "
                             f"{', '.join(task.REWARD_VARIANTS)}")
        if args.data:
            problems, completions, given_prompts = read_data(task, args.data)
        else:
            problems, completions = task_demonstrations(task, args.sizes, args.train_size,
                                                        args.seed, show_steps=args.demo_steps)
        held_out = {size: task.get_problems("test", args.eval_size, size=size, seed=args.seed)
                    for size in args.eval_sizes}
        # `tiny` is built inside the run folder (RUN/tiny-init); a bad path fails before one is made
        model, tokenizer = common.load_model(args.model, run_dir=args.out,
                                             grad_checkpoint=args.grad_checkpoint,
                                             device="cuda" if torch.cuda.is_available() else "cpu")
        args.model_path = model.name_or_path  # the folder or hub id: resume restarts from it
        common.fill_defaults(args, DEFAULTS, model)  # flags left at None
        style = common.prompt_style(model, tokenizer)
        examples = encode_examples(task, problems, completions, tokenizer, style, args.max_len)
        if args.batch_size > len(examples):
            raise ValueError(f"--batch-size {args.batch_size} exceeds the {len(examples)} examples")
    except ValueError as e:  # UsageError is one
        parser.error(str(e))
    if args.data:  # the rows' own prompt texts are not used: say how many differ from ours
        differ = sum(g is not None and g != common.prompt_text(task, problem, tokenizer, style)
                     for problem, g in zip(problems, given_prompts))
        if differ:
            print(f"note: {differ} of {len(problems)} rows of {args.data} carry another prompt "
                  "text; trained on the one the RL scripts use (common.prompt_text)")
    eval_sets = {size: (test, common.encode_prompts(task, test, tokenizer, style))
                 for size, test in held_out.items()}
    print(f"sft: {common.count_parameters(model) / 1e6:.2f}M parameters, "
          f"{len(examples)} training pairs, run folder {args.out}")
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=args.weight_decay)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: lr_lambda(s, warmup=args.warmup, total=args.steps))
    start = run.begin(model=model, optimizer=optimizer, scheduler=scheduler)  # 0, or the saved
    engine = common.make_engine(args.engine, model, tokenizer, args.model_path, seed=args.seed,
                                bf16=args.bf16, max_new_tokens=args.max_new_tokens)
    if start == 0:  # the start model, greedy and T = 1: where the closing lines measure from
        run.log(0, evaluate(engine, model, task, eval_sets, args, sampled=True))
    for step in tqdm(range(start, args.steps), "sft", total=args.steps, initial=start, leave=False):
        # the batch is a function of (seed, step) alone, so a resumed run sees the same batches
        rng = np.random.default_rng([args.seed, step])
        batch = [examples[i] for i in rng.choice(len(examples), args.batch_size, replace=False)]
        metrics = sft_step(model, optimizer, scheduler, batch, args, tokenizer.pad_token_id, step)
        # the metrics row; an evaluation (greedy; at the end also --eval-k samples at T = 1)
        # and a checkpoint where due; the end, or --time-limit
        if run.end_step(step + 1, metrics, last=step + 1 == args.steps, evaluate=lambda: evaluate(
                engine, model, task, eval_sets, args, sampled=run.ending)):
            break
    engine.close()
    return run.finish(model, tokenizer)


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
