"""A real model's speed on this machine, each figure beside the others from one run.

    python scripts/bench_real_model.py                          # SmolLM2-135M-Instruct
    python scripts/bench_real_model.py --model runs/real-model/sft/final   # its sft.py model

Run it on a quiet machine: each figure is the best of --repeats, and the ratios are what carries
from one machine to another. It prints:
  peak    this CPU's matmul GFLOP/s in fp32 and bf16 (an MLP-shaped product, the torch threads)
  train   tokens/s of one AdamW step (forward and backward of every token of the batch) on the RL
          scripts' batch, fp32 and under bf16 autocast (--bf16), and its share of that dtype's
          peak, counting 6 N FLOPs a token (N parameters; attention's own products left out)
  sample  completion tokens/s of each engine (kv, hf, vLLM) in fp32 and bf16 at the RL scripts'
          batch (8 prompts x 4 samples, T = 1) and at an evaluation's (100 prompts, greedy), and
          its share of the peak at 2 N FLOPs a token
  gap     for each engine and dtype, the largest |log mu - log pi| of a token of its T = 1
          samples, against the trainer in fp32 and under bf16 autocast (common.completion_logprobs)
vLLM runs in a child process of its own for each dtype (a second engine's close() in one process
tears down the first's), after the others.
"""
import argparse
import json
import os
import subprocess
import sys
import time

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
import common  # noqa: E402
from tasks import countdown  # noqa: E402

DTYPES = ("fp32", "bf16")


def matmul_peak(hidden: int, dtype: torch.dtype, repeats: int) -> float:
    """GFLOP/s of a [512 x hidden] x [hidden x 4 hidden] product (an MLP's up-projection)."""
    a = torch.randn(512, hidden, dtype=dtype)
    b = torch.randn(hidden, 4 * hidden, dtype=dtype)
    for _ in range(3):
        a @ b
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        for _ in range(10):
            a @ b
        best = min(best, (time.perf_counter() - t) / 10)
    return 2 * 512 * hidden * 4 * hidden / best / 1e9


def train_rate(model, tok, samples, bf16: bool, micro: int, repeats: int) -> float:
    """Tokens/s of one AdamW step on `samples` (micro-batches of `micro`), the best of repeats."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-12)  # measured, not learned from
    tokens = sum(len(s.prompt_ids) + len(s.ids) for s in samples)
    model.train()
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        for i in range(0, len(samples), micro):
            part = samples[i:i + micro]
            lp, mask = common.completion_logprobs(model, [s.prompt_ids for s in part],
                                                  [s.ids for s in part], tok.pad_token_id,
                                                  bf16=bf16)
            (-(lp * mask).sum(-1).mean()).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        best = min(best, time.perf_counter() - t)
    model.eval()
    return tokens / best


def logprob_gap(model, tok, samples, bf16: bool) -> float:
    with torch.no_grad():
        lp, _ = common.completion_logprobs(model, [s.prompt_ids for s in samples],
                                           [s.ids for s in samples], tok.pad_token_id, bf16=bf16)
    return max((lp[i, :len(s.ids)] - torch.tensor(s.logprobs)).abs().max().item()
               for i, s in enumerate(samples) if s.ids)


def measure_engine(engine, model, tok, batches: dict, repeats: int) -> dict:
    """tokens/s at each batch (best of repeats) and the gaps of the RL batch's samples."""
    out = {}
    for name, (prompts, sc) in batches.items():
        engine.generate(prompts[:2], sc)  # warm-up
        best, flat = float("inf"), []
        for _ in range(repeats):
            t = time.perf_counter()
            flat = [s for g in engine.generate(prompts, sc) for s in g]
            best = min(best, time.perf_counter() - t)
        out[f"{name} tok/s"] = sum(len(s.ids) for s in flat) / best
        out[f"{name} length"] = sum(len(s.ids) for s in flat) / len(flat)
        if name == "rl":
            out["gap fp32 trainer"] = logprob_gap(model, tok, flat, bf16=False)
            out["gap bf16 trainer"] = logprob_gap(model, tok, flat, bf16=True)
    return out


def batches_for(tok, style, max_new_tokens: int) -> dict:
    rl = countdown.get_problems("train", 8, size=3, seed=1)
    ev = countdown.get_problems("test", 100, size=3, seed=0)
    enc = lambda problems: common.encode_prompts(countdown, problems, tok, style)  # noqa: E731
    return {"rl": (enc(rl), common.SamplingConfig(4, max_new_tokens, 1.0, seed=0)),
            "eval": (enc(ev), common.SamplingConfig(1, max_new_tokens, 0.0))}


def vllm_child(args) -> dict:
    """The vLLM figures of one dtype, measured in this (child) process."""
    common.setup(0, args.threads)
    model, tok = common.load_model(args.model)
    engine = common.make_engine("vllm", model, tok, args.model, bf16=args.child == "bf16",
                                max_new_tokens=args.max_new_tokens)
    try:
        batches = batches_for(tok, common.prompt_style(model, tok), args.max_new_tokens)
        return measure_engine(engine, model, tok, batches, args.repeats)
    finally:
        engine.close()


class OwnAttentionKVEngine(common.KVEngine):
    """The kv engine on the model's own attention (transformers' sdpa or eager, which copy each
    key/value head for the query heads that share it: repeat_kv) instead of the kv engine's
    _grouped_query_attention: the A/B of that attention, the rest of the engine the same."""
    name = "kv-own-attention"

    def _generate_batch(self, prompts, sc):
        return self._decode(prompts, sc)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--model", default=common.SMOLLM2, help="the model: a folder or `smollm2`")
    p.add_argument("--max-new-tokens", type=common.positive_int, default=96,
                   help="new tokens per completion at most (scripts/real_model_gains.py's)")
    p.add_argument("--micro-batch", type=common.positive_int, default=16,
                   help="sequences a forward and backward of the training step")
    p.add_argument("--repeats", type=common.positive_int, default=2, help="best of this many")
    p.add_argument("--threads", type=common.positive_int, default=None, help="torch threads")
    p.add_argument("--no-vllm", action="store_true", help="leave vLLM out")
    p.add_argument("--child", choices=DTYPES, help=argparse.SUPPRESS)  # one vLLM dtype, as JSON
    args = p.parse_args(argv)
    try:
        args.model = common.resolve_model_path(args.model)  # `smollm2`: its folder
        if args.child:
            print("RESULT " + json.dumps(vllm_child(args)))
            return 0
        common.setup(0, args.threads)
        model, tok = common.load_model(args.model)
    except common.UsageError as e:
        p.error(str(e))
    style = common.prompt_style(model, tok)
    bf16_native = torch.ops.mkldnn._is_mkldnn_bf16_supported()
    n = common.count_parameters(model)
    hidden = model.config.hidden_size
    peak = {"fp32": matmul_peak(hidden, torch.float32, 5),
            "bf16": matmul_peak(hidden, torch.bfloat16, 5)}
    print(f"model    {args.model}: {n / 1e6:.1f}M parameters; {torch.get_num_threads()} torch "
          f"threads; native bf16 (AMX/avx512_bf16): {'yes' if bf16_native else 'no'}")
    print(f"peak     matmul [512 x {hidden}] x [{hidden} x {4 * hidden}]: fp32 "
          f"{peak['fp32']:.0f} GFLOP/s, bf16 {peak['bf16']:.0f} GFLOP/s "
          f"(bf16/fp32 {peak['bf16'] / peak['fp32']:.2f}x)", flush=True)

    batches = batches_for(tok, style, args.max_new_tokens)
    results = {}
    for dtype in DTYPES:
        for kind in ("kv", "hf"):
            engine = common.make_engine(kind, model, tok, args.model, bf16=dtype == "bf16")
            results[kind, dtype] = measure_engine(engine, model, tok, batches, args.repeats)
            print(f"         measured {kind} {dtype}", flush=True)
    # the A/B of the kv engine's attention: the model's own (sdpa or eager), fp32 and bf16
    for dtype in DTYPES:
        engine = OwnAttentionKVEngine(model, tok, bf16=dtype == "bf16")
        own = f"kv, {model.config._attn_implementation}"
        results[own, dtype] = measure_engine(engine, model, tok, batches, args.repeats)
        print(f"         measured {own} {dtype}", flush=True)
    # the training batch: the kv engine's fp32 samples of the RL batch
    prompts, sc = batches["rl"]
    samples = [s for g in common.KVEngine(model, tok).generate(prompts, sc) for s in g]
    tokens = sum(len(s.prompt_ids) + len(s.ids) for s in samples)
    train = {d: train_rate(model, tok, samples, d == "bf16", args.micro_batch, args.repeats)
             for d in DTYPES}
    for d in DTYPES:
        share = 6 * n * train[d] / (peak[d] * 1e9)
        print(f"train    {d}: {train[d]:7.0f} tokens/s = {tokens / train[d]:5.1f} s a step of "
              f"{len(samples)} sequences ({tokens:,} tokens, micro-batch {args.micro_batch}); "
              f"{100 * share:.0f}% of the {d} peak", flush=True)
    print(f"train    bf16/fp32 step time: {train['fp32'] / train['bf16']:.2f}")
    if not args.no_vllm and common.vllm_available():
        for dtype in DTYPES:
            cmd = [sys.executable, os.path.abspath(__file__), "--model", args.model,
                   "--max-new-tokens", str(args.max_new_tokens), "--repeats", str(args.repeats),
                   "--child", dtype] + (["--threads", str(args.threads)] if args.threads else [])
            proc = subprocess.run(cmd, capture_output=True, text=True)
            line = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")]
            if proc.returncode or not line:
                print(f"sample   vllm {dtype}: failed ({proc.stderr.strip()[-300:]})")
                continue
            results["vllm", dtype] = json.loads(line[0][len("RESULT "):])
    for (kind, dtype), r in results.items():
        cells = []
        for name in batches:
            rate = r[f"{name} tok/s"]
            share = 2 * n * rate / (peak[dtype] * 1e9)
            cells.append(f"{name} {rate:6.0f} tok/s ({100 * share:.1f}% of peak, "
                         f"{r[f'{name} length']:.0f} tokens per completion)")
        print(f"sample   {kind:4s} {dtype}: " + "; ".join(cells))
    for dtype in DTYPES:  # the kv engine's attention against the model's own
        own = f"kv, {model.config._attn_implementation}"
        ratio = results["kv", dtype]["rl tok/s"] / results[own, dtype]["rl tok/s"]
        print(f"attn     kv engine's attention / the model's own ({own}), {dtype}, RL batch: "
              f"{ratio:.2f}x tokens/s")
    for (kind, dtype), r in results.items():
        print(f"gap      {kind:4s} {dtype} sampler: fp32 trainer {r['gap fp32 trainer']:.1e}, "
              f"bf16 trainer {r['gap bf16 trainer']:.1e}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
