"""Peak memory of one trainer micro-batch's log-prob forward and backward, at Qwen2.5-0.5B's width
and vocabulary, on this machine's CPU:

    python scripts/bench_memory.py                         # 2 completions x 512 tokens, 2 layers
    python scripts/bench_memory.py --layers 4 --tokens 256

A Qwen2 model with hidden 896, intermediate 4864, 14 heads, 2 KV heads, vocab 151,936, tied
embeddings and --layers layers (random weights) scores --completions completions of --tokens tokens
after a 64-token prompt, with the sequence log-prob's gradient, twice; each method runs in a fresh
process. The second pass is measured, as a micro-batch of a training loop, where the weights'
gradients already exist: its peak resident memory above the moment before its forward pass
(Linux VmHWM, reset), beside the bytes of the fp32 completion logits [B, C, V] themselves:
  full      the whole [B, C, V] logits, a temperature copy and their log-softmax kept for backward
            (completion_logprobs before the output layer was chunked; kept here as the baseline)
  chunked   common.completion_logprobs: the output layer and log-softmax in fp32 chunks of the
            completion tokens, each recomputed in backward
  chunked+bf16  the same with --bf16 (the transformer under bf16 autocast)
"""
import argparse
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "tests"))

METHODS = ("full", "chunked", "chunked+bf16")


def rss() -> int:
    """Resident bytes now (Linux)."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def reset_peak() -> None:
    """Linux: the peak resident memory (VmHWM) starts again from now."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def peak_rss() -> int:
    with open("/proc/self/status") as f:
        line = next(x for x in f if x.startswith("VmHWM:"))
    return int(line.split()[1]) * 1024


def measure(method: str, args) -> dict:
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    import common
    torch.manual_seed(0)
    torch.set_num_threads(args.threads)
    from hub_standin import QWEN_05B
    config = Qwen2Config(vocab_size=QWEN_05B["vocab_size"], hidden_size=QWEN_05B["hidden_size"],
                         intermediate_size=QWEN_05B["intermediate_size"],
                         num_hidden_layers=args.layers, num_attention_heads=QWEN_05B["heads"],
                         num_key_value_heads=2, tie_word_embeddings=True,
                         max_position_embeddings=QWEN_05B["max_positions"])
    model = Qwen2ForCausalLM(config).float().train()
    prompts = [list(range(100, 164))] * args.completions
    completions = [torch.randint(200, 150000, (args.tokens,)).tolist()
                   for _ in range(args.completions)]

    def log_probs():
        if method == "full":  # the pre-chunking completion_logprobs
            ids, attn, pos, mask, P = common.pad_batch(prompts, completions, 0)
            logits = model(input_ids=ids, attention_mask=attn, position_ids=pos,
                           logits_to_keep=args.tokens + 1).logits
            logits = logits[:, :-1].float() / 1.0
            logp = torch.log_softmax(logits, -1).gather(-1, ids[:, P:, None]).squeeze(-1)
            return logp * mask, mask
        return common.completion_logprobs(model, prompts, completions, 0,
                                          bf16=method.endswith("bf16"))

    # a micro-batch as in a training loop: the weights' gradients exist already (a first pass)
    for measured in (False, True):
        model.zero_grad(set_to_none=False)
        reset_peak()
        start = rss()
        logp, mask = log_probs()
        (logp * mask).sum().backward()
        del logp, mask
    return {"peak": peak_rss() - start}


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--completions", type=int, default=2)
    p.add_argument("--tokens", type=int, default=512)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--method", choices=METHODS, help=argparse.SUPPRESS)  # the child process
    args = p.parse_args()
    if args.method:
        print(json.dumps(measure(args.method, args)))
        return
    logits = args.completions * args.tokens * 151936 * 4
    print(f"{args.completions} completions x {args.tokens} tokens, {args.layers} layers, hidden "
          f"896, vocab 151,936: fp32 completion logits {logits / 2**20:,.0f} MiB")
    for method in METHODS:
        out = subprocess.run([sys.executable, __file__, "--method", method, *sys.argv[1:]],
                             capture_output=True, text=True, check=True)
        peak = json.loads(out.stdout.strip().splitlines()[-1])["peak"]
        print(f"{method:13s} peak {peak / 2**20:7,.0f} MiB above the start = "
              f"{peak / logits:.2f}x the logits")


if __name__ == "__main__":
    main()
