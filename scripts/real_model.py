"""A real pretrained chat model through the scripts, with the figures a first run needs.

    python scripts/real_model.py --preset cpu      # SmolLM2-135M-Instruct on a 2-core CPU
    python scripts/real_model.py --preset gpu      # the same on one GPU, within 10 minutes

One line for each figure, in this order:
  device   the device, torch, transformers and vLLM versions
  start    the model's held-out greedy accuracy before any training on Countdown (3 and 4
           numbers), with the share of answers in <answer> tags and the share cut at the budget
  tokens/s sampled completion tokens per second: on a GPU of the engine the runs use (vLLM where
           installed, else hf; every engine with --all-engines), on a CPU of kv and hf (and
           vllm with --vllm)
  step     seconds (and peak GPU memory) of one AdamW step on --step-seqs sampled completions
  sft      `sft.py` from the model: its time, peak GPU memory and held-out accuracy before -> after
  rl       `topr.py` from sft.py's final model: the same figures
Each run's own closing lines follow its figure line. --model: any folder or hub id instead.
Where nvidia-smi sees a GPU that torch cannot use, it stops with one line unless --preset cpu.
"""
import argparse
import json
import os
import sys
import time

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
import common  # noqa: E402
from tasks import countdown  # noqa: E402
from tasks.scoring import evaluate  # noqa: E402

# Budgets of each preset. cpu: about 30 minutes on 2 cores, on 3-number puzzles (the easiest the
# task offers); gpu: the scripts' defaults for a pretrained model (lr, 512 new tokens:
# common.fill_defaults), the budgets sized to end within 10 minutes on one GPU.
PRESETS = {
    "cpu": dict(sizes="3", eval_size=20, max_new_tokens=96, start_tokens=256, prompts=8,
                group_size=4, step_seqs=16,
                sft=["--steps", "40", "--batch-size", "8", "--warmup", "5", "--eval-every", "40"],
                rl=["--iterations", "1", "--prompts", "16", "--group-size", "4", "--keep", "0",
                    "--batch-size", "16", "--micro-batch", "16"]),
    "gpu": dict(sizes="3,4", eval_size=100, max_new_tokens=512, start_tokens=512, prompts=64,
                group_size=8, step_seqs=64,
                sft=["--steps", "300", "--batch-size", "32", "--warmup", "30",
                     "--eval-every", "300"],
                rl=["--iterations", "2", "--prompts", "256", "--group-size", "8",
                    "--keep", "1000", "--batch-size", "64", "--micro-batch", "16", "--bf16"]),
}
START_SIZES = (3, 4)  # the model's accuracy before any training: Countdown's default sizes


def say(what: str, line: str) -> None:
    print(f"{what:8s} {line}", flush=True)


def held_out(engine, tok, style, sizes, n, max_new_tokens) -> str:
    """Greedy accuracy, <answer> share and cut share per size, as 'size 3: 1.0% (...)'."""
    cells = []
    for size in sizes:
        problems = countdown.get_problems("test", n, size=size, seed=0)
        prompts = common.encode_prompts(countdown, problems, tok, style)
        greedy = {"greedy": common.SamplingConfig(n=1, max_new_tokens=max_new_tokens,
                                                  temperature=0.0)}
        m = evaluate(engine, countdown, problems, prompts, greedy)
        cells.append(f"size {size}: {100 * m['greedy/accuracy']:.1f}% (answer tags "
                     f"{100 * m['greedy/format_rate']:.0f}%, cut "
                     f"{100 * m['greedy/unfinished']:.0f}%, {m['greedy/length']:.0f} tokens)")
    return "; ".join(cells)


def tokens_per_second(engine, prompts, sc) -> tuple[float, list]:
    engine.generate(prompts[:2], sc)  # warm-up
    t = time.perf_counter()
    groups = engine.generate(prompts, sc)
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return sum(len(s.ids) for g in groups for s in g) / (time.perf_counter() - t), groups


def step_seconds(model, tok, samples) -> tuple[float, int | None]:
    """One AdamW step of -mean LP(y) over `samples`: seconds and peak GPU memory (CPU: None)."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-12)  # measured, not learned from
    model.train()
    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    t = time.perf_counter()
    lp, mask = common.completion_logprobs(model, [s.prompt_ids for s in samples],
                                          [s.ids for s in samples], tok.pad_token_id)
    (-(lp * mask).sum(-1).mean()).backward()
    optimizer.step()
    if cuda:
        torch.cuda.synchronize()
    seconds = time.perf_counter() - t
    model.eval()
    optimizer.zero_grad(set_to_none=True)
    return seconds, torch.cuda.max_memory_allocated() if cuda else None


def run_script(name: str, argv: list[str]) -> tuple[str, float, int | None]:
    """`name`.main(argv) in this process: its run folder, minutes and peak GPU memory."""
    script = __import__(name)
    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()
    t = time.perf_counter()
    out = script.main(argv)
    peak = torch.cuda.max_memory_allocated() if torch.cuda.is_available() else None
    return out, (time.perf_counter() - t) / 60, peak


def gains(out: str) -> str:
    """Held-out accuracy (greedy) per size at the run's first and last evaluation."""
    rows = [json.loads(line) for line in open(os.path.join(out, "metrics.jsonl"))]
    evals = [r for r in rows if any(k.endswith("greedy/accuracy") for k in r)]
    first, last = evals[0], evals[-1]
    return ", ".join(f"{k.split('/')[0]} {100 * first[k]:.1f} -> {100 * last[k]:.1f}%"
                     for k in first if k.endswith("greedy/accuracy"))


def gib(n: int | None) -> str:
    return "" if n is None else f", peak {n / 2**30:.1f} GiB"


def measured_engines(cuda: bool, every: bool, vllm: bool) -> list[str]:
    """The engines whose tokens/s are measured. On a GPU the one the runs use ("auto": vLLM where
    installed, else hf): kv and hf take minutes there that the runs do not use. On a CPU, or with
    `every` (--all-engines), kv and hf, and vLLM with `vllm` (--vllm) or where `every` finds it."""
    has_vllm = common.vllm_available()
    if cuda and not every:
        return ["vllm" if has_vllm else "hf"]
    return ["kv", "hf"] + ["vllm"] * (vllm or (every and has_vllm))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--preset", choices=list(PRESETS), default=None,
                   help="budgets (PRESETS); the device's by default")
    p.add_argument("--model", default=common.SMOLLM2, help="the pretrained model")
    p.add_argument("--vllm", action="store_true", help="on a CPU, measure the vLLM engine too")
    p.add_argument("--all-engines", action="store_true",
                   help="on a GPU, measure every engine, not only the one the runs use")
    p.add_argument("--out", default=time.strftime("runs/real-model-%Y%m%d-%H%M%S"),
                   help="folder of the two runs")
    p.add_argument("--skip-runs", action="store_true", help="the figures only, no sft.py / RL")
    args = p.parse_args(argv)
    cuda = torch.cuda.is_available()
    # a driver too old for torch's CUDA build: the gpu preset would run on the CPU for hours
    if not cuda and args.preset != "cpu" and (reason := common.gpu_unusable_reason()):
        print(f"real_model.py: error: {reason} (or run --preset cpu)", file=sys.stderr)
        return 2
    preset = PRESETS[args.preset or ("gpu" if cuda else "cpu")]
    sizes = common.int_list(preset["sizes"])
    import transformers
    vllm = __import__("vllm").__version__ if common.vllm_available() else "not installed"
    say("device", f"{torch.cuda.get_device_name() if cuda else 'CPU'}, torch "
        f"{torch.__version__}, transformers {transformers.__version__}, vllm {vllm}")
    common.setup(0)
    try:
        model, tok = common.load_model(args.model, device="cuda" if cuda else "cpu")
    except common.UsageError as e:
        p.error(str(e))
    style = common.prompt_style(model, tok)
    # the engine the runs use, sized for this script's longest completions (vLLM's KV cache)
    engine = common.make_engine(common.auto_engine(model), model, tok, model.name_or_path,
                                max_new_tokens=max(preset["start_tokens"],
                                                   preset["max_new_tokens"]))
    t = time.perf_counter()
    say("start", f"{model.name_or_path} ({common.count_parameters(model) / 1e6:.1f}M), greedy, "
        f"{preset['eval_size']} problems per size, <= {preset['start_tokens']} tokens: "
        + held_out(engine, tok, style, START_SIZES, preset["eval_size"], preset["start_tokens"])
        + f" ({time.perf_counter() - t:.0f}s)")

    problems = countdown.get_problems("train", preset["prompts"], size=sizes[0], seed=1)
    prompts = common.encode_prompts(countdown, problems, tok, style)
    sc = common.SamplingConfig(n=preset["group_size"], max_new_tokens=preset["max_new_tokens"],
                               seed=0)
    rates = {}
    for kind in measured_engines(cuda, args.all_engines, args.vllm):
        other = kind != engine.name  # the start's engine is measured as it is
        measured = common.make_engine(kind, model, tok, model.name_or_path,
                                      max_new_tokens=preset["max_new_tokens"]) if other else engine
        rates[kind], groups = tokens_per_second(measured, prompts, sc)
        if other:
            measured.close()
    engine.close()  # before the step and the runs: sft.py and topr.py start their own
    say("tokens/s", ", ".join(f"{k} {r:,.0f}" for k, r in rates.items())
        + f" ({len(prompts)} prompts x {sc.n}, <= {sc.max_new_tokens} new tokens, T = 1)")
    samples = [s for g in groups for s in g][:preset["step_seqs"]]
    seconds, peak = step_seconds(model, tok, samples)
    tokens = sum(len(s.prompt_ids) + len(s.ids) for s in samples)
    say("step", f"{seconds:.1f}s for {len(samples)} sequences, {tokens:,} tokens, fp32"
        + gib(peak))
    if args.skip_runs:
        return 0
    del model, engine
    common_flags = ["--task", "countdown", "--sizes", preset["sizes"], "--eval-sizes",
                    ",".join(map(str, START_SIZES)), "--eval-size", str(preset["eval_size"]),
                    "--eval-k", "4", "--max-new-tokens", str(preset["max_new_tokens"])]
    sft_out, minutes, peak = run_script("sft", common_flags + preset["sft"] + [
        "--model", args.model, "--out", os.path.join(args.out, "sft")])
    say("sft", f"{minutes:.1f} min{gib(peak)}; greedy {gains(sft_out)}")
    rl_out, minutes, peak = run_script("topr", common_flags + preset["rl"] + [
        "--model", os.path.join(sft_out, "final"), "--out", os.path.join(args.out, "topr")])
    say("rl", f"topr.py {minutes:.1f} min{gib(peak)}; greedy {gains(rl_out)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
