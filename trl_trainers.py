"""trl_trainers.py: TOPR, AGRO and SPO as Hugging Face TRL trainers, for models and clusters past
one GPU.

The single-file scripts (topr.py, agro.py, spo.py) are the readable version and run on one device.
This module puts the same losses inside TRL's GRPOTrainer (online generation, TRL's vLLM modes,
accelerate / DeepSpeed / FSDP across devices) and inside a transformers Trainer for the fully
offline data. The maths is imported from the scripts, never restated here: each trainer only gathers
what the script's loss needs from TRL's batch (completion ids and mask, rewards, the sampling and
reference log-probs).

[TOPR] Le Roux, Bellemare et al., "Tapered Off-Policy REINFORCE: Stable and efficient reinforcement
       learning for LLMs", 2025, arXiv:2503.14286
[AGRO] Tang et al., "RL-finetuning LLMs from on- and off-policy data with a single algorithm", 2025,
       arXiv:2503.19612
[SPO]  Cohen, Zhang, Zheng, Tang, Munos, Synnaeve, "Soft Policy Optimization: Online Off-Policy RL
       for Sequence Models", 2025, arXiv:2503.05453

    TOPRTrainer   GRPOTrainer + topr.topr_loss; mu = the distribution that sampled
                  (vLLM's log-probs when TRL has them, else the policy that generated the batch)
    AGROTrainer   GRPOTrainer + agro.agro_loss with on-policy (Eqs. 5-6) or off-policy (Eq. 4)
                  weights, computed per completion over its whole group (groups may span processes)
    SPOTrainer    GRPOTrainer + spo.cumulative_q / spo.spo_loss; Q0_hat from a `q0` column (spo.py's
                  cache, q0_column) or from the other completions of the group
    TOPROfflineTrainer, AGROOfflineTrainer   transformers.Trainer on the files topr.py / agro.py
                                             write

Each takes its own config (TOPRConfig, AGROConfig, SPOConfig: GRPOConfig plus the algorithm's
fields; OfflineConfig: TrainingArguments plus the same fields). TRL's `beta` is the algorithm's beta
for AGRO and SPO (it makes TRL compute the reference log-probs); TOPR needs no reference (beta 0).
The loss is always the script's, so GRPOConfig's loss_type, epsilon, scale_rewards and
importance-sampling options are ignored (docs/SCALE.md: TRL's limits for these losses).

    python trl_trainers.py --algo topr|agro|spo --model PATH --output-dir DIR   # one process
    accelerate launch --num_processes 8 trl_trainers.py --algo topr ...         # 8 GPUs (not run)

Requirements: pip install -r requirements-trl.txt.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import dataclass, field
from typing import NamedTuple

import torch
from transformers import Trainer, TrainerCallback, TrainingArguments
from trl import GRPOConfig, GRPOTrainer

import agro
import common
import spo
import topr
from tasks import get_task, scoring


# -------------------------------------------------------------------------------------------------
# Configs: GRPOConfig plus each algorithm's own fields (defaults: the scripts')
# -------------------------------------------------------------------------------------------------
@dataclass
class TOPRConfig(GRPOConfig):
    truncation: str = field(default="topr", metadata={"help": "limits (a+, b+, a-, b-) of Table 1 "
                                                               "(topr.LIMITS)"})
    baseline_c: float = field(default=-0.8, metadata={"help": "c of Eqs. 9-10 (-0.8 for rewards "
                                                               "+1/-1)"})
    split: float = field(default=0.0, metadata={"help": "0: negatives are R - c < 0 (TOPR); "
                                                        "1: [CR] Eq. 4"})
    sequence_norm: str = field(default="seq/len", metadata={"help": "seq/len ([TOPR]) or seq"})
    beta: float = 0.0  # TOPR has no reference model


@dataclass
class AGROConfig(GRPOConfig):
    weights: str = field(default="onpolicy", metadata={"help": "onpolicy (Eqs. 5-6, TRL's fresh "
                                                               "samples) or offpolicy (Eq. 4)"})
    lambda_lr: float | None = field(default=None, metadata={
        "help": "weight of the likelihood-ratio term (default beta/2, agro.py's; 1 = the paper)"})
    lr_baseline: str = field(default="var", metadata={"help": "v_i of the likelihood-ratio term"})
    sequence_norm: str = field(default="seq", metadata={"help": "seq or seq/len"})
    beta: float = 0.05  # agro.py's default with on-policy groups


@dataclass
class SPOConfig(GRPOConfig):
    objective: str = field(default="terminal",
                           metadata={"help": "terminal, nonterminal or advantage"})
    regression: str = field(default="sq", metadata={"help": "sq or ce (spo.py's --loss)"})
    eps: float = field(default=1e-3, metadata={"help": "ce: Q/beta clipped to <= -eps"})
    beta: float = spo.BETA  # spo.py's default, the paper's


@dataclass
class OfflineConfig(TrainingArguments):
    """TrainingArguments plus the offline losses' fields (TOPR: truncation .. sequence_norm; AGRO:
    beta, sequence_norm). remove_unused_columns is off: the batches are lists of token ids."""
    truncation: str = "topr"
    baseline_c: float = -0.8
    split: float = 0.0
    sequence_norm: str = "seq/len"
    beta: float = 0.3  # agro.py's default for off-policy data only
    remove_unused_columns: bool = False


# Flags left at None: (the tiny model's value, a pretrained model's), as in the scripts.
MODEL_DEFAULTS = {"lr": (6e-5, 1e-5), "max_new_tokens": (64, 512)}
SEQUENCE_NORMS = ("seq", "seq/len")  # per-sequence means: exact under gradient accumulation and DDP


def _check_norm(norm: str) -> None:
    if norm not in SEQUENCE_NORMS:
        raise ValueError(f"sequence_norm must be one of {SEQUENCE_NORMS} here, got {norm!r} "
                         "(the token mean over a step spans micro-batches and devices: use the "
                         "script)")


# -------------------------------------------------------------------------------------------------
# The online trainers: TRL's generation and batching, the scripts' losses
# -------------------------------------------------------------------------------------------------
class _ScriptLossTrainer(GRPOTrainer):
    """GRPOTrainer whose batches also carry each completion's reward and per-completion fields, and
    whose loss is a script's (`script_loss`). Subclasses define `completion_fields` and
    `script_loss`."""

    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        gathered = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
        # [N_all]
        self._all_rewards = (gathered * self.reward_weights.to(gathered.device)).nansum(dim=1)
        return gathered

    def _generate_and_score_completions(self, inputs):
        out = super()._generate_and_score_completions(inputs)
        here = slice(self.accelerator.process_index * len(inputs),
                     (self.accelerator.process_index + 1) * len(inputs))
        out["rewards"] = self._all_rewards[here]
        out.update(self.completion_fields(out, inputs, here))
        return out

    def completion_fields(self, batch: dict, inputs: list[dict], here: slice) -> dict:
        return {}

    def generation_logprobs(self, batch: dict) -> torch.Tensor:
        """[n, T] log-probs of the batch's completions under the weights that generated them (TRL's
        old_per_token_logps when it kept them, else one no-grad forward now, before any update)."""
        if "old_per_token_logps" in batch:
            return batch["old_per_token_logps"]
        ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], dim=1)
        attn = torch.cat([batch["prompt_mask"], batch["completion_mask"]], dim=1)
        with torch.no_grad():
            logps, _, _ = self._get_per_token_logps_and_entropies(
                self.model, ids, attn, batch["completion_ids"].size(1),
                batch_size=self.args.per_device_train_batch_size)
        return logps

    def group_view(self, values: torch.Tensor) -> torch.Tensor:
        """[n] per-completion values of this process -> [groups, G] over all processes (TRL keeps a
        prompt's G completions consecutive in the global batch, which may span processes)."""
        return self.accelerator.gather(values).view(-1, self.num_generations)

    def _compute_loss(self, model, inputs):
        ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], dim=1)
        attn = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1)
        logps, _, _ = self._get_per_token_logps_and_entropies(model, ids, attn,
                                                              inputs["completion_ids"].size(1))
        mask = (inputs["completion_mask"] if "tool_mask" not in inputs
                else inputs["completion_mask"] * inputs["tool_mask"])
        mask = mask.to(logps.dtype)
        loss = self.script_loss(logps * mask, mask, inputs)
        mode = "train" if self.model.training else "eval"
        self._metrics[mode]["script_loss"].append(
            self.accelerator.gather(loss.detach()).mean().item())
        return loss / (self.current_gradient_accumulation_steps if mode == "train" else 1)

    def script_loss(self, logprobs: torch.Tensor, mask: torch.Tensor, inputs: dict) -> torch.Tensor:
        raise NotImplementedError


class TOPRTrainer(_ScriptLossTrainer):
    """[TOPR] Algorithm 1 on TRL's batches: topr.topr_loss (Table 1's limits) with LP_mu the
    sequence log-prob under mu."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if self.args.truncation not in topr.LIMITS:
            raise ValueError(f"truncation must be one of {list(topr.LIMITS)}, "
                             f"got {self.args.truncation!r}")
        _check_norm(self.args.sequence_norm)

    def completion_fields(self, batch, inputs, here):
        """lp_mu [n]: the sampler's own log-probs (vLLM) where TRL has them, so that the truncated
        ratio also covers the sampler/trainer mismatch; else those of the weights that generated."""
        mu = self.generation_logprobs(batch)
        if "sampling_per_token_logps" in batch:
            sampled = batch["sampling_per_token_logps"]
            mu = torch.where(torch.isnan(sampled), mu, sampled)  # vLLM could not score a few tokens
        return {"lp_mu": (mu * batch["completion_mask"]).sum(-1)}

    def script_loss(self, logprobs, mask, inputs):
        a = self.args
        return topr.topr_loss(logprobs, mask, inputs["lp_mu"], inputs["rewards"], c=a.baseline_c,
                              norm=a.sequence_norm, split=a.split,
                              limits=topr.LIMITS[a.truncation])


class AGROTrainer(_ScriptLossTrainer):
    """[AGRO] on TRL's groups: weights from the regularised rewards of the whole group, then
    agro.agro_loss.

    The weights are computed when the batch is generated, with h = log pi - log pi_ref of the
    generating weights (as agro.py on fresh samples); with several optimizer steps per generation
    they stay those.
    """

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        a = self.args
        if a.weights not in ("onpolicy", "offpolicy"):
            raise ValueError(f"weights must be onpolicy or offpolicy, got {a.weights!r}")
        if a.beta <= 0:
            raise ValueError("AGRO needs beta > 0 (the KL coefficient; TRL then computes the "
                             "reference log-probs)")
        if a.num_generations < (3 if a.weights == "onpolicy" and a.lr_baseline == "var" else 2):
            raise ValueError("AGRO needs num_generations >= 2 (>= 3 for on-policy weights with "
                             "lr_baseline var)")
        _check_norm(a.sequence_norm)
        if a.lambda_lr is None:
            a.lambda_lr = a.beta / 2

    def completion_fields(self, batch, inputs, here):
        a = self.args
        mask = batch["completion_mask"]
        h = ((self.generation_logprobs(batch) - batch["ref_per_token_logps"]) * mask).sum(-1)  # [n]
        rpi = agro.regularised_rewards(self.group_view(batch["rewards"]), self.group_view(h),
                                       a.beta)  # [B, G]
        if a.weights == "onpolicy":
            w = agro.agro_onpolicy_weights(rpi, a.beta, a.lambda_lr, a.lr_baseline)
        else:
            w = agro.agro_offpolicy_weights(rpi)
        return {"agro_weights": w.reshape(-1)[here]}

    def script_loss(self, logprobs, mask, inputs):
        return agro.agro_loss(logprobs, mask, inputs["agro_weights"], self.args.sequence_norm)


class SPOTrainer(_ScriptLossTrainer):
    """[SPO] §3 on TRL's batches: Q = Q0_hat + beta sum (log pi - log pi_0), regressed onto r in
    {0, -1}.

    Q0_hat of a prompt comes from a `q0` column of the dataset (spo.py's estimate from pi_0;
    q0_column), or, without one, from the success rate of the OTHER G - 1 completions of its group
    (leave-one-out, so a completion's Q0_hat does not depend on its own reward): samples of the
    current policy at TRL's temperature rather than of pi_0, the same at the first step.
    """

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        a = self.args
        if a.beta <= 0:
            raise ValueError("SPO needs beta > 0 (the KL strength; TRL then computes the log-probs "
                             "of pi_0)")
        if (a.objective not in ("terminal", "nonterminal", "advantage")
                or a.regression not in ("sq", "ce")):
            raise ValueError(f"unknown SPO objective/regression {a.objective!r}/{a.regression!r}")

    def completion_fields(self, batch, inputs, here):
        r = batch["rewards"]
        if not torch.all((r == 0) | (r == -1)):
            raise ValueError("SPOTrainer needs rewards in {0 (correct), -1 (otherwise)}: "
                             "use spo_reward")
        if "q0" in inputs[0]:
            return {"q0": torch.tensor([x["q0"] for x in inputs], dtype=torch.float64,
                                       device=r.device)}
        wins = self.group_view((r == 0).double())  # [B, G]
        others = wins.sum(-1, keepdim=True) - wins
        q0 = spo.q0_from_successes(others, torch.full_like(others, self.num_generations - 1),
                                   self.args.beta)
        return {"q0": q0.reshape(-1)[here]}

    def script_loss(self, logprobs, mask, inputs):
        a = self.args
        q, q_t = spo.cumulative_q(logprobs, inputs["ref_per_token_logps"], mask, inputs["q0"],
                                  a.beta)
        return spo.spo_loss(q, q_t, mask, inputs["q0"], inputs["rewards"], a.beta, a.objective,
                            a.regression, a.eps)


# -------------------------------------------------------------------------------------------------
# Data: prompts and rewards of a task, Q0 from spo.py's cache
# -------------------------------------------------------------------------------------------------
def task_rows(task, problems: list[dict], tokenizer, style: str) -> list[dict]:
    """TRL dataset rows: the prompt text and the task's fields (handed to the reward function)."""
    return [{"prompt": common.prompt_text(task, p, tokenizer, style),
             **{f: p[f] for f in task.FIELDS}}
            for p in problems]


def task_reward(task, kind: str):
    """A TRL reward function: kind "pm1" (+1/-1, TOPR's paper reward), "spo" (0/-1) or a task
    variant."""
    def score(problem, text):
        if kind == "spo":
            return spo.spo_reward(task, problem, text)
        return topr.reward_of(task, problem, text, kind)

    def reward(prompts, completions, **columns):
        rows = [{f: columns[f][i] for f in task.FIELDS} for i in range(len(completions))]
        return [score(task.problem_from_row(row), text) for row, text in zip(rows, completions)]
    reward.__name__ = f"{task.NAME}_{kind}"
    return reward


def q0_column(rows: list[dict], task, cache_file: str, made_with: dict, beta: float) -> list[dict]:
    """rows with a `q0` field: Q0_hat of each row's problem from spo.py's q0.jsonl. made_with: what
    the estimate must have been made with, as spo.q0_made_with writes it ({"model": pi_0's folder,
    "task", "max_new_tokens", "samples"}). UsageError naming the first problem the cache lacks."""
    table = spo.read_q0_cache(cache_file, made_with)
    out = []
    for row in rows:
        hit = table.get(task.problem_key(task.problem_from_row(row)))
        if hit is None:
            raise common.UsageError(f"{cache_file}: no Q0 estimate of {task.problem_from_row(row)}")
        q0 = spo.q0_from_successes(torch.tensor(hit["successes"]),
                                   torch.tensor(made_with["samples"]), beta)
        out.append({**row, "q0": float(q0)})
    return out


# -------------------------------------------------------------------------------------------------
# Fully offline: a transformers Trainer on the files the scripts write
# -------------------------------------------------------------------------------------------------
def _as_lists(features: list[dict]) -> dict:
    """Collator: the batch stays lists (common.completion_logprobs pads and places completions
    itself)."""
    return {k: [f[k] for f in features] for k in features[0]}


class _OfflineTrainer(Trainer):
    # a mean over this micro-batch: Trainer divides by the accumulation steps
    loss_is_scaled_for_ga = False

    def __init__(self, *args, pad_id: int, **kwargs):
        kwargs.setdefault("data_collator", _as_lists)
        super().__init__(*args, **kwargs)
        self.pad_id = pad_id
        _check_norm(self.args.sequence_norm)

    def logprobs(self, model, prompts, completions):
        return common.completion_logprobs(model, prompts, completions, self.pad_id)


class TOPROfflineTrainer(_OfflineTrainer):
    """[TOPR] Algorithm 1 on a file of samples: rows {prompt_ids, completion_ids, reward, lp_mu}
    (topr_rows reads topr.py's data-ITER.jsonl)."""

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        a = self.args
        logprobs, mask = self.logprobs(model, inputs["prompt_ids"], inputs["completion_ids"])
        device = logprobs.device
        return topr.topr_loss(logprobs, mask, torch.tensor(inputs["lp_mu"], device=device),
                              torch.tensor(inputs["reward"], device=device), c=a.baseline_c,
                              norm=a.sequence_norm, split=a.split,
                              limits=topr.LIMITS[a.truncation])


class AGROOfflineTrainer(_OfflineTrainer):
    """Off-policy [AGRO] (Eq. 4) on a file of groups: rows {prompt_ids, completion_ids: [n lists],
    rewards: [n]} (agro_groups reads agro.py's reference_samples.jsonl). h = log pi - log pi_ref
    with the current pi at every step, as in agro.py."""

    def __init__(self, *args, ref_model, **kwargs):
        super().__init__(*args, **kwargs)
        self.ref_model = ref_model.to(self.args.device).eval().requires_grad_(False)

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        n = len(inputs["completion_ids"][0])
        prompts = [p for p in inputs["prompt_ids"] for _ in range(n)]
        completions = [c for group in inputs["completion_ids"] for c in group]
        logprobs, ref_lp, mask, _ = agro.policy_and_reference(model, self.ref_model, prompts,
                                                              completions, self.pad_id,
                                                              with_kl=False)
        # [B, n]
        rewards = torch.tensor(inputs["rewards"], dtype=logprobs.dtype, device=logprobs.device)
        h = ((logprobs.detach() - ref_lp) * mask).sum(-1).view_as(rewards)
        w = agro.agro_offpolicy_weights(agro.regularised_rewards(rewards, h, self.args.beta))
        return agro.agro_loss(logprobs, mask, w.reshape(-1), self.args.sequence_norm)


def topr_rows(path: str, task, tokenizer, style: str) -> list[dict]:
    """topr.py's samples file as rows {prompt_ids, completion_ids, reward, lp_mu}; the reward is the
    one written (topr.py's variant at generation). UsageError when a row lacks lp_mu or reward."""
    rows = topr.read_rows(path, task, tokenizer, style)
    for i, r in enumerate(rows, 1):
        if "lp_mu" not in r or "reward" not in r:
            raise common.UsageError(f"{path}:{i}: lp_mu or reward missing (write the file with "
                                    "topr.py)")
    return [{k: r[k] for k in ("prompt_ids", "completion_ids", "reward", "lp_mu")} for r in rows]


def agro_groups(path: str, task, n: int, tokenizer, style: str, variant: str) -> list[dict]:
    """agro.py's offline groups file (reference_samples.jsonl) as rows {prompt_ids, completion_ids:
    [n], rewards: [n]}, rewards computed from the text with the task's `variant` (as agro.py
    does)."""
    groups = agro.offline_groups(agro.read_offline(path, task, n), task, variant, tokenizer, style)
    return [{"prompt_ids": g.prompt_ids, "completion_ids": g.completion_ids[:n],
             "rewards": g.rewards[:n]}
            for g in groups]


# -------------------------------------------------------------------------------------------------
# Command line: one trainer on one task, held-out reward before and after
# -------------------------------------------------------------------------------------------------
ALGOS = {"topr": (TOPRTrainer, TOPRConfig, "pm1"), "agro": (AGROTrainer, AGROConfig, None),
         "spo": (SPOTrainer, SPOConfig, "spo")}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description="TOPR, AGRO or SPO as a TRL trainer: one process, or "
                                "many under `accelerate launch` (module docstring)")
    add = p.add_argument
    add("--algo", required=True, choices=list(ALGOS))
    add("--task", default="countdown", help="task module in tasks/")
    add("--model", default="sft", help="`sft` (the newest sft.py run of --task), a folder or a hub "
        "id; the start and (AGRO, SPO) the frozen reference")
    add("--output-dir", default=None, help="run folder (default runs/trl-ALGO-TASK-TIME)")
    add("--data", default=None, metavar="FILE", help="topr, agro: train fully offline on this file "
        "(topr.py's data-ITER.jsonl, agro.py's reference_samples.jsonl) instead of sampling")
    add("--q0-cache", default=None, metavar="FILE", help="spo: Q0 from spo.py's q0.jsonl (made "
        "with this --model, --max-new-tokens and --q0-samples); default: the group's others")
    add("--q0-samples", type=common.positive_int, default=64, help="samples behind --q0-cache")
    add("--resume", action="store_true",
        help="continue from the newest checkpoint-N in --output-dir (saved every 50 steps)")
    add("--max-steps", type=common.positive_int, default=100, help="optimizer steps")
    add("--time-limit", type=common.positive_float, default=None, metavar="MIN",
        help="stop training MIN minutes after the start (then evaluate and save as at the end)")
    add("--prompts", type=common.positive_int, default=64,
        help="prompts per step, over all processes (offline: rows of --data); 64 x 4 is rloo.py's "
        "batch, so that the two compare step for step")
    add("--num-generations", type=int, default=4, help="completions per prompt (TRL's G, >= 2)")
    add("--lr", type=common.positive_float, default=None, help="AdamW lr; None: 6e-5 for tiny, "
        "1e-5 for a pretrained model (the RL scripts' defaults)")
    add("--warmup", type=common.nonnegative_int, default=10, help="linear warm-up steps")
    add("--beta", type=common.positive_float, default=None,
        help="AGRO, SPO: KL strength (default the config's: agro.py's, spo.py's)")
    add("--weights", choices=["onpolicy", "offpolicy"], default=None, help="agro, online: Eqs. "
        "5-6's weights (the config's default, the paper's for fresh samples) or Eq. 4's, which "
        "also learn from a weak start (docs/SCALE.md)")
    add("--max-new-tokens", type=common.positive_int, default=None,
        help="tokens per completion; None: 64 for tiny, 512 for a pretrained model ([TOPR] §4)")
    add("--sizes", default=None, help="difficulty levels, comma-separated (Countdown: numbers a "
        "puzzle); default: the task's SIZES")
    add("--eval-sizes", default=None, help="held-out difficulty levels; default: the task's SIZES")
    add("--train-size", type=common.positive_int, default=20000, help="training problems per size")
    add("--eval-size", type=common.nonnegative_int, default=200,
        help="held-out problems per size (0: no evaluation)")
    add("--eval-k", type=common.positive_int, default=8,
        help="samples per problem at temperature 1")
    add("--use-vllm", action="store_true", help="generate with TRL's colocated vLLM (GPU)")
    add("--bf16", action="store_true", help="bf16 mixed precision (GPU)")
    add("--seed", type=common.nonnegative_int, default=0)
    add("--threads", type=common.positive_int, default=None, help="torch CPU threads")
    return p, p.parse_args(argv)


class Inputs(NamedTuple):
    task: object
    model_path: str
    tokenizer: object
    style: str            # the prompt style of the model (common.prompt_style)
    train: list[dict]     # the trainer's dataset rows
    eval_sets: dict       # size -> (problems, prompt ids)


def sizes(text: str | None, default, flag: str) -> list[int]:
    try:
        return list(default) if text is None else [int(s) for s in text.split(",")]
    except ValueError:
        raise common.UsageError(f"{flag}: expected comma-separated integers, got {text!r}") \
            from None


def load_inputs(args, parser, world: int) -> Inputs:
    """Every flag and file checked, the task's rows built; bad input: one line, exit 2."""
    from transformers import AutoConfig, AutoTokenizer
    try:
        task = get_task(args.task)
        if args.resume and not args.output_dir:
            raise common.UsageError("--resume needs the --output-dir of the run")
        if args.num_generations < 2:
            raise common.UsageError(f"--num-generations must be at least 2, got "
                                    f"{args.num_generations}")
        if (args.data or args.q0_cache) and (args.data and args.algo == "spo"
                                             or args.q0_cache and args.algo != "spo"):
            raise common.UsageError("--data goes with topr or agro, --q0-cache with spo")
        if args.weights and (args.algo != "agro" or args.data):
            raise common.UsageError("--weights goes with --algo agro, sampling online")
        per_step = args.prompts * (1 if args.data and args.algo == "topr" else
                                   args.num_generations)
        if per_step % world:
            raise common.UsageError(f"{per_step} samples per step do not split over {world} "
                                    "processes")
        path = common.resolve_model_path(args.model, task=args.task)
        tok = AutoTokenizer.from_pretrained(path)
        style = getattr(AutoConfig.from_pretrained(path), "prompt_style", None) or \
            ("chat" if tok.chat_template else "plain")
        for flag, (tiny, pretrained) in MODEL_DEFAULTS.items():  # flags left at None
            if getattr(args, flag) is None:
                setattr(args, flag, tiny if style == "compact" else pretrained)
        if args.data and args.algo == "topr":
            train = topr_rows(args.data, task, tok, style)
        elif args.data:
            train = agro_groups(args.data, task, args.num_generations, tok, style,
                                task.REWARD_VARIANTS[0])
        else:
            problems = [p for n in sizes(args.sizes, task.SIZES, "--sizes")
                        for p in task.get_problems("train", args.train_size, size=n,
                                                   seed=args.seed)]
            train = task_rows(task, problems, tok, style)
        if args.q0_cache:
            made_with = {"model": os.path.realpath(path) if os.path.exists(path) else path,
                         "task": args.task, "max_new_tokens": args.max_new_tokens,
                         "samples": args.q0_samples}
            train = q0_column(train, task, args.q0_cache, made_with, args.beta or spo.BETA)
        eval_sets = {}
        for n in sizes(args.eval_sizes, task.SIZES, "--eval-sizes") if args.eval_size else []:
            problems = task.get_problems("test", args.eval_size, size=n, seed=args.seed)
            eval_sets[n] = (problems, common.encode_prompts(task, problems, tok, style))
    except (common.UsageError, ValueError, OSError) as e:
        parser.error(str(e).splitlines()[0])
    return Inputs(task, path, tok, style, train, eval_sets)


class TimeLimit(TrainerCallback):
    """Stops training at a wall-clock deadline (checked after every optimizer step)."""

    def __init__(self, deadline: float):
        self.deadline = deadline

    def on_step_end(self, args, state, control, **kwargs):
        control.should_training_stop = control.should_training_stop or time.time() >= self.deadline


def make_trainer(args, inp: Inputs, world: int, out: str):
    """The trainer --algo and --data name, configured from the flags."""
    from datasets import Dataset
    shared = dict(output_dir=out, max_steps=args.max_steps, learning_rate=args.lr,
                  warmup_steps=args.warmup, lr_scheduler_type="constant_with_warmup",
                  max_grad_norm=1.0, weight_decay=0.0, seed=args.seed, bf16=args.bf16,
                  use_cpu=not torch.cuda.is_available(), report_to=[], logging_steps=1,
                  save_strategy="steps", save_steps=50, save_only_model=False)
    data = Dataset.from_list(inp.train)
    if args.data:  # fully offline: a transformers Trainer on the file's rows or groups
        from transformers import AutoModelForCausalLM
        config = OfflineConfig(per_device_train_batch_size=args.prompts // world,
                               **({"beta": args.beta} if args.beta else {}), **shared)
        model = AutoModelForCausalLM.from_pretrained(inp.model_path)
        kw = dict(model=model, args=config, train_dataset=data,
                  pad_id=inp.tokenizer.pad_token_id, processing_class=inp.tokenizer)
        if args.algo == "topr":
            return TOPROfflineTrainer(**kw)
        ref = AutoModelForCausalLM.from_pretrained(inp.model_path)
        return AGROOfflineTrainer(ref_model=ref, **kw)
    cls, config_cls, reward = ALGOS[args.algo]
    config = config_cls(per_device_train_batch_size=args.prompts * args.num_generations // world,
                        num_generations=args.num_generations,
                        max_completion_length=args.max_new_tokens, temperature=1.0,
                        disable_dropout=True, use_vllm=args.use_vllm, vllm_mode="colocate",
                        **({"beta": args.beta} if args.beta else {}),
                        **({"weights": args.weights} if args.weights else {}), **shared)
    return cls(model=inp.model_path, args=config, train_dataset=data,
               reward_funcs=task_reward(inp.task, reward or inp.task.REWARD_VARIANTS[0]),
               processing_class=inp.tokenizer)


def evaluate(path: str, inp: Inputs, args) -> dict:
    """Held-out metrics of the model in `path`, per size, as every script reports them
    (tasks/scoring.py): a greedy completion and --eval-k samples at temperature 1 (seed 0)."""
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model, tok = common.load_model(path, device=device)
    engine = common.make_engine("auto", model, tok, path, seed=args.seed)
    configs = {"greedy": common.SamplingConfig(n=1, max_new_tokens=args.max_new_tokens,
                                               temperature=0.0),
               "sampled": common.SamplingConfig(n=args.eval_k, max_new_tokens=args.max_new_tokens,
                                                seed=0)}
    metrics = {}
    for n, (problems, prompts) in inp.eval_sets.items():
        metrics.update(scoring.evaluate(engine, inp.task, problems, prompts, configs,
                                        prefix=f"eval{n}/"))
    engine.close()
    return metrics


def main(argv=None):
    started = time.time()
    parser, args = parse_args(argv)
    from accelerate import PartialState
    state = PartialState()  # one process, or this one of `accelerate launch`'s
    common.setup(args.seed, args.threads)
    inp = load_inputs(args, parser, state.num_processes)
    out = args.output_dir or time.strftime(f"runs/trl-{args.algo}-{args.task}-%Y%m%d-%H%M%S")
    figures = {"before": evaluate(inp.model_path, inp, args) if state.is_main_process else {}}
    try:
        trainer = make_trainer(args, inp, state.num_processes, out)
    except ValueError as e:  # the trainers' and TRL's own checks of the configuration
        parser.error(str(e).splitlines()[0])
    if args.time_limit:
        trainer.add_callback(TimeLimit(started + 60 * args.time_limit))
    t0 = time.time()
    trainer.train(resume_from_checkpoint=args.resume or None)
    figures["train_seconds"] = round(time.time() - t0, 1)
    figures["steps"] = trainer.state.global_step
    final = os.path.join(out, "final")
    trainer.save_model(final)  # every process takes part (ZeRO-3 gathers the weights)
    if state.is_main_process:
        figures["after"] = evaluate(final, inp, args)
        with open(os.path.join(out, "eval.json.tmp"), "w") as f:
            json.dump(figures, f, indent=2)
        os.replace(os.path.join(out, "eval.json.tmp"), os.path.join(out, "eval.json"))
        for key in figures["before"]:
            if key.endswith(("greedy/reward", "sampled/reward")):
                print(f"{key}: {figures['before'][key]:.3f} -> {figures['after'][key]:.3f}")
        print(f"done: {figures['steps']} steps in {figures['train_seconds']} s; model in {final}, "
              f"figures in {os.path.join(out, 'eval.json')}")
    return out


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
