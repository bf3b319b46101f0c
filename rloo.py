"""rloo.py: REINFORCE Leave-One-Out, on-policy, with the sampler's weights synced after every step.

[CR]   the course report "Off-Policy Finetuning for LLM Math Reasoning", §3.5, Eqs. 2-3.
[RLOO] Ahmadian et al. 2024, "Back to Basics: Revisiting REINFORCE Style Optimization for Learning
       from Human Feedback in LLMs", arXiv:2402.14740.

Maximise J(pi) = E_x [ E_{y~pi} r(x, y) - beta KL(pi(.|x) || pi_ref(.|x)) ]. For each prompt x
draw k >= 2 samples y_1..y_k from the CURRENT policy at temperature 1 with no top-p/top-k (anything
else is off-policy), score them, and

    h_i  = log pi(y_i|x) - log pi_ref(y_i|x)               (per sequence; pi_ref: the --model)
    R_i  = r(x, y_i) - beta * sg(h_i)                      (KL in the reward, [RLOO]; [CR]: beta=0)
    A_i  = R_i - 1/(k-1) * sum_{j != i} R_j                ([CR] Eq. 2: leave-one-out baseline)
    loss = -1/(B k) * sum_x sum_i sg(A_i) * log pi(y_i|x)  ([CR] Eq. 3, `--loss-norm seq`)

The detached R gives the gradient of J itself: grad E_pi[h] = E_pi[h grad log pi] + E_pi[grad
log pi], and the second term is 0. One optimizer step per batch of fresh samples (no PPO-style
reuse), then the new weights go into the generation engine, so the next batch is sampled from
exactly the weights being trained; `logprob_gap` (max |engine log-prob - trainer log-prob|)
must stay near 0 to show it. The KL to pi_ref is logged as `kl_to_ref` at every evaluation, and as
`kl` (mean h) at every step when beta > 0 (with beta = 0 the reference forward pass is skipped).

A group whose k advantages are all 0 adds nothing to the gradient; rloo_step passes over it (no
forward or backward pass) and still divides by the whole batch, so the estimate is Eq. 3's.

Dynamic sampling (`--resample-uniform`, as in DAPO; off by default, as [CR] and [RLOO] are
written): such groups dilute the batch mean, so they are set aside and further prompts drawn until
the batch holds --prompts groups whose advantages can be non-zero. A group is set aside only when
its R_i are all equal: its rewards r are equal and, with beta > 0, its k completions identical
too. A group with equal r but different completions still carries the KL term -beta (h_i - mean h),
and dropping it would bias the gradient of J; dropping groups with A = 0 only rescales it.

Run:  python sft.py --task countdown && python rloo.py --task countdown     (CPU, minutes)
      python rloo.py --model runs/sft-.../final --engine vllm               (GPU)
"""
import argparse
import math
import sys
import time
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import torch
from tqdm import tqdm

import common
from tasks import get_task


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=common.positive_int, default=400,
                   help="optimizer steps, one a batch, and the lr decay's horizon (tiny model: "
                        "under 5 minutes on 2 CPU cores)")
    p.add_argument("--prompts", type=common.positive_int, default=64, help="prompts per batch (B)")
    p.add_argument("--k", type=int, default=4,
                   help="samples per prompt (k >= 2); 64 x 4 learned faster per step than 32 x 8 "
                        "or 16 x 16 with the same 256 completions (commit b27f023)")
    p.add_argument("--beta", type=common.nonnegative_float, default=0.0,
                   help="KL penalty folded into the reward ([CR]: 0)")
    p.add_argument("--loss-norm", choices=["seq", "seq/len", "token"], default="seq",
                   help="seq: sum over tokens then mean over sequences (Eq. 3); seq/len; token")
    p.add_argument("--reward", default=None,
                   help="reward variant trained on; default: the task's first")
    p.add_argument("--resample-uniform", action=argparse.BooleanOptionalAction, default=False,
                   help="draw more prompts until --prompts groups have advantages that can be "
                        "non-zero (dynamic sampling; module docstring)")
    p.add_argument("--max-draws", type=common.positive_int, default=4,
                   help="with --resample-uniform: at most this many generation rounds a step")
    p.add_argument("--lr", type=common.positive_float, default=6e-5,
                   help="AdamW lr: the fastest of those tried on the tiny model that did not "
                        "diverge (commit d4f60ab)")
    p.add_argument("--warmup", type=common.nonnegative_int, default=10,
                   help="steps of linear lr warm-up: Adam's first updates are ~lr*sign(g) for "
                        "every weight, so without it the first noisy batches move it furthest")
    p.add_argument("--lr-schedule", choices=["linear", "constant"], default="linear",
                   help="after the warm-up: linear decay to 0 at --steps (TRL's), or constant")
    common.add_run_flags(p, eval_every=50, save_every=50, micro_batch=8,
                         micro_help="prompts (groups of k) per forward/backward pass: memory and "
                         "speed, not maths (8 x 4 rows were the fastest on a CPU)")
    return p, p.parse_args(argv)


# ---- The estimator: pure functions ---------------------------------------------------------------
def regularised_rewards(rewards: torch.Tensor, h: torch.Tensor, beta: float) -> torch.Tensor:
    """R = r - beta * sg(h), the KL-regularised reward.  rewards, h: [B, k]  ->  R: [B, k]."""
    return rewards - beta * h.detach()


def rloo_advantages(rewards: torch.Tensor) -> torch.Tensor:
    """Leave-one-out advantages, [CR] Eq. 2.  rewards: [B, k]  ->  A: [B, k].

    A_i = R_i - mean_{j != i} R_j = k/(k-1) * (R_i - mean_j R_j); each group's A sums to 0. A
    sample's own reward is never in its baseline (that would shrink the estimate by (k-1)/k).
    """
    k = rewards.shape[-1]
    if k < 2:
        raise ValueError("RLOO needs k >= 2 samples per prompt")
    # R_i - (sum_j R_j - R_i)/(k-1), written in the centred form, which sums to 0 more exactly
    return k / (k - 1) * (rewards - rewards.mean(-1, keepdim=True))


def rloo_loss(logprobs: torch.Tensor, mask: torch.Tensor, advantages: torch.Tensor,
              norm: str = "seq") -> torch.Tensor:
    """Policy-gradient surrogate, [CR] Eq. 3: -mean_i sg(A_i) * log pi(y_i|x).

    logprobs:   [N, T] per-token log pi(y_t | x, y_<t), with gradient; 0 on padding
    mask:       [N, T] 1 on completion tokens (EOS included)
    advantages: [N]    A_i (detached here)
    norm: "seq" sum over tokens, mean over sequences (the paper); "seq/len" each sum divided by its
          length; "token" sum of A_i * log-prob over all tokens divided by the number of tokens.
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


def has_signal(rewards, completions, beta: float) -> bool:
    """Whether a group's advantages can be non-zero (dynamic sampling keeps exactly these groups).

    rewards: k floats r_i; completions: k token-id sequences. With beta > 0 the advantages come
    from R_i = r_i - beta h_i: all equal if the r_i are equal and the completions identical (h is a
    function of the completion), and with different completions in general not.
    """
    if max(rewards) > min(rewards):
        return True
    return beta != 0 and len({tuple(c) for c in completions}) > 1


# ---- Sampling ------------------------------------------------------------------------------------
class Group(NamedTuple):
    """k completions of one prompt and their rewards r_i."""
    problem: dict
    samples: list          # [k] common.Sample
    rewards: list[float]   # [k]


@dataclass
class Batch:
    groups: list[Group]    # --prompts groups
    signal_share: float    # share of the groups drawn whose advantages can be non-zero
    generated: int         # completions generated for this batch (all rounds)


def draw_batch(engine, task, pool, prompts, step, args) -> Batch:
    """Sample k completions for --prompts prompts (fresh draws of prompts, seeded by step).

    With --resample-uniform, groups without signal (has_signal) are set aside and further prompts
    are drawn, up to --max-draws rounds, until --prompts groups carry one; each further round draws
    only as many prompts as the share of signal seen so far says are missing (plus a quarter). If
    there are still too few, the batch is topped up with the groups set aside (zero gradient).
    """
    rng = np.random.default_rng([args.seed, step])
    sc = common.SamplingConfig(n=args.k, max_new_tokens=args.max_new_tokens, temperature=1.0)
    kept, set_aside, drawn = [], [], 0
    for _ in range(args.max_draws if args.resample_uniform else 1):
        missing = args.prompts - len(kept)
        share = len(kept) / drawn if drawn else 1.0  # of the groups drawn so far, those with signal
        m = args.prompts if drawn == 0 else min(args.prompts,
                                                 math.ceil(1.25 * missing / max(share, 0.25)))
        idx = rng.choice(len(pool), m, replace=False)
        drawn += len(idx)
        for i, samples in zip(idx, engine.generate([prompts[i] for i in idx], sc)):
            rewards = [task.reward(pool[i], s.text, args.reward) for s in samples]
            g = Group(pool[i], samples, rewards)
            signal = has_signal(g.rewards, [s.ids for s in samples], args.beta)
            (kept if signal or not args.resample_uniform else set_aside).append(g)
        if len(kept) >= args.prompts:
            break
    groups = (kept + set_aside)[:args.prompts]
    if args.resample_uniform:
        share = len(kept) / drawn
    else:
        share = float(np.mean([has_signal(g.rewards, [s.ids for s in g.samples], args.beta)
                               for g in groups]))
    return Batch(groups, share, drawn * args.k)


# ---- One optimizer step --------------------------------------------------------------------------
def rloo_step(model, ref_model, optimizer, groups: list[Group], args, pad_id: int,
              step: int) -> dict:
    """One RLOO update on a batch of groups (Eqs. 2-3, KL in the reward); returns its metrics.

    args: k, beta, loss_norm, micro_batch, clip, lr, warmup, lr_schedule, steps. Stops
    (common.check_finite) before the optimizer touches the weights if the loss or the gradient
    norm is not finite.
    """
    device = next(model.parameters()).device
    model.train()
    optimizer.zero_grad(set_to_none=True)
    samples = [s for g in groups for s in g.samples]
    n_samples, n_tokens = len(samples), sum(len(s.ids) for s in samples)
    loss_sum, h_all, logprob_gap = 0.0, [], 0.0
    # A group whose advantages are all 0 adds nothing to the gradient: no pass through it (the
    # loss is still divided by the whole batch, so the gradient is the same as with it).
    trained = [g for g in groups if has_signal(g.rewards, [s.ids for s in g.samples], args.beta)]
    # micro-batches of whole groups, sorted by length: each pads to its own longest completion
    by_length = sorted(trained, key=lambda g: max(len(s.ids) for s in g.samples))
    for start in range(0, len(trained), args.micro_batch):
        mb = by_length[start:start + args.micro_batch]
        flat = [s for g in mb for s in g.samples]
        prompts, completions = [s.prompt_ids for s in flat], [s.ids for s in flat]
        r = torch.tensor([g.rewards for g in mb], dtype=torch.float32, device=device)  # [b, k]
        logprobs, mask = common.completion_logprobs(model, prompts, completions, pad_id,
                                                    bf16=args.bf16)  # [b*k, T]
        with torch.no_grad():
            engine_lp = torch.zeros_like(mask)
            for i, s in enumerate(flat):
                engine_lp[i, :len(s.ids)] = torch.tensor(s.logprobs, device=device)
            gap = ((engine_lp - logprobs.detach()).abs() * mask).max().item()
            logprob_gap = max(logprob_gap, gap)
            if args.beta:  # with beta = 0 only evaluate() measures the KL
                ref_lp, _ = common.completion_logprobs(ref_model, prompts, completions, pad_id,
                                                       bf16=args.bf16)
                h = ((logprobs.detach() - ref_lp) * mask).sum(-1).view_as(r)  # [b, k]
                h_all.append(h.view(-1))
                r = regularised_rewards(r, h, args.beta)
        advantages = rloo_advantages(r).view(-1)  # [b*k], Eq. 2
        # weight each micro-batch by its share, so the sum is the loss of the whole batch (Eq. 3)
        share = mask.sum().item() / n_tokens if args.loss_norm == "token" else len(flat) / n_samples
        loss = rloo_loss(logprobs, mask, advantages, args.loss_norm) * share
        loss.backward()
        loss_sum += loss.item()
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip).item()
    common.check_finite(step + 1, "too high --lr, or --beta", loss=loss_sum, grad_norm=grad_norm)
    for group in optimizer.param_groups:
        group["lr"] = learning_rate(step, args)
    optimizer.step()
    model.eval()
    metrics = {"loss": loss_sum, "length": n_tokens / n_samples, "logprob_gap": logprob_gap,
               "grad_norm": grad_norm, "trained_share": len(trained) / len(groups)}
    if h_all:
        metrics["kl"] = torch.cat(h_all).mean().item()
    return metrics


def learning_rate(step: int, args) -> float:
    """The lr of optimizer step `step` (0-based): linear warm-up to --lr over --warmup steps, then
    constant, or (--lr-schedule linear) a straight line that would reach 0 at step --steps, so the
    last step (--steps - 1) gets --lr / (--steps - --warmup). Not part of the estimator (Eq. 3)."""
    warm = min(1.0, (step + 1) / max(args.warmup, 1))
    if args.lr_schedule == "constant":
        return args.lr * warm
    return args.lr * min(warm, (args.steps - step) / max(args.steps - args.warmup, 1))


def batch_metrics(task, batch: Batch, args) -> dict:
    """Reward and grades of the batch's own samples, and how it was drawn."""
    grades = [task.grade(g.problem, s.text) for g in batch.groups for s in g.samples]
    return {"reward": float(np.mean([r for g in batch.groups for r in g.rewards])),
            "accuracy": float(np.mean([g == "correct" for g in grades])),
            "format_rate": float(np.mean([g != "no_answer" for g in grades])),
            "signal_share": float(batch.signal_share), "samples": len(grades),
            "generated": batch.generated}


# ---- Inputs and evaluation -----------------------------------------------------------------------
def load_inputs(args, parser) -> tuple[common.Inputs, common.Run]:
    """Check every input (flags, files, checkpoint) and load it; bad input: one line, exit 2."""
    try:
        if args.k < 2:
            raise common.UsageError(f"--k must be at least 2 for leave-one-out, got {args.k}")
        task = get_task(args.task)
        args.reward = common.check_reward(task, args.reward)
        pool, held_out = common.task_problems(task, args)
        if len(pool) < args.prompts:
            raise common.UsageError(f"--prompts {args.prompts} is more than the {len(pool)} "
                                    "training problems")
        inputs = common.load_inputs("rloo", args, task, pool, held_out,
                                    ("step", "optimizer", "rng"))
        return inputs, common.Run(args.out, vars(args), resume=bool(args.resume))
    except (common.UsageError, ValueError) as e:
        parser.error(str(e))


def evaluate(engine, inputs: common.Inputs, args) -> dict:
    """Held-out accuracy per size, and KL(pi || pi_ref) on 4 samples of 64 training prompts."""
    inputs.model.eval()
    metrics = common.evaluate_sizes(engine, inputs.task, inputs.eval_sets, k=args.eval_k,
                                    max_new_tokens=args.max_new_tokens, reward_variant=args.reward)
    metrics["kl_to_ref"] = common.kl_to_ref(engine, inputs, args.seed,
                                            max_new_tokens=args.max_new_tokens, bf16=args.bf16)
    return metrics


SHOWN = ("signal_share", "kl_to_ref")  # printed beside the held-out accuracies


# ---- The algorithm -------------------------------------------------------------------------------
def main(argv=None):
    started = time.monotonic()
    parser, args = parse_args(argv)
    args = common.resumed_args(args, parser)  # a resumed run keeps the flags it was started with
    common.setup(args.seed, args.threads)
    inputs, run = load_inputs(args, parser)
    model, tokenizer = inputs.model, inputs.tokenizer
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0)
    start = common.restore(inputs.state, optimizer, run)
    engine = common.make_engine(args.engine, model, tokenizer, args.model_path, seed=args.seed)
    engine.sync(model)  # the resumed weights, if any
    print(f"rloo: {common.count_parameters(model) / 1e6:.2f}M parameters from {args.model_path}, "
          f"engine {engine.name}, B={args.prompts} k={args.k} beta={args.beta}, run {run.dir}")
    if start == 0:
        row = evaluate(engine, inputs, args)
        run.log(0, row)
        common.report(0, row, SHOWN)
    bar = tqdm(total=args.steps, initial=start, desc="rloo", dynamic_ncols=True)
    deadline = started + 60 * args.time_limit if args.time_limit else float("inf")
    snapshots = common.Snapshots(args.snapshots, started, run.dir)
    done = start  # optimizer steps taken
    with common.StopOnInterrupt() as stop:
        for step in range(start, args.steps):
            snapshots.take(model, tokenizer, step)
            t0 = time.perf_counter()
            batch = draw_batch(engine, inputs.task, inputs.pool, inputs.prompts, step, args)
            t_gen = time.perf_counter() - t0
            row = rloo_step(model, inputs.ref_model, optimizer, batch.groups, args,
                            tokenizer.pad_token_id, step)  # Eqs. 2-3
            t_sync = time.perf_counter()
            engine.sync(model)  # the next batch is sampled from exactly these weights
            done = step + 1
            row.update(batch_metrics(inputs.task, batch, args), time_generate=t_gen,
                       time_sync=time.perf_counter() - t_sync, time_step=time.perf_counter() - t0)
            last = done == args.steps or time.monotonic() >= deadline
            if done % args.eval_every == 0 or last:
                row.update(evaluate(engine, inputs, args))
                common.report(done, row, SHOWN)
            run.log(done, row)
            bar.update(1)
            bar.set_postfix(reward=f"{row['reward']:.3f}", acc=f"{row['accuracy']:.2f}",
                            gap=f"{row['logprob_gap']:.1e}")
            if done % args.save_every == 0 or last or stop.requested:
                common.save_state(run, model, tokenizer, optimizer, step=done)
            if stop.requested:
                bar.close()
                common.exit_interrupted("rloo.py", run.dir, done)
            if last:
                break
    bar.close()
    return common.finish(run, model, tokenizer, engine, snapshots, done)


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
