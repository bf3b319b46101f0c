"""rloo.py: REINFORCE Leave-One-Out, on-policy: fresh samples every step, weights synced after it.

[CR]   the course report "Off-Policy Finetuning for LLM Math Reasoning", §3.5
[RLOO] Ahmadian et al., "Back to Basics: Revisiting REINFORCE Style Optimization for Learning
       from Human Feedback in LLMs", 2024, arXiv:2402.14740
[CR] Eq. 2 A_i = r_i - 1/(k-1) sum_{j != i} r_j, the leave-one-out baseline  rloo_advantages
[CR] Eq. 3 surrogate -1/k sum_i sg(A_i) log pi(y_i|x)                       rloo_loss
k samples per prompt at T = 1 from the current weights, one update, sync    draw_batch, rloo_step
Names: r_i the reward of y_i ([CR]'s R(x, y_i)), A_i its advantage ([CR]'s R^_i), pi ([CR]'s P);
  T the temperature; [N, L]: N sequences of L tokens; h = log pi(y|x) - log pi_ref(y|x)
--beta > 0 ([RLOO]; not in [CR]): r_i - beta sg(h_i) in place of r_i  common.regularised_rewards
Departures: k = 4 where [CR] §6.1 used 16; groups whose A_i are all 0 get no pass (has_signal)
  but the loss still divides by the whole batch; lr: linear warm-up, then linear decay to 0
  (TRL's; [CR] gives none for RLOO: learning_rate); --resample-uniform: DAPO's dynamic sampling
Run: python rloo.py --task countdown  (CPU, minutes)     More: docs/PAPERS.md, sections [CR], [RLOO]
"""
import argparse
import math
import sys
import time
from typing import NamedTuple

import numpy as np
import torch
from tqdm import tqdm

import common
from tasks import get_task, problem_sets
from tasks.scoring import score


# ---- Settings: RLOO's flags (those every script shares: common.add_common_flags) ----------------
# Each setting's default for the tiny model and for a pretrained one: a flag left at None takes it
# (common.fill_defaults); why: the flag's --help (max_new_tokens: 512 as in [TOPR] §4).
DEFAULTS = {"lr": (6e-5, 3e-6), "max_new_tokens": (64, 512)}  # flag: (tiny, a pretrained model)
# --resample-uniform: a further round draws OVERDRAW x (prompts missing) / (share with signal so
# far), a margin so that one more round mostly suffices; the share taken as >= MIN_SHARE (<= 5x).
OVERDRAW, MIN_SHARE = 1.25, 0.25
# kl_to_ref: 256 sequences, a default batch; prompts drawn from [seed, KL_STREAM] (step 7's too)
KL_PROMPTS, KL_SAMPLES, KL_STREAM = 64, 4, 7
EVAL_SEED = 0  # every evaluation samples with the same random numbers: checkpoints compare fairly


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    add = parser.add_argument
    # the estimator (Eqs. 2-3) and its optimisation
    add("--steps", type=common.positive_int, default=240, help="optimizer steps, 5 min on 2 cores")
    add("--prompts", type=common.positive_int, default=64, help="prompts per batch (B)")
    add("--group-size", type=common.positive_int, default=4, help="completions per prompt, k >= 2")
    add("--beta", type=common.nonnegative_float, default=0.0,
        help="KL penalty, the reward r - beta h ([CR]: 0)")
    add("--kl-diagnostic", action="store_true", help="log kl_to_ref = KL(pi || pi_ref) at each "
        "evaluation; it loads pi_ref, which --beta > 0 loads (and measures) anyway")
    add("--loss-norm", choices=["seq", "seq/len", "token"], default="seq", help="seq: as in Eq. 3")
    add("--reward", default=None, help="reward variant trained on; None: the task's first")
    add("--resample-uniform", action=argparse.BooleanOptionalAction, default=False,
        help="draw more prompts until --prompts groups have signal (dynamic sampling; has_signal)")
    add("--max-draws", type=common.positive_int, default=4,
        help="resampling rounds per step, at most")
    add("--lr", type=common.positive_float, default=None, help="AdamW peak lr (tiny's: the "
        "largest that kept it stable; a pretrained model's: on SmolLM2 3e-6 gained on 3 seeds of "
        "3, 1e-5 on 2 and 3e-5 fell: docs/REAL-MODEL.md)")
    add("--warmup", type=common.nonnegative_int, default=10,
        help="linear lr warm-up steps: Adam's first updates, ~lr*sign(g), come from noisy batches")
    add("--lr-schedule", choices=["linear", "constant"], default="linear",
        help="after the warm-up: linear decay to 0 at --steps (TRL's), or constant")
    add("--micro-batch", type=common.positive_int, default=8,
        help="groups per forward and backward pass (memory)")
    common.add_common_flags(parser, __file__, DEFAULTS, "start and reference model pi_ref")
    return parser, parser.parse_args(argv)


# ---- The estimator: pure functions (the KL-regularised reward: common.regularised_rewards) -------
def rloo_advantages(rewards: torch.Tensor) -> torch.Tensor:
    """Leave-one-out advantages, [CR] Eq. 2: A_i = r_i - 1/(k-1) sum_{j != i} r_j, the mean of the
    OTHER k-1 rewards of the group as baseline.  rewards r: [B, k] -> A: [B, k].
    A sample's own reward is never in its baseline (that would shrink the estimate by (k-1)/k);
    each group's A sums to 0. ValueError for k < 2: a lone sample has no other reward to compare."""
    k = rewards.shape[-1]
    if k < 2:
        raise ValueError("RLOO needs k >= 2 samples per prompt")
    # Eq. 2 computed in its centred form k/(k-1) (r_i - 1/k sum_j r_j), the same quantity
    # (r_i - (S - r_i)/(k-1) = (k r_i - S)/(k-1)); its A sums to 0 more exactly in floats
    return k / (k - 1) * (rewards - rewards.mean(-1, keepdim=True))


def rloo_loss(logprobs: torch.Tensor, mask: torch.Tensor, advantages: torch.Tensor,
              norm: str = "seq") -> torch.Tensor:
    """Policy-gradient surrogate, [CR] Eq. 3: -mean_i sg(A_i) * log pi(y_i|x).
    logprobs: [N, L] log pi(y_t | x, y_<t), 0 on padding; mask: [N, L] 1 on completion tokens (EOS
    included); advantages: [N] A_i. norm: "seq" sum over tokens, mean over sequences (Eq. 3);
    "seq/len" each sum over its length; "token" sum of A_i * log-prob over the number of tokens.
    The reduction is common.weighted_logprob_loss, shared with topr.py's Eq. 7."""
    return common.weighted_logprob_loss(advantages.detach(), logprobs, mask, norm)  # sg(A_i)


def has_signal(rewards, completions, beta: float) -> bool:
    """Whether a group's advantages A_i can be non-zero (rewards: k floats r_i; completions: k
    token-id lists). They are all 0 when the rewards are: equal r_i and, with beta > 0, identical
    completions (different ones keep the KL term -beta (h_i - mean h)). Such a group adds nothing
    to the gradient: rloo_step gives it no pass, --resample-uniform sets it aside."""
    return max(rewards) > min(rewards) or (beta != 0 and len({tuple(c) for c in completions}) > 1)


# ---- Sampling ------------------------------------------------------------------------------------
class Group(NamedTuple):
    """k completions of one prompt and their rewards r_i."""
    problem: dict
    samples: list          # [k] the engine's samples (.ids, .text, .logprobs, .prompt_ids)
    rewards: list[float]   # [k]


class Batch(NamedTuple):
    groups: list[Group]    # --prompts groups
    signal_share: float    # share of the groups drawn that have signal (has_signal)
    generated: int         # completions generated for this batch (all rounds)


def draw_batch(engine, task, pool, prompts, step, args) -> Batch:
    """k completions of each of --prompts prompts, drawn afresh with the seed [seed, step]. With
    --resample-uniform, groups without signal are set aside and more prompts drawn (OVERDRAW), up
    to --max-draws rounds; if there are still too few, those set aside fill the batch."""
    rng = np.random.default_rng([args.seed, step])
    on_policy = common.SamplingConfig(n=args.group_size, max_new_tokens=args.max_new_tokens,
                                      temperature=1.0)  # no top-p/top-k: samples of pi itself
    kept, set_aside, drawn, with_signal = [], [], 0, 0
    for _ in range(args.max_draws if args.resample_uniform else 1):
        share = len(kept) / drawn if drawn else 1.0  # of the groups drawn so far, those with signal
        n_new = args.prompts if drawn == 0 else min(args.prompts, math.ceil(
            OVERDRAW * (args.prompts - len(kept)) / max(share, MIN_SHARE)))
        chosen = rng.choice(len(pool), n_new, replace=False)
        drawn += len(chosen)
        for i, samples in zip(chosen, engine.generate([prompts[i] for i in chosen], on_policy)):
            rewards = [task.reward(pool[i], s.text, args.reward) for s in samples]
            signal = has_signal(rewards, [s.ids for s in samples], args.beta)
            with_signal += signal
            (kept if signal or not args.resample_uniform else set_aside).append(
                Group(pool[i], samples, rewards))
        if len(kept) >= args.prompts:
            break
    return Batch((kept + set_aside)[:args.prompts], with_signal / drawn, drawn * args.group_size)


# ---- One optimizer step --------------------------------------------------------------------------
def rloo_step(model, ref_model, optimizer, groups: list[Group], args, pad_id: int,
              step: int) -> dict:
    """One RLOO update ([CR] Eqs. 2-3; with --beta, the KL in the reward) after `step` updates;
    its metrics."""
    model.train()
    optimizer.zero_grad(set_to_none=True)
    samples = [s for g in groups for s in g.samples]
    n_samples, n_tokens = len(samples), sum(len(s.ids) for s in samples)
    loss_sum, h_seen, logprob_gap = 0.0, [], 0.0
    trained = [g for g in groups if has_signal(g.rewards, [s.ids for s in g.samples], args.beta)]
    by_length = sorted(trained, key=lambda g: max(len(s.ids) for s in g.samples))  # pads less
    for start in range(0, len(trained), args.micro_batch):  # micro-batches of whole groups
        micro = by_length[start:start + args.micro_batch]
        flat = [s for g in micro for s in g.samples]
        inputs = [s.prompt_ids for s in flat], [s.ids for s in flat], pad_id
        logprobs, mask = common.completion_logprobs(model, *inputs, bf16=args.bf16)  # [b*k, L]
        r = torch.tensor([g.rewards for g in micro], dtype=torch.float32, device=mask.device)
        logprob_gap = max(logprob_gap, sampler_gap(flat, logprobs, mask))
        rewards = r  # beta = 0 ([CR]): no pass through pi_ref here, evaluate() alone measures KL
        if args.beta:  # [RLOO]: r_i - beta sg(h_i) in place of r_i
            h = log_ratio_to_ref(ref_model, logprobs, mask, inputs, args.bf16).view_as(r)  # [b, k]
            h_seen.append(h.view(-1))
            rewards = common.regularised_rewards(r, h, args.beta)
        advantages = rloo_advantages(rewards).view(-1)  # [b*k], Eq. 2
        # Eq. 3 over the whole batch: each micro-batch's loss weighted by its share of the batch
        share = mask.sum().item() / n_tokens if args.loss_norm == "token" else len(flat) / n_samples
        loss = rloo_loss(logprobs, mask, advantages, args.loss_norm) * share
        loss.backward()
        loss_sum += loss.item()
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip).item()
    if not (math.isfinite(loss_sum) and math.isfinite(grad_norm)):  # before the weights change
        tqdm.write(f"error: step {step + 1}: non-finite loss={loss_sum} or grad_norm={grad_norm}; "
                   "weights not updated, the last checkpoint is the last good state. Likely cause: "
                   "too high --lr, or --beta", file=sys.stderr)
        raise SystemExit(1)
    for param_group in optimizer.param_groups:  # this step's lr (learning_rate)
        param_group["lr"] = learning_rate(step, args)
    optimizer.step()
    model.eval()
    metrics = {"loss": loss_sum, "length": n_tokens / n_samples, "logprob_gap": logprob_gap,
               "grad_norm": grad_norm, "trained_share": len(trained) / len(groups)}
    if h_seen:
        metrics["kl"] = torch.cat(h_seen).mean().item()
    return metrics


def log_ratio_to_ref(ref_model, logprobs, mask, inputs, bf16: bool) -> torch.Tensor:
    """h = log pi(y|x) - log pi_ref(y|x) per sequence [N]; logprobs, mask: pi's [N, L] on inputs."""
    with torch.no_grad():
        ref_lp, _ = common.completion_logprobs(ref_model, *inputs, bf16=bf16)
    return ((logprobs.detach() - ref_lp) * mask).sum(-1)


def sampler_gap(samples, logprobs: torch.Tensor, mask: torch.Tensor) -> float:
    """max |the engine's log-prob - the trainer's| over the tokens of `samples` ([N, L] like
    logprobs): about 0 when the engine samples from exactly the weights trained (on-policy)."""
    engine_lp = torch.zeros_like(mask)
    for i, s in enumerate(samples):
        engine_lp[i, :len(s.ids)] = torch.tensor(s.logprobs, device=mask.device)
    return ((engine_lp - logprobs.detach()).abs() * mask).max().item()


def learning_rate(step: int, args) -> float:
    """The lr of optimizer step `step` (0-based): linear warm-up to --lr over --warmup steps, then
    constant or (--lr-schedule linear) a line to 0 at step --steps, not reached (the last: > 0)."""
    warm = min(1.0, (step + 1) / max(args.warmup, 1))
    if args.lr_schedule == "constant":
        return args.lr * warm
    return args.lr * min(warm, (args.steps - step) / max(args.steps - args.warmup, 1))


def batch_metrics(task, batch: Batch) -> dict:
    """Reward and grades of the batch's own samples, and how it was drawn."""
    grades = [task.grade(g.problem, s.text) for g in batch.groups for s in g.samples]
    return {"reward": float(np.mean([r for g in batch.groups for r in g.rewards])),
            "accuracy": float(np.mean([g == "correct" for g in grades])),
            "format_rate": float(np.mean([g != "no_answer" for g in grades])),
            "signal_share": float(batch.signal_share), "samples": len(grades),
            "generated": batch.generated}


# ---- Evaluation ----------------------------------------------------------------------------------
def evaluate(engine, model, ref_model, task, eval_sets, train_prompts, args) -> dict:
    """Held-out metrics per size (eval3/greedy/accuracy, ...; tasks/scoring.py): one greedy
    completion and --eval-k at T = 1 per problem; then, where pi_ref is loaded, kl_to_ref,
    KL(pi || pi_ref) per sequence by Monte Carlo: the mean h over KL_SAMPLES samples (T = 1) of
    KL_PROMPTS training prompts."""
    model.eval()
    metrics = {}
    greedy = common.SamplingConfig(n=1, max_new_tokens=args.max_new_tokens, temperature=0.0)
    t_1 = common.SamplingConfig(n=args.eval_k, max_new_tokens=args.max_new_tokens, seed=EVAL_SEED)
    for size, (problems, prompts) in eval_sets.items():
        for mode, sampling in [("greedy", greedy), ("sampled", t_1)]:
            groups = engine.generate(prompts, sampling)
            metrics.update(score(task, problems, groups, mode, args.reward, prefix=f"eval{size}/"))
    if ref_model is None:  # beta = 0 without --kl-diagnostic
        return metrics
    chosen = np.random.default_rng([args.seed, KL_STREAM]).choice(
        len(train_prompts), min(KL_PROMPTS, len(train_prompts)), replace=False)
    groups = engine.generate([train_prompts[i] for i in chosen], common.SamplingConfig(
        n=KL_SAMPLES, max_new_tokens=args.max_new_tokens, seed=EVAL_SEED))
    flat = [s for g in groups for s in g]
    inputs = [s.prompt_ids for s in flat], [s.ids for s in flat], engine.tokenizer.pad_token_id
    with torch.no_grad():
        logprobs, mask = common.completion_logprobs(model, *inputs, bf16=args.bf16)
    h = log_ratio_to_ref(ref_model, logprobs, mask, inputs, args.bf16)  # [KL_PROMPTS * KL_SAMPLES]
    metrics["kl_to_ref"] = h.mean().item()
    return metrics


# ---- main(): every input checked, then the loop (saving and resuming: common.Run) -----------
def main(argv=None):
    parser, args = parse_args(argv)
    # --resume, the run folder and its checkpoint (common.Run)
    run = common.Run(parser, args, __file__, keys={"model", "optimizer"})
    common.setup(args.seed, args.threads)
    try:  # every input is checked before anything long starts: bad input is one line and exit 2
        if args.group_size < 2:
            raise ValueError(f"--group-size must be at least 2 for leave-one-out, got "
                             f"{args.group_size}")
        task = get_task(args.task)
        args.reward = args.reward or task.REWARD_VARIANTS[0]
        if args.reward not in task.REWARD_VARIANTS:
            raise ValueError(f"unknown --reward {args.reward!r}; choose from "
                             f"{', '.join(task.REWARD_VARIANTS)}")
        pool, held_out = problem_sets(task, sizes=args.sizes, train_size=args.train_size,
                                      eval_sizes=args.eval_sizes, eval_size=args.eval_size,
                                      seed=args.seed, source=args.problems)
        if len(pool) < args.prompts:
            raise ValueError(f"--prompts {args.prompts} exceeds the {len(pool)} training problems")
        device = "cuda" if torch.cuda.is_available() else "cpu"
        # --model None or `sft`: the newest sft.py run of --task, trained first if there is none
        model, tokenizer = common.load_model(args.model, device=device, task=args.task,
                                             run_dir=args.out, grad_checkpoint=args.grad_checkpoint)
        args.model_path = model.name_or_path  # the folder or hub id: resume restarts from it
        common.fill_defaults(args, DEFAULTS, model)  # flags left at None
        ref_model = None  # pi_ref: for the KL term in the reward, or the KL diagnostic alone
        if args.beta > 0 or args.kl_diagnostic:
            ref_model = common.load_model(args.model_path, device=device)[0].requires_grad_(False)
    except ValueError as e:  # UsageError is one
        parser.error(str(e))
    style = common.prompt_style(model, tokenizer)
    prompts = common.encode_prompts(task, pool, tokenizer, style)
    eval_sets = {size: (problems, common.encode_prompts(task, problems, tokenizer, style))
                 for size, problems in held_out.items()}
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0)
    start = run.begin(model=model, optimizer=optimizer)  # 0, or the checkpoint's step
    engine = common.make_engine(args.engine, model, tokenizer, args.model_path, seed=args.seed,
                                bf16=args.bf16, max_new_tokens=args.max_new_tokens)
    engine.sync(model)  # copies the weights (resumed, if any) into the generation engine
    print(f"rloo: {common.count_parameters(model) / 1e6:.2f}M parameters from {args.model_path}, "
          f"engine {engine.name}, B={args.prompts} k={args.group_size} beta={args.beta}, "
          f"run {args.out}")
    if start == 0:
        run.log(0, evaluate(engine, model, ref_model, task, eval_sets, prompts, args))
    for step in tqdm(range(start, args.steps), "rloo", total=args.steps, initial=start,
                     leave=False):
        t0 = time.perf_counter()
        batch = draw_batch(engine, task, pool, prompts, step, args)
        t_gen = time.perf_counter() - t0
        metrics = rloo_step(model, ref_model, optimizer, batch.groups, args,
                            pad_id=tokenizer.pad_token_id, step=step)
        t_sync = time.perf_counter()
        engine.sync(model)  # copies the new weights into the engine: the next batch samples pi
        metrics.update(batch_metrics(task, batch), time_generate=t_gen,
                       time_sync=time.perf_counter() - t_sync, time_step=time.perf_counter() - t0)
        # the metrics row; an evaluation and a checkpoint where due; the end, or --time-limit
        if run.end_step(step + 1, metrics, last=step + 1 == args.steps, evaluate=lambda: evaluate(
                engine, model, ref_model, task, eval_sets, prompts, args)):
            break
    engine.close()
    return run.finish(model, tokenizer)


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
