"""spo.py: Soft Policy Optimization: the policy is its own soft Q-function; online + offline data.

[SPO] Cohen, Zhang, Zheng, Tang, Munos, Synnaeve, "Soft Policy Optimization: Online Off-Policy RL
      for Sequence Models", 2025, arXiv:2503.05453. Names: beta, r, q0 = Q0_hat, q = Q_t, q_T = Q_T
      as in [SPO]; T the last token, so [N, T]: N sequences of T tokens; temperatures spelled out
Eq. 1: max E_pi r - beta KL(pi || pi_0), r = 0 if correct, else -1; pi_0 = ref_model   spo_reward
Eqs. 11-12: A_t = beta (log pi_theta - log pi_0)(a_t), Q_t = Q0_hat + sum_{t'<=t} A_t'  cumulative_q
Eq. 13, §3.1.2: Q_T ~ r by terminal, nonterminal or advantage regression (--objective)  spo_loss
§3.1.1: L = squared or clipped cross-entropy (--loss); sigmoid warping   ce_loss, binary_kl_*
§3.1.3: Q0_hat = beta log(S0 + (1 - S0) e^{-1/beta}), S0 = pi_0's success rate   q0_from_successes
§3.2: the sampler refreshed every --model-update-interval steps; online + offline data  draw_batch
Departures (flags): temperature 1, top-p 1, a refresh every step, 64 Q0 samples, lr for 1M params
  --loss sq by default (the best in the paper's ablation, §5.1); its main runs use --loss ce
  ce_loss minus the target's entropy (0 at the target); advantage: sigmoid-warped for any --loss;
  one loop; offline rows cut to --max-new-tokens, re-scored; r binary; no PTS, no PPO.
  Run: python spo.py --task countdown      More: docs/PAPERS.md, section [SPO]."""
import argparse
import copy
import math
import os
import sys
import time
from typing import NamedTuple

import numpy as np
import torch
import torch.nn.functional as F
from tqdm import tqdm

import common
from tasks import get_task, problem_sets
from tasks.files import read_jsonl, write_jsonl
from tasks.scoring import score

# ---- Settings ------------------------------------------------------------------------------------
SUCCESS, FAILURE = 0.0, -1.0  # r: binary, as the Q0_hat formula of §3.1.3 assumes
BETA = 1 / math.log(1e5)  # the paper's beta: a failure (r = -1) is worth a likelihood ratio of 1e-5
CE_EPS = 1e-3  # ce_loss clips Q/beta to <= -eps: "close to 0" (§3.1.1), so log(1 - e^y) is finite
OBJECTIVES, LOSSES = ("terminal", "nonterminal", "advantage"), ("sq", "ce")  # §3.1.2, §3.1.1
SEED_STRIDE = 1_000_003  # Q0 chunk j samples with seed * SEED_STRIDE + j: a prime keeps runs apart
EVAL_SEED = 0  # held-out samples: every checkpoint meets the same draws
# Each setting's default for the tiny model and for a pretrained one: a flag left at None takes it
# (common.fill_defaults); why: the flag's --help (max_new_tokens: 512 as in [TOPR] §4).
DEFAULTS = {"lr": (6e-5, 1e-5), "max_new_tokens": (64, 512)}  # flag: (tiny, a pretrained model)


def temperature_range(text: str) -> tuple[float, float]:
    """argparse type: "lo,hi" with 0 < lo <= hi, both finite."""
    try:
        lo, hi = (float(part) for part in text.split(","))
    except ValueError:  # not two numbers
        lo = hi = math.nan
    if not 0 < lo <= hi < math.inf:
        raise argparse.ArgumentTypeError(f"expected lo,hi with 0 < lo <= hi (finite), got {text!r}")
    return lo, hi


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    add = parser.add_argument  # SPO's flags; those every script shares: common.add_common_flags
    add("--beta", type=common.positive_float, default=BETA, help="KL strength (paper: 1/ln 1e5)")
    add("--objective", choices=OBJECTIVES, default="terminal", help="regressed onto r (§3.1.2)")
    add("--loss", choices=LOSSES, default="sq",
        help="sq (best in the paper's ablation) or ce (its main runs); unused by advantage")
    add("--eps", type=common.positive_float, default=CE_EPS, help="ce clips Q/beta to <= -eps")
    add("--q0-samples", type=common.positive_int, default=64,
        help="samples of pi_0 (temperature 1) per training problem for Q0_hat (paper: 800; CPU "
        "time)")
    add("--q0-chunk", type=common.positive_int, default=32, help="problems per Q0 cache update")
    add("--q0-cache", default=None, metavar="FILE", help="another run's q0.jsonl to reuse")
    add("--batch-size", type=common.positive_int, default=256, help="trajectories per step")
    add("--group-size", type=common.positive_int, default=8, help="online samples per prompt")
    add("--online-fraction", type=common.fraction, default=1.0, help="online share (paper: 0.5)")
    add("--offline-data", default=None, metavar="FILE", help="offline trajectories (read_offline)")
    add("--temperature", type=temperature_range, default=(1.0, 1.0), metavar="LO,HI",
        help="online sampling temperature ~ U(lo, hi), one draw per step (paper: 0.1,0.8)")
    add("--top-p", type=common.positive_float, default=1.0, help="nucleus sampling (paper: 0.95)")
    add("--model-update-interval", type=common.positive_int, default=1,
        help="refresh the sampler's weights every N steps (paper: 10; 1 = on-policy)")
    add("--steps", type=common.positive_int, default=125, help="optimizer steps: ~5 min on 2 cores")
    add("--lr", type=common.positive_float, default=None, help="AdamW lr, constant after warm-up "
        "(tiny: a larger one collapsed it; a pretrained model: rloo.py's, measured on SmolLM2 in "
        "docs/REAL-MODEL.md; [SPO]: 6e-8 for 8B)")
    add("--warmup", type=common.nonnegative_int, default=10, help="warm-up steps (paper: 200)")
    add("--micro-batch", type=common.positive_int, default=64,
        help="sequences per forward and backward pass (memory)")
    common.add_common_flags(parser, __file__, DEFAULTS, "start model pi_0", eval_every=75,
                            train_size=dict(default=256, help="training problems per size; fewer "
                                            "than the other scripts' as Q0_hat is estimated for "
                                            "each before training (§3.1.3)"))
    return parser, parser.parse_args(argv)


# ---- The Q-parameterization and the losses: pure functions of tensors ----------------------------
def q0_from_successes(successes: torch.Tensor, samples: torch.Tensor, beta: float) -> torch.Tensor:
    """Q0_hat = beta log(S0 + (1 - S0) e^{-1/beta}), S0 = successes / samples, both [P] (§3.1.3):
    the soft value beta log E_{pi_0} e^{r/beta} of each prompt, in [-1, 0]; [P] float64."""
    s0 = successes.double() / samples.double()
    return beta * torch.log(s0 + (1 - s0) * math.exp(FAILURE / beta))


def cumulative_q(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, mask: torch.Tensor,
                 q0: torch.Tensor, beta: float):
    """The cumulative Q-parameterization (Eqs. 11-12): q [N, T] (Q_t after token t, Q_T on pads)
    and q_T [N] in fp32, never divided by the length. logprobs, ref_logprobs, mask: [N, T] log
    pi_theta (with gradient), log pi_0 (0 on pads), 1 on completion tokens (EOS too); q0 [N]."""
    a = beta * (logprobs.float() - ref_logprobs.float().detach()) * mask  # [N, T] A_t (Eq. 11)
    q = q0.float()[:, None] + torch.cumsum(a, dim=-1)                    # [N, T] Q_t (Eq. 12)
    return q, q[:, -1]  # padding adds 0: the last column is Q_T (an empty completion gives Q0_hat)


def log1mexp(u: torch.Tensor) -> torch.Tensor:
    """log(1 - e^u) for u < 0, elementwise, stable at both ends (Maechler 2012)."""
    return torch.where(u > -math.log(2), torch.log(-torch.expm1(u)), torch.log1p(-torch.exp(u)))


def ce_loss(y_hat: torch.Tensor, y: torch.Tensor, eps: float = CE_EPS) -> torch.Tensor:
    """Binary cross-entropy between log-probabilities (in SPO, Q/beta), clipped as in §3.1.1, minus
    the target's entropy H(x), elementwise; x = e^y, y clipped to <= 0, y_hat_c = min(y_hat, -eps):
        L(y_hat, y) = x relu(-y_hat) - (1 - x) log(1 - e^{y_hat_c}) - H(x)
    y_hat_c has y_hat's gradient (straight-through); relu: nothing pushes y_hat above 0; -H(x): no
    gradient, and L is the binary KL, 0 at y_hat = y (docs/DERIVATIONS.md)."""
    y_c = y.clamp(max=0.0)
    x = torch.exp(y_c)
    # this form keeps the value exactly -eps where y_hat + (clamp - y_hat) would not (y_hat = 1e6)
    y_hat_c = y_hat.clamp(max=-eps).detach() + (y_hat - y_hat.detach())
    entropy = -(x * y_c + torch.special.xlogy(1 - x, -torch.expm1(y_c)))
    return x * F.relu(-y_hat) - (1 - x) * log1mexp(y_hat_c) - entropy


def binary_kl_with_logits(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """BCEWithLogits(logits, target) - H(target), elementwise: 0 at sigmoid(logits) = target."""
    entropy = -(torch.special.xlogy(target, target) + torch.special.xlogy(1 - target, 1 - target))
    return F.binary_cross_entropy_with_logits(logits, target, reduction="none") - entropy


def spo_loss(q: torch.Tensor, q_T: torch.Tensor, mask: torch.Tensor, q0: torch.Tensor,
             r: torch.Tensor, beta: float, objective: str = "terminal", loss_type: str = "sq",
             eps: float = CE_EPS) -> torch.Tensor:
    """SPO's objectives (§3.1.2; terminal: Eq. 13, Q_T ~ r), mean over trajectories, unnormalised.
    q [N, T], q_T [N] from cumulative_q; mask [N, T]; q0 [N] Q0_hat; r [N] rewards in {0, -1}.
    terminal:    L(Q_T, r)
    nonterminal: sum_t L(Q_t, R_t), reverse-Q targets R_t = sg(r - sum_{t'>t} A_t' = r - Q_T + Q_t)
    advantage:   sum_t A_t = Q_T - Q0 ~ r - Q0 sigmoid-warped, on Q's scale, whatever `loss_type`:
                 binary KL(sigmoid(r - Q0) || sigmoid(Q_T - Q0))"""
    if objective not in OBJECTIVES or loss_type not in LOSSES:
        raise ValueError(f"unknown SPO objective {objective!r} or loss {loss_type!r}")
    q0, r = q0.to(q_T), r.to(q_T)

    def L(y_hat, y):  # §3.1.1, elementwise: squared, or ce on log-probabilities Q/beta, r/beta
        return (y_hat - y) ** 2 if loss_type == "sq" else ce_loss(y_hat / beta, y / beta, eps)

    if objective == "terminal":
        per_trajectory = L(q_T, r)                                               # [N]
    elif objective == "nonterminal":
        targets = (r[:, None] - (q_T[:, None] - q)).detach()                     # [N, T] R_t
        per_trajectory = (L(q, targets) * mask).sum(-1)                          # [N]
    else:  # advantage
        per_trajectory = binary_kl_with_logits(q_T - q0, torch.sigmoid(r - q0))  # [N]
    return per_trajectory.mean()


# ---- Data: training problems, Q0_hat, offline trajectories, batches ------------------------------
class Trajectory(NamedTuple):
    prompt: list[int]  # prompt token ids
    ids: list[int]     # completion token ids, EOS included when it ended
    reward: float      # r: SUCCESS or FAILURE
    pool_index: int    # the problem's index in the training pool (its Q0_hat)
    online: bool       # sampled this step (False: a row of --offline-data)


def spo_reward(task, problem: dict, text: str) -> float:
    """r = 0 for a fully correct answer, -1 otherwise: the binary reward of Q0_hat (§3.1.3)."""
    return SUCCESS if task.is_correct(problem, text) else FAILURE


def check_args(args, parser) -> tuple:
    """(task, pool + offline rows' problems, held-out sets, offline rows); bad input: exit 2."""
    try:
        task = get_task(args.task)
        if args.top_p > 1:
            raise ValueError(f"--top-p must lie in (0, 1], got {args.top_p}")
        if args.online_fraction < 1.0 and args.offline_data is None:
            raise ValueError("--online-fraction below 1 needs --offline-data FILE")
        offline_rows = [] if args.offline_data is None else read_offline(args.offline_data, task)
        if args.q0_cache is not None and not os.path.isfile(args.q0_cache):  # read in main()
            raise ValueError(f"no such Q0 cache: {args.q0_cache}")
        pool, held_out = problem_sets(task, sizes=args.sizes, train_size=args.train_size,
                                      eval_sizes=args.eval_sizes, eval_size=args.eval_size,
                                      seed=args.seed, source=args.problems)
        pool_keys = {task.problem_key(problem) for problem in pool}
        for row in offline_rows:  # offline problems join the pool (each needs its Q0_hat)
            if task.problem_key(row["problem"]) not in pool_keys:
                pool_keys.add(task.problem_key(row["problem"]))
                pool.append(row["problem"])
        return task, pool, held_out, offline_rows
    except ValueError as e:  # UsageError is one
        parser.error(str(e))


def q0_made_with(args, ref_path: str) -> dict:
    """What a Q0 estimate depends on: a cache row made otherwise is never reused."""
    model = os.path.realpath(ref_path) if os.path.exists(ref_path) else ref_path
    return {"model": model, "task": args.task, "max_new_tokens": args.max_new_tokens,
            "samples": args.q0_samples}


def read_q0_cache(path: str, made_with: dict) -> dict:
    """{problem key: row} of a q0.jsonl file; ValueError naming the line of a bad or foreign row."""
    table = {}
    for n, row in enumerate(read_jsonl(path, "Q0 cache"), 1):
        successes = row.get("successes")
        if not isinstance(row.get("key"), str) or not isinstance(successes, int) or \
                not 0 <= successes <= made_with["samples"]:
            raise ValueError(f"{path}:{n}: expected a Q0 row with 'key' and 'successes' in "
                             f"[0, {made_with['samples']}]")
        other = {k: row.get(k) for k in made_with if row.get(k) != made_with[k]}
        if other:
            raise ValueError(f"{path}:{n}: made with {other}, this run has "
                             f"{ {k: made_with[k] for k in other} }: not reused")
        table[row["key"]] = row
    return table


def q0_hat(engine, task, pool, prompts, ref_model, args) -> torch.Tensor:
    """Q0_hat [P] of the pool (§3.1.3) from --q0-samples of pi_0 at temperature 1, kept in
    RUN/q0.jsonl."""
    cache_file = os.path.join(args.out, "q0.jsonl")
    made_with = q0_made_with(args, args.model_path)
    table = read_q0_cache(args.q0_cache, made_with) if args.q0_cache is not None else {}
    if os.path.exists(cache_file):  # this run's own, from before it was stopped
        table.update(read_q0_cache(cache_file, made_with))
    engine.sync(ref_model)  # pi_0's weights copied into the engine: sample pi_0 itself
    keys = [task.problem_key(problem) for problem in pool]
    chunks = range(0, len(pool), args.q0_chunk)
    for chunk, first in enumerate(tqdm(chunks, desc="Q0 estimate", dynamic_ncols=True)):
        todo = [i for i in range(first, min(first + args.q0_chunk, len(pool)))
                if keys[i] not in table]
        if todo:
            sampling = common.SamplingConfig(n=args.q0_samples, max_new_tokens=args.max_new_tokens,
                                             temperature=1.0, seed=args.seed * SEED_STRIDE + chunk)
            for i, group in zip(todo, engine.generate([prompts[i] for i in todo], sampling)):
                successes = sum(task.is_correct(pool[i], s.text) for s in group)
                table[keys[i]] = {"key": keys[i], "successes": successes, **made_with}
            write_jsonl(cache_file, list(table.values()))  # atomically: a kill keeps the old
    write_jsonl(cache_file, list(table.values()))  # whole, also when --q0-cache held every one
    counts = torch.tensor([table[key]["successes"] for key in keys])
    return q0_from_successes(counts, torch.full_like(counts, args.q0_samples), args.beta).float()


def read_offline(path: str, task) -> list[dict]:
    """Offline rows: problem fields, "completion", "finished" (default true); rewards never read."""
    rows = []
    for n, row in enumerate(read_jsonl(path, "offline data file"), 1):
        try:
            problem = task.problem_from_row(row)
        except ValueError as e:
            raise ValueError(f"{path}:{n}: {e}") from None
        finished = row.get("finished", True)
        if not isinstance(row.get("completion"), str) or not isinstance(finished, bool):
            raise ValueError(f"{path}:{n}: expected 'completion' (a string) and optionally "
                             "'finished' (true or false)")
        rows.append({"problem": problem, "completion": row["completion"], "finished": finished})
    if not rows:
        raise ValueError(f"offline data file {path} holds no trajectories")
    return rows


def fit_offline(rows: list[dict], task, pool, prompts, tokenizer, max_new_tokens: int):
    """Offline rows as the sampler would have made them with --max-new-tokens M: the first M tokens,
    EOS appended if the row finished within M, r scored on the kept text; a row that stopped
    unfinished before M is dropped. Returns (the kept rows as Trajectories, rows cut, dropped)."""
    index = {task.problem_key(problem): i for i, problem in enumerate(pool)}
    kept, cut, dropped = [], 0, 0
    for row in rows:
        ids = tokenizer(row["completion"], add_special_tokens=False)["input_ids"]
        if not row["finished"] and len(ids) < max_new_tokens:
            dropped += 1
            continue
        fits = row["finished"] and len(ids) < max_new_tokens  # the EOS too
        cut += not fits and len(ids) + row["finished"] > max_new_tokens
        ids = ids[:max_new_tokens]
        i = index[task.problem_key(row["problem"])]
        r = spo_reward(task, pool[i], tokenizer.decode(ids, skip_special_tokens=True))
        kept.append(Trajectory(prompts[i], ids + [tokenizer.eos_token_id] * fits, r, pool_index=i,
                               online=False))
    return kept, cut, dropped


def draw_batch(engine, task, pool, prompts, offline: list[Trajectory], step: int, args):
    """This step's trajectories and temperature ~ U(lo, hi), seeded by (seed, step): the sampler's
    for round(online_fraction * batch_size / group_size) prompts, then random offline rows."""
    rng = np.random.default_rng([args.seed, step])
    n_prompts = min(len(pool), round(args.online_fraction * args.batch_size / args.group_size))
    temperature = float(rng.uniform(*args.temperature))
    batch = []
    if n_prompts:
        chosen = rng.choice(len(pool), n_prompts, replace=False)
        sampling = common.SamplingConfig(n=args.group_size, max_new_tokens=args.max_new_tokens,
                                         temperature=temperature, top_p=args.top_p)
        for i, group in zip(chosen, engine.generate([prompts[i] for i in chosen], sampling)):
            batch += [Trajectory(prompts[i], s.ids, spo_reward(task, pool[i], s.text),
                                 pool_index=int(i), online=True) for s in group]
    if offline:  # the rest: offline rows, drawn with replacement
        picks = rng.choice(len(offline), max(0, args.batch_size - len(batch)))
        batch += [offline[j] for j in picks]
    return batch, temperature


# ---- One optimizer step, and evaluation ----------------------------------------------------------
def spo_step(model, ref_model, optimizer, schedule, batch: list[Trajectory], q0_pool: torch.Tensor,
             args, step: int, pad_id: int) -> dict:
    """One optimizer step on the SPO loss (Eqs. 11-13, §3.1.2); q0_pool: [P]; step: steps taken."""
    device = next(model.parameters()).device
    model.train()
    optimizer.zero_grad(set_to_none=True)
    loss_sum, q_T_parts, log_ratio_parts = 0.0, [], []
    for first in range(0, len(batch), args.micro_batch):
        micro = batch[first:first + args.micro_batch]
        prompts, completions = [t.prompt for t in micro], [t.ids for t in micro]
        logprobs, mask = common.completion_logprobs(model, prompts, completions, pad_id,
                                                    bf16=args.bf16)         # [n, T] log pi_theta
        with torch.no_grad():
            ref_logprobs, _ = common.completion_logprobs(ref_model, prompts, completions, pad_id,
                                                         bf16=args.bf16)    # [n, T] log pi_0
        q0 = q0_pool[[t.pool_index for t in micro]].to(device)               # [n] Q0_hat
        r = torch.tensor([t.reward for t in micro], device=device)           # [n]
        q, q_T = cumulative_q(logprobs, ref_logprobs, mask, q0, args.beta)  # Eqs. 11-12
        loss = spo_loss(q, q_T, mask, q0, r, args.beta, objective=args.objective,
                        loss_type=args.loss, eps=args.eps)                  # Eq. 13, §3.1.2
        loss = loss * len(micro) / len(batch)  # the mean over the whole batch
        loss.backward()
        loss_sum += loss.item()
        q_T_parts.append(q_T.detach())
        log_ratio_parts.append(((logprobs.detach() - ref_logprobs) * mask).sum(-1))
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip).item()
    if not (math.isfinite(loss_sum) and math.isfinite(grad_norm)):  # stop before the update
        tqdm.write(f"error: step {step + 1}: non-finite loss={loss_sum} or grad_norm={grad_norm}; "
                   "weights not updated, the last checkpoint is the last good state. Likely cause: "
                   "--lr too large, or --beta too small for Q/beta", file=sys.stderr)
        raise SystemExit(1)
    optimizer.step()
    schedule.step()
    model.eval()
    return step_metrics(batch, torch.cat(q_T_parts), torch.cat(log_ratio_parts), loss_sum,
                        grad_norm, lr=schedule.get_last_lr()[0])


def step_metrics(batch: list[Trajectory], q_T, log_ratio, loss_sum, grad_norm, lr) -> dict:
    """The step's diagnostics. q_T, log_ratio: [N] Q_T and log pi(y|x) - log pi_0(y|x)."""
    r = torch.tensor([t.reward for t in batch], device=q_T.device)
    online = [t.reward == SUCCESS for t in batch if t.online]
    return {"loss": loss_sum, "accuracy": float((r == SUCCESS).float().mean()),
            "online_accuracy": float(np.mean(online)) if online else None,
            "q_t": q_T.mean().item(), "q_t_error": (q_T - r).abs().mean().item(),
            # not KL(pi || pi_0), which needs y ~ pi at temperature 1: tempered, lagging,
            # offline y alike are not
            "log_ratio_ref": log_ratio.mean().item(),
            "length": float(np.mean([len(t.ids) for t in batch])),
            "online_share": float(np.mean([t.online for t in batch])), "grad_norm": grad_norm,
            "lr": lr, "samples": len(batch)}


def evaluate(engine, model, sampler, task, eval_sets, args) -> dict:
    """Held-out metrics of the policy per size (tasks/scoring.py): greedy, and --eval-k at
    temperature 1."""
    engine.sync(model)  # the policy's weights copied into the engine (vLLM; hf/kv share them)
    metrics = {}
    greedy = common.SamplingConfig(n=1, max_new_tokens=args.max_new_tokens, temperature=0.0)
    sampled = common.SamplingConfig(n=args.eval_k, max_new_tokens=args.max_new_tokens,
                                    seed=EVAL_SEED)
    for n, (problems, prompts) in eval_sets.items():
        for mode, sampling in [("greedy", greedy), ("sampled", sampled)]:
            groups = engine.generate(prompts, sampling)
            metrics.update(score(task, problems, groups, mode=mode, prefix=f"eval{n}/"))
    engine.sync(sampler)  # the sampler's weights back into the engine
    return metrics


# ---- main(): every input checked, then the loop (saving and resuming: common.Run) -----------
def main(argv=None):
    parser, args = parse_args(argv)
    run = common.Run(parser, args, __file__, keys={"model", "optimizer", "schedule", "sampler"})
    common.setup(args.seed, args.threads)
    task, pool, held_out, offline_rows = check_args(args, parser)  # before anything long starts
    try:
        device = "cuda" if torch.cuda.is_available() else "cpu"
        # --model None: the newest sft.py run of --task, trained first by sft.py where there is none
        model, tokenizer = common.load_model(args.model, device=device, task=args.task,
                                             run_dir=args.out, grad_checkpoint=args.grad_checkpoint)
        args.model_path = model.name_or_path  # the folder or hub id: resume restarts from it
        common.fill_defaults(args, DEFAULTS, model)  # --lr, --max-new-tokens if None
        if args.q0_cache is not None:  # once --max-new-tokens is known; read by q0_hat
            read_q0_cache(args.q0_cache, q0_made_with(args, args.model_path))
        ref_model = common.load_model(args.model_path, device=device)[0].requires_grad_(False)
        style = common.prompt_style(model, tokenizer)
        prompts = common.encode_prompts(task, pool, tokenizer, style)
        offline, cut, dropped = fit_offline(offline_rows, task, pool, prompts, tokenizer,
                                            args.max_new_tokens)
        if not offline and args.online_fraction < 1.0:
            raise ValueError(f"--offline-data {args.offline_data}: every row stopped unfinished "
                             f"before --max-new-tokens {args.max_new_tokens}")
    except ValueError as e:  # UsageError is one
        parser.error(str(e))
    eval_sets = {n: (ps, common.encode_prompts(task, ps, tokenizer, style))
                 for n, ps in held_out.items()}
    sampler = copy.deepcopy(model).eval().requires_grad_(False)  # lags the policy (§3.2)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0)
    schedule = torch.optim.lr_scheduler.LambdaLR(  # linear warm-up, then constant
        optimizer, lambda s: min(1.0, (s + 1) / max(1, args.warmup)))
    start = run.begin(model=model, optimizer=optimizer, schedule=schedule)  # 0, or the step saved
    if run.state:  # the sampler's weights; None: it held the policy's
        sampler.load_state_dict(run.state["sampler"] or run.state["model"])
    engine = common.make_engine(args.engine, sampler, tokenizer, args.model_path, seed=args.seed,
                                bf16=args.bf16, max_new_tokens=args.max_new_tokens)
    t0 = time.perf_counter()
    q0_pool = q0_hat(engine, task, pool, prompts, ref_model, args)  # §3.1.3, once
    time_q0 = time.perf_counter() - t0
    engine.sync(sampler)  # the sampler's weights back into the engine (q0_hat sampled pi_0)
    print(f"spo: {common.count_parameters(model) / 1e6:.2f}M parameters from "
          f"{args.model_path} at step {start}, engine {engine.name}, objective {args.objective}/"
          f"{args.loss}, beta={args.beta:.4f}, {len(pool)} problems (Q0_hat mean "
          f"{q0_pool.mean():.3f}), {len(offline)} offline rows ({cut} cut, {dropped} dropped)")
    if start == 0:
        run.log(0, {**evaluate(engine, model, sampler, task, eval_sets, args), "time_q0": time_q0,
                    "offline_cut": cut, "offline_dropped": dropped})
    for step in tqdm(range(start, args.steps), desc="spo", total=args.steps, initial=start,
                     leave=False):
        t0 = time.perf_counter()
        if step % args.model_update_interval == 0:  # refresh the sampler (§3.2)
            sampler.load_state_dict(model.state_dict())
            engine.sync(sampler)  # its new weights copied into the engine
        batch, temperature = draw_batch(engine, task, pool, prompts, offline, step, args)
        t_generate = time.perf_counter() - t0
        metrics = spo_step(model, ref_model, optimizer, schedule, batch, q0_pool, args, step,
                           tokenizer.pad_token_id)
        metrics.update(temperature=temperature, sampler_age=step % args.model_update_interval,
                       time_generate=t_generate, time_step=time.perf_counter() - t0)
        lagging = (step + 1) % args.model_update_interval != 0  # the sampler is not the policy
        # the metrics row; an evaluation and a checkpoint (with a lagging sampler's weights)
        # where due; the end, or --time-limit
        if run.end_step(step + 1, metrics, last=step + 1 == args.steps,
                        evaluate=lambda: evaluate(engine, model, sampler, task, eval_sets, args),
                        sampler=sampler.state_dict() if lagging else None):
            break
    engine.close()
    return run.finish(model, tokenizer)


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
