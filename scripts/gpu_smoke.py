"""What to run the first time a GPU is at hand: about 5 minutes, no network.

    python scripts/gpu_smoke.py                    # a real model if one is in the local HF cache
    python scripts/gpu_smoke.py --model /path/to/a/checkpoint

One line for each check, in this order:
  device    the GPU, torch, transformers and vLLM versions
  model     the model it measures: --model, else Qwen/Qwen2.5-0.5B-Instruct where the local HF
            cache holds it, else tests/hub_standin.py's Qwen2-shaped stand-in (built in seconds)
  tests     `pytest tests/test_vllm.py` (log-probs, weight sync, greedy, seeds, exact resume)
  start-up  seconds to start the vLLM engine (the GPU build compiles and captures CUDA graphs)
  tokens/s  sampled completion tokens per second of vLLM, our kv loop and HF generate, one batch
  sync      the largest |log-prob| gap between engine and trainer after perturbing the trainer's
            weights and syncing them (0 up to numerics; the trainer computes in fp32)
  memory    peak GPU memory of a trainer step (forward, backward, AdamW) and the engine's share
  scripts   one short run of each script through scripts/rehearse.py with --engine vllm
Where vLLM is not installed its checks say so, and the scripts run with the kv engine. On a machine
with no GPU it says so in one line and exits 0; `--cpu` rehearses every check on the CPU instead
(the figures then say nothing about a GPU; memory is not measured).
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


def trainer_step_peak(model, tok, samples) -> int | None:
    """Peak GPU memory of one training step on `samples` with the scripts' fp32 AdamW (None on
    the CPU)."""
    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-7)
    model.train()
    lp, mask = common.completion_logprobs(model, [s.prompt_ids for s in samples],
                                          [s.ids for s in samples], tok.pad_token_id)
    (-(lp * mask).sum() / mask.sum()).backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    model.eval()
    del optimizer
    return torch.cuda.max_memory_allocated() if cuda else None


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default=None,
                   help="default: the cached real model, else the stand-in")
    p.add_argument("--prompts", type=common.positive_int, default=64)
    p.add_argument("--n", type=common.positive_int, default=8, help="samples per prompt")
    p.add_argument("--max-new-tokens", type=common.positive_int, default=128)
    p.add_argument("--skip-scripts", action="store_true", help="leave out the scripts' short runs")
    p.add_argument("--cpu", action="store_true",
                   help="with no GPU, rehearse the checks on the CPU (to test this script)")
    args = p.parse_args()
    cuda = torch.cuda.is_available()
    if not cuda and not args.cpu:
        print("gpu_smoke: no GPU here (torch.cuda.is_available() is False); nothing to check")
        return 0
    has_vllm = common.vllm_available()
    import transformers
    vllm_version = __import__("vllm").__version__ if has_vllm else "not installed"
    where = torch.cuda.get_device_name() if cuda else "CPU (--cpu)"
    say("device", f"{where}, torch {torch.__version__}, transformers {transformers.__version__}, "
        f"vllm {vllm_version}")

    path = args.model or cached_model()
    if path is None:
        from hub_standin import build_standin
        path = build_standin(os.path.join(tempfile.mkdtemp(), "standin"))
        say("model", f"the hub-shaped stand-in ({REAL_MODEL} is not in the local HF cache)")
    common.setup(0)
    model, tok = common.load_model(path, device="cuda" if cuda else "cpu")
    say("model", f"{path}: {common.count_parameters(model) / 1e6:.1f}M parameters, fp32 trainer")

    if has_vllm:
        t = time.perf_counter()
        tests = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:warnings",
                                "tests/test_vllm.py"], cwd=ROOT, capture_output=True, text=True)
        last = (tests.stdout.strip().splitlines() or ["(no output)"])[-1]
        say("tests", f"tests/test_vllm.py: {last} ({time.perf_counter() - t:.0f}s)")
    else:
        say("tests", "vLLM is not installed: tests/test_vllm.py not run")

    problems = countdown.get_problems("test", args.prompts, size=3)
    prompts = common.encode_prompts(countdown, problems, tok, common.prompt_style(model, tok))
    sc = common.SamplingConfig(args.n, args.max_new_tokens, 1.0)
    engines = {"kv": common.KVEngine(model, tok), "hf": common.HFEngine(model, tok)}
    # the trainer's peak first: once the engine is in this process, torch counts its memory too
    samples = [s for g in engines["kv"].generate(prompts[:16], sc) for s in g]
    trainer = trainer_step_peak(model, tok, samples)
    engine_bytes = None
    if has_vllm:
        synchronize()
        free_before = torch.cuda.mem_get_info()[0] if cuda else None
        t = time.perf_counter()
        engines["vllm"] = common.make_engine("vllm", model, tok, path)
        say("start-up", f"vLLM engine {time.perf_counter() - t:.1f}s")
        if cuda:
            engine_bytes = free_before - torch.cuda.mem_get_info()[0]
    else:
        say("start-up", "vLLM is not installed")
    rates = {name: rate(e, prompts, sc) for name, e in engines.items()}
    say("tokens/s", ", ".join(f"{name} {r:,.0f} ({r / rates['hf']:.2f}x hf)"
                              for name, r in rates.items())
        + f"; {args.prompts} prompts x {args.n}, <= {args.max_new_tokens} new tokens, T = 1")

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
        say("memory", f"trainer step peak {gib(trainer)} (16 prompts x {args.n}); vLLM engine "
            + ("not installed" if engine_bytes is None else gib(engine_bytes)))
    else:
        say("memory", "not measured on the CPU")
    for e in engines.values():
        e.close()

    if args.skip_scripts:
        return 0
    engine = "vllm" if has_vllm else "kv"
    t = time.perf_counter()
    out = os.path.join(tempfile.mkdtemp(), "rehearse")
    proc = subprocess.run([sys.executable, "scripts/rehearse.py", "--engines", engine, "--out",
                           out], cwd=ROOT, capture_output=True, text=True)
    rows = [line for line in proc.stdout.splitlines() if " rc=" in line]
    failed = [line for line in rows if " rc=0 " not in line or "reloads=False" in line]
    say("scripts", f"{len(rows) - len(failed)} of {len(rows)} short runs ended and reload, engine "
        f"{engine} ({time.perf_counter() - t:.0f}s)")
    for line in rows:
        say("", line)
    return 1 if failed or proc.returncode else 0


if __name__ == "__main__":
    sys.exit(main())
