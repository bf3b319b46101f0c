"""One optimizer step of each TRL trainer (trl_trainers.py) on a fixed batch, for the data-parallel
check.

Run it once as one process and once as two (gloo on CPU), then compare the updates:
    python scripts/trl_data_parallel.py --out runs/dp1
    torchrun --nproc_per_node 2 scripts/trl_data_parallel.py --out runs/dp2
(accelerate 1.15 has no --multi_cpu; `accelerate launch --cpu --num_processes 2` started one process
on this machine, so the CPU run uses torchrun, which is what accelerate launches; on GPUs:
accelerate launch.)
    python scripts/trl_data_parallel.py --compare runs/dp1 runs/dp2
The global batch is the same (3 puzzles x 8 completions; 24 on one process, 12 on each of two, so
that one group spans the two processes and its weights need the other's rewards), and the
completions are fixed (a rollout function that returns the same texts whatever the process), so
both runs must make the same update: plain SGD with lr 1, so the update is the gradient itself.
"""
import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import common  # noqa: E402
from tasks import countdown  # noqa: E402

G = 8  # completions per prompt: 3 x 8 = 24, 12 a process, so the second group spans both
PROBLEMS = [{"nums": [3, 5], "target": 8}, {"nums": [7, 2], "target": 9},
            {"nums": [6, 1], "target": 7}]
TRAINERS = {"topr": ("TOPRTrainer", "TOPRConfig", "pm1", {}),  # trl_trainers' names: TRL is
            "agro": ("AGROTrainer", "AGROConfig", "original", {}),  # imported only for a run
            "spo": ("SPOTrainer", "SPOConfig", "spo", {})}


def fixed_rollout(tokenizer, rows):
    """A TRL rollout function returning, for the k-th copy of a prompt, the (k mod 4)-th of four
    fixed texts (right, wrong, unparsable, cut short), so that completions do not depend on the
    process."""
    problem_of = {r["prompt"]: countdown.problem_from_row(r) for r in rows}

    def texts(problem):
        right = countdown.demonstration(problem)
        return [right, right.replace(str(problem["target"]), str(problem["target"] + 1)),
                "<answer>", right[:4]]

    def rollout(prompts, trainer):
        seen, completions = {}, []
        for p in prompts:
            k = seen[p] = seen.get(p, -1) + 1
            ids = tokenizer(texts(problem_of[p])[k % 4], add_special_tokens=False)["input_ids"]
            completions.append(ids + [tokenizer.eos_token_id])
        return {"prompt_ids": [tokenizer(p, add_special_tokens=False)["input_ids"]
                               for p in prompts],
                "completion_ids": completions, "logprobs": None}
    return rollout


def one_step(name, model_path, out, world):
    from datasets import Dataset

    import trl_trainers as tt
    trainer_name, config_name, kind, extra = TRAINERS[name]
    cls, config_cls = getattr(tt, trainer_name), getattr(tt, config_name)
    _, tok = common.load_model(model_path)
    rows = tt.task_rows(countdown, PROBLEMS, tok, "compact")
    config = config_cls(output_dir=os.path.join(out, name), use_cpu=True, bf16=False, report_to=[],
                        save_strategy="no", per_device_train_batch_size=len(PROBLEMS) * G // world,
                        num_generations=G, max_completion_length=32, max_steps=1, optim="sgd",
                        learning_rate=1.0, lr_scheduler_type="constant", max_grad_norm=1e9, seed=0,
                        disable_tqdm=True, logging_steps=1, **extra)
    trainer = cls(model=model_path, reward_funcs=tt.task_reward(countdown, kind), args=config,
                  train_dataset=Dataset.from_list(rows), processing_class=tok,
                  rollout_func=fixed_rollout(tok, rows))
    before = [p.detach().clone() for p in trainer.model.parameters()]
    print(f"{name}: process {trainer.accelerator.process_index} of "
          f"{trainer.accelerator.num_processes}, "
          f"{config.per_device_train_batch_size} completions here")
    trainer.train()
    if trainer.accelerator.is_main_process:
        model = trainer.accelerator.unwrap_model(trainer.model)
        delta = torch.cat([(p.detach() - b).reshape(-1)
                           for p, b in zip(model.parameters(), before)])
        torch.save(delta, os.path.join(out, f"{name}.pt"))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", help="folder for the updates (and the tiny model)")
    p.add_argument("--compare", nargs=2, metavar="DIR", help="compare the updates of two runs")
    args = p.parse_args()
    if args.compare:
        for name in TRAINERS:
            a, b = (torch.load(os.path.join(d, f"{name}.pt")) for d in args.compare)
            print(f"{name}: |update| max {a.abs().max():.3e}, "
                  f"max |difference| {(a - b).abs().max():.3e}")
        return
    if not args.out:
        p.error("give --out DIR or --compare DIR DIR")
    common.setup(0, 1)
    model_path = os.path.join(os.path.dirname(os.path.abspath(args.out)), "dp-tiny-model")
    if int(os.environ.get("LOCAL_RANK", 0)) == 0 and not os.path.exists(model_path):
        common.build_tiny_model(model_path, seed=0)
    world = int(os.environ.get("WORLD_SIZE", 1))
    if world > 1:
        import torch.distributed as dist
        from accelerate import PartialState
        PartialState().wait_for_everyone()
        print(f"torch.distributed: {dist.get_backend_config()}, world size {dist.get_world_size()}")
    os.makedirs(args.out, exist_ok=True)
    for name in TRAINERS:
        one_step(name, model_path, args.out, world)


if __name__ == "__main__":
    main()
