"""rloo.py: REINFORCE Leave-One-Out, on-policy, with vLLM generation and in-process weight sync.

Course report (../shared/papers/000_*, §3.5, Eqs. 2-3), Ahmadian et al. 2024, ../shared/ALGORITHMS.md §2.
Maximise J(pi) = E_x E_{y~pi}[R(x, y)]. For each prompt x draw k >= 2 samples y_1..y_k from the CURRENT
policy at temperature 1 with no top-p/top-k (anything else is off-policy), score them, and

    R_i  = r(x, y_i) - beta * sg(log pi(y_i|x) - log pi_ref(y_i|x))   (KL in the reward; beta = 0 in [CR])
    A_i  = R_i - 1/(k-1) * sum_{j != i} R_j                             (Eq. 2: leave-one-out baseline)
    loss = -1/(B k) * sum_x sum_i sg(A_i) * log pi(y_i|x)               (Eq. 3, `--loss-norm seq`)

One optimizer step per batch of fresh samples (no PPO-style reuse), then the new weights are pushed into
the generation engine, so that the next batch is sampled from exactly the weights being trained. The
metric `logprob_gap` (max |engine log-prob - trainer log-prob| over the sampled tokens) checks that sync
at every step: it must stay near 0 (fp32) for the method to be on-policy. The KL to pi_ref is logged as
`kl_to_ref` at every evaluation, and as `kl` at every step when beta > 0 (it is then part of the reward;
with beta = 0 the reference forward pass is skipped, 10% of a step here).

Groups whose k rewards are all equal have A = 0 and teach nothing (correct, not a bug). As the policy
improves, more groups become all-correct and the batch's learning signal shrinks (`signal_share`).
`--resample-uniform` (on by default) then draws further prompts until the batch holds --prompts groups
with signal (dynamic sampling, as in DAPO), so each step keeps a full batch of gradient, at the price of
more generation per step. Dropping all-equal groups changes no expected gradient direction (their
advantages are 0); it only stops them from diluting the batch mean.

Run:  python sft.py --task countdown && python rloo.py --task countdown     (CPU, minutes)
      python rloo.py --model runs/sft-.../final --engine vllm               (GPU)
"""
from __future__ import annotations

import argparse
import math
import os
import sys
import time

import numpy as np
import torch
from tqdm import tqdm

import common
from tasks import get_task


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--task", default="countdown", help="task module in tasks/")
    p.add_argument("--model", default="sft", help="`sft` (the newest sft.py run of --task), a folder or a hub id")
    p.add_argument("--out", default=None, help="run folder (default runs/rloo-TASK-TIME)")
    p.add_argument("--resume", default=None, metavar="RUN_DIR", help="continue the run in RUN_DIR")
    # the algorithm
    p.add_argument("--steps", type=common.positive_int, default=100,
                   help="optimizer steps (one per batch); on the tiny model the curve flattens after ~100")
    p.add_argument("--time-limit", type=common.positive_float, default=None, metavar="MIN",
                   help="stop training MIN minutes after the start of this invocation (then evaluate and save as at --steps)")
    p.add_argument("--prompts", type=common.positive_int, default=64, help="prompts per batch (B)")
    p.add_argument("--k", type=int, default=4,
                   help="samples per prompt (k >= 2). Same 256 completions a step: B=64 x k=4 learned faster per "
                        "step here than 32 x 8 and 16 x 16 (more prompts, less correlated gradient)")
    p.add_argument("--beta", type=float, default=0.0, help="KL penalty folded into the reward ([CR]: 0)")
    p.add_argument("--loss-norm", choices=["seq", "seq/len", "token"], default="seq",
                   help="seq: sum over tokens then mean over sequences (Eq. 3); seq/len; token")
    p.add_argument("--reward", default="original", help="reward variant: original, A or B")
    p.add_argument("--resample-uniform", action=argparse.BooleanOptionalAction, default=True,
                   help="draw more prompts until --prompts groups have non-equal rewards (dynamic sampling)")
    p.add_argument("--max-draws", type=common.positive_int, default=4,
                   help="with --resample-uniform: at most this many generation rounds a step")
    p.add_argument("--lr", type=common.positive_float, default=6e-5,
                   help="AdamW lr (tiny model: 3e-5 slower; 8e-5 and 1e-4, even with warm-up, no better; 2e-4 diverged)")
    p.add_argument("--warmup", type=int, default=10,
                   help="steps of linear lr warm-up: Adam's first updates are ~lr*sign(g) for every weight, "
                        "so without it the first noisy batches move the model furthest")
    p.add_argument("--clip", type=common.positive_float, default=1.0, help="gradient-norm clip")
    p.add_argument("--micro-batch", type=common.positive_int, default=16,
                   help="prompts (groups of k) per forward/backward pass: memory only, same gradient")
    p.add_argument("--max-new-tokens", type=common.positive_int, default=64)
    p.add_argument("--num-numbers", default="3,4", help="puzzle sizes to train on, comma-separated")
    p.add_argument("--eval-numbers", default="3,4", help="held-out puzzle sizes to evaluate, comma-separated")
    p.add_argument("--problems", default=None,
                   help="training puzzles from a JSONL file or the hub instead of the generator")
    p.add_argument("--train-size", type=common.positive_int, default=20000, help="training puzzles per size")
    # evaluation
    p.add_argument("--eval-every", type=common.positive_int, default=50)
    p.add_argument("--eval-size", type=common.positive_int, default=200, help="held-out puzzles per size")
    p.add_argument("--eval-k", type=common.positive_int, default=8, help="samples a puzzle at temperature 1")
    p.add_argument("--save-every", type=common.positive_int, default=50)
    # system
    p.add_argument("--engine", default="auto", choices=["auto", "vllm", "hf"], help="generation engine")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=common.positive_int, default=None, help="torch CPU threads")
    return p, p.parse_args(argv)


# ---------------------------------------------------------------------------------------------------
# The estimator: pure functions of tensors
# ---------------------------------------------------------------------------------------------------
def rloo_advantages(rewards: torch.Tensor) -> torch.Tensor:
    """Leave-one-out advantages, [CR] Eq. 2.  rewards: [B, k]  ->  A: [B, k].

    A_i = R_i - mean_{j != i} R_j = k/(k-1) * (R_i - mean_j R_j); each group's A sums to 0. A sample's
    own reward is never in its baseline (that would shrink the estimate by (k-1)/k).
    """
    k = rewards.shape[-1]
    if k < 2:
        raise ValueError("RLOO needs k >= 2 samples per prompt")
    # R_i - (sum_j R_j - R_i)/(k-1), written in the centred form, which sums to 0 more exactly in floats
    return k / (k - 1) * (rewards - rewards.mean(-1, keepdim=True))


def rloo_loss(logprobs: torch.Tensor, mask: torch.Tensor, advantages: torch.Tensor,
              norm: str = "seq") -> torch.Tensor:
    """Policy-gradient surrogate, [CR] Eq. 3: -mean_i sg(A_i) * log pi(y_i|x).

    logprobs:   [N, T] per-token log pi(y_t | x, y_<t), with gradient; 0 on padding
    mask:       [N, T] 1 on completion tokens (EOS included)
    advantages: [N]    A_i (detached here)
    norm: "seq" sum over tokens, mean over sequences (the paper); "seq/len" each sum divided by its length;
          "token" sum of A_i * log-prob over all tokens divided by the number of tokens.
    """
    adv = advantages.detach()
    if norm == "token":
        return -(adv[:, None] * logprobs * mask).sum() / mask.sum()
    lp = (logprobs * mask).sum(-1)  # [N] log pi(y_i|x)
    if norm == "seq/len":
        lp = lp / mask.sum(-1).clamp(min=1)
    elif norm != "seq":
        raise ValueError(f"unknown loss normalisation {norm!r}")
    return -(adv * lp).mean()


# ---------------------------------------------------------------------------------------------------
# Training
# ---------------------------------------------------------------------------------------------------
def draw_batch(engine, task, pool, prompts_of, step, args):
    """Sample k completions for --prompts prompts (fresh draws of prompts, seeded by step).

    With --resample-uniform, groups whose k rewards are all equal are set aside and further prompts are
    drawn, up to --max-draws rounds, until --prompts groups carry a learning signal; each further round
    draws only as many prompts as the share of signal seen so far says are missing (plus a quarter). If
    there are still too few, the batch is topped up with uniform groups (which add zero gradient).
    """
    rng = np.random.default_rng([args.seed, step])
    sc = common.SamplingConfig(n=args.k, max_new_tokens=args.max_new_tokens, temperature=1.0)  # on-policy
    kept, uniform, drawn = [], [], 0
    for _ in range(args.max_draws if args.resample_uniform else 1):
        missing = args.prompts - len(kept)
        share = len(kept) / drawn if drawn else 1.0  # of the groups drawn so far, those with a signal
        m = args.prompts if drawn == 0 else min(args.prompts, math.ceil(1.25 * missing / max(share, 0.25)))
        idx = rng.choice(len(pool), m, replace=False)
        groups = engine.generate([prompts_of[i] for i in idx], sc)
        drawn += len(idx)
        for i, g in zip(idx, groups):
            r = [task.reward(pool[i], s.text, args.reward) for s in g]
            (kept if (max(r) > min(r) or not args.resample_uniform) else uniform).append((pool[i], g, r))
        if len(kept) >= args.prompts:
            break
    batch = (kept + uniform)[:args.prompts]
    share = len(kept) / drawn if args.resample_uniform else np.mean([max(r) > min(r) for _, _, r in batch])
    return batch, share, drawn * args.k


def main(argv=None):
    started = time.time()
    parser, args = parse_args(argv)
    args = common.resumed_args(args, parser)  # a resumed run keeps the flags it was started with
    common.setup(args.seed, args.threads)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    out = args.out or common.default_out_dir("rloo", args.task)

    try:  # every bad input surfaces here, before any training: one line, exit status 2
        task = get_task(args.task)
        if args.reward not in task.REWARD_VARIANTS:
            raise ValueError(f"unknown --reward {args.reward!r}; choose from {', '.join(task.REWARD_VARIANTS)}")
        if args.k < 2:
            raise ValueError(f"--k must be at least 2 for a leave-one-out baseline, got {args.k}")
        try:
            sizes = [int(s) for s in str(args.num_numbers).split(",")]
            eval_sizes = [int(s) for s in str(args.eval_numbers).split(",")]
        except ValueError:
            raise ValueError(f"--num-numbers/--eval-numbers: expected comma-separated integers, got "
                             f"{args.num_numbers!r}/{args.eval_numbers!r}") from None
        ckpt = common.checkpoint_path(os.path.join(out, "checkpoint")) if args.resume else None
        if args.resume and ckpt is None:
            raise ValueError(f"--resume {args.resume}: no checkpoint to resume from")
        ref_path = common.resolve_model_path(args.model, task=args.task)
        if args.problems:
            pool = task.get_problems("train", args.train_size, source=args.problems, seed=args.seed)
        else:
            pool = [p for n in sizes for p in task.get_problems("train", args.train_size, size=n, seed=args.seed)]
        eval_problems = {n: task.get_problems("test", args.eval_size, size=n, seed=args.seed) for n in eval_sizes}
        run = common.Run(out, {**vars(args), "model_path": ref_path}, resume=bool(args.resume))
        model, tokenizer = common.load_model(ckpt or ref_path, device=device)
        ref_model, _ = common.load_model(ref_path, device=device)  # frozen pi_ref: for beta > 0 and kl_to_ref
    except (common.UsageError, ValueError) as e:
        parser.error(str(e))
    ref_model.requires_grad_(False)
    style = common.prompt_style(model, tokenizer)
    prompts_of = common.encode_prompts(task, pool, tokenizer, style)
    eval_sets = {n: (ps, common.encode_prompts(task, ps, tokenizer, style)) for n, ps in eval_problems.items()}
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0)
    step = 0
    if ckpt:
        state = common.load_trainer_state(ckpt)
        optimizer.load_state_dict(state["optimizer"])
        common.set_rng_state(state["rng"])
        step = state["step"]
        run.truncate(step)
        print(f"resumed from {ckpt} at step {step}")
    engine = common.make_engine(args.engine, model, tokenizer, ckpt or ref_path, seed=args.seed)
    engine.sync(model)
    print(f"rloo: {common.count_parameters(model) / 1e6:.2f}M parameters from {ref_path}, engine {engine.name}, "
          f"B={args.prompts} k={args.k} beta={args.beta}, run folder {run.dir}")

    def evaluate():
        model.eval()
        metrics = {}
        for n, (problems, prompts) in eval_sets.items():
            metrics.update(common.evaluate(engine, task, problems, prompts, k=args.eval_k, prefix=f"eval{n}/",
                                           max_new_tokens=args.max_new_tokens, reward_variant=args.reward))
        # KL(pi || pi_ref) per sequence: 4 samples of 64 training prompts (every step too when beta > 0: "kl")
        idx = np.random.default_rng([args.seed, 7]).choice(len(pool), min(64, len(pool)), replace=False)
        metrics["kl_to_ref"] = common.kl_to_ref(engine, model, ref_model, [prompts_of[i] for i in idx],
                                                tokenizer.pad_token_id, max_new_tokens=args.max_new_tokens)
        return metrics

    if step == 0:
        row = evaluate()
        run.log(0, row)
        tqdm.write("step 0: " + "  ".join(f"{k}={v:.3f}" for k, v in row.items() if k.endswith("sampled/accuracy")))
    bar = tqdm(total=args.steps, initial=step, desc="rloo", dynamic_ncols=True)
    deadline = started + 60 * args.time_limit if args.time_limit else float("inf")
    while step < args.steps:
        t0 = time.perf_counter()
        model.eval()
        batch, signal_share, generated = draw_batch(engine, task, pool, prompts_of, step, args)
        samples = [s for _, g, _ in batch for s in g]
        rewards = torch.tensor([r for _, _, rs in batch for r in rs]).view(len(batch), args.k)  # [B, k]
        t_gen = time.perf_counter() - t0

        model.train()
        optimizer.zero_grad(set_to_none=True)
        n_samples, n_tokens = len(samples), sum(len(s.ids) for s in samples)
        loss_sum, h_all, len_all, logprob_gap = 0.0, [], [], 0.0
        # micro-batches of whole groups, sorted by length so that each pads to its own longest completion
        by_length = sorted(batch, key=lambda item: max(len(s.ids) for s in item[1]))
        for start in range(0, len(batch), args.micro_batch):
            groups = by_length[start:start + args.micro_batch]
            mb = [s for _, g, _ in groups for s in g]
            r = torch.tensor([x for _, _, rs in groups for x in rs]).view(len(groups), args.k)  # [b, k]
            prompts, completions = [s.prompt_ids for s in mb], [s.ids for s in mb]
            logprobs, mask = common.completion_logprobs(model, prompts, completions, tokenizer.pad_token_id)
            with torch.no_grad():
                engine_lp = torch.zeros_like(mask)
                for i, s in enumerate(mb):
                    engine_lp[i, :len(s.ids)] = torch.tensor(s.logprobs)
                logprob_gap = max(logprob_gap, ((engine_lp - logprobs.detach()).abs() * mask).max().item())
                if args.beta:  # h = log pi(y|x) - log pi_ref(y|x): [b*k]; with beta = 0 only evaluate() measures it
                    ref_lp, _ = common.completion_logprobs(ref_model, prompts, completions, tokenizer.pad_token_id)
                    h = ((logprobs.detach() - ref_lp) * mask).sum(-1)
                    h_all.append(h)
                    r = r - args.beta * h.view_as(r)  # R = r - beta sg(h)
            advantages = rloo_advantages(r).view(-1)  # Eq. 2
            # weight each micro-batch by its share, so the sum is the loss of the whole batch (Eq. 3)
            share = mask.sum().item() / n_tokens if args.loss_norm == "token" else len(mb) / n_samples
            loss = rloo_loss(logprobs, mask, advantages, args.loss_norm) * share
            loss.backward()
            loss_sum += loss.item()
            len_all.append(mask.sum(-1))
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip).item()
        for group in optimizer.param_groups:  # linear warm-up to --lr over --warmup steps, then constant
            group["lr"] = args.lr * min(1.0, (step + 1) / max(args.warmup, 1))
        optimizer.step()
        model.eval()
        t_sync = time.perf_counter()
        engine.sync(model)  # the next batch is sampled from exactly these weights
        t_sync = time.perf_counter() - t_sync
        step += 1

        grades = [task.grade(p, s.text) for p, g, _ in batch for s in g]
        row = {"loss": loss_sum, "reward": rewards.mean().item(),
               "accuracy": float(np.mean([g == "correct" for g in grades])),
               "format_rate": float(np.mean([g != "no_answer" for g in grades])),
               **({"kl": torch.cat(h_all).mean().item()} if h_all else {}), "length": torch.cat(len_all).mean().item(),
               "logprob_gap": logprob_gap, "signal_share": float(signal_share), "grad_norm": grad_norm,
               "samples": len(samples), "generated": generated, "time_generate": t_gen, "time_sync": t_sync,
               "time_step": time.perf_counter() - t0}
        last = step == args.steps or time.time() >= deadline
        if step % args.eval_every == 0 or last:
            row.update(evaluate())
            tqdm.write(f"step {step}: " + "  ".join(
                f"{k}={row[k]:.3f}" for k in row if k.endswith("sampled/accuracy") or k in ("signal_share", "kl_to_ref")))
        run.log(step, row)
        bar.update(1)
        bar.set_postfix(reward=f"{row['reward']:.3f}", acc=f"{row['accuracy']:.2f}", gap=f"{logprob_gap:.1e}")
        if step % args.save_every == 0 or last:
            common.save_checkpoint(run.path("checkpoint"), model, tokenizer,
                                   {"step": step, "optimizer": optimizer.state_dict(), "rng": common.rng_state()})
        if last:
            break
    bar.close()
    common.save_checkpoint(run.path("final"), model, tokenizer)
    engine.close()
    print(f"done: final model in {run.path('final')}  ({run.path('metrics.jsonl')})")
    return run.dir


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
