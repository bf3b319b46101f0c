"""Generation throughput of each engine on the same model and the same batch, measured in one run.

    python scripts/bench_generation.py                        # the tiny model, random weights
    python scripts/bench_generation.py --model runs/sft-countdown-.../final   # a trained model

Prints completion tokens per second for our KV loop (common.KVEngine), HF generate and vLLM (when
installed), sampled at temperature 1 and greedy, and each engine's ratio to HF generate. The
kv and hf engines take turns, repeat after repeat, so that a slower moment of a shared machine
falls on both; the best repeat is kept. vLLM is measured after them: once started in this process,
its CPU engine binds the threads (kv ran ~25% slower beside it). Engine start-up is reported
apart, not in the rates.
"""
import argparse
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import common  # noqa: E402
from tasks import get_task  # noqa: E402


def timed(engine, prompts, sc):
    t = time.perf_counter()
    groups = engine.generate(prompts, sc)
    return sum(len(s.ids) for g in groups for s in g), time.perf_counter() - t


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="tiny")
    p.add_argument("--task", default="countdown")
    p.add_argument("--prompts", type=common.positive_int, default=200)
    p.add_argument("--group-size", type=common.positive_int, default=8, help="samples a prompt")
    p.add_argument("--max-new-tokens", type=common.positive_int, default=64)
    p.add_argument("--repeats", type=common.positive_int, default=3,
                   help="timed repeats (best is kept)")
    p.add_argument("--threads", type=common.positive_int, default=None)
    args = p.parse_args()
    common.setup(0, args.threads)
    try:
        path = common.resolve_model_path(args.model, tempfile.mkdtemp())
        model, tok = common.load_model(
            path, device="cuda" if common.torch.cuda.is_available() else "cpu")
        task = get_task(args.task)
    except ValueError as e:  # UsageError is one
        p.error(str(e))
    problems = task.get_problems("test", args.prompts, size=3)
    prompts = common.encode_prompts(task, problems, tok, common.prompt_style(model, tok))

    modes = {"sampled": common.SamplingConfig(args.group_size, args.max_new_tokens, 1.0, seed=0),
             "greedy": common.SamplingConfig(1, args.max_new_tokens, 0.0)}
    best, tokens = {}, {}

    def measure(engines: dict) -> None:  # the engines take turns, repeat after repeat
        started = {}
        for name, make in engines.items():
            t = time.perf_counter()
            started[name] = make()
            print(f"{name:5s} engine start {time.perf_counter() - t:.1f}s")
            for sc in modes.values():
                started[name].generate(prompts[:8], sc)  # warm-up
        for _ in range(args.repeats):
            for key in [(name, mode) for mode in modes for name in engines]:
                tokens[key], seconds = timed(started[key[0]], prompts, modes[key[1]])
                best[key] = min(best.get(key, float("inf")), seconds)
        for engine in started.values():
            engine.close()

    measure({"kv": lambda: common.KVEngine(model, tok), "hf": lambda: common.HFEngine(model, tok)})
    if common.vllm_available():  # last: its CPU engine binds this process's threads for good
        measure({"vllm": lambda: common.VLLMEngine(path, tok,
                                                   dtype=str(model.dtype).split(".")[-1])})
    else:
        print("vLLM is not installed: it is not measured")
    engines = sorted({name for name, _ in best}, key=["kv", "hf", "vllm"].index)
    rate = {key: tokens[key] / seconds for key, seconds in best.items()}
    for (name, mode), seconds in best.items():
        print(f"{name:5s} {mode:8s} {tokens[name, mode]:7d} tokens in {seconds:6.2f}s = "
              f"{rate[name, mode]:9.0f} tok/s")
    print(f"\nmodel {args.model}: {common.count_parameters(model) / 1e6:.2f}M parameters, "
          f"{args.prompts} prompts x n={args.group_size}, max {args.max_new_tokens} new tokens, "
          f"{common.torch.get_num_threads()} torch thread(s)")
    for mode in modes:
        line = "  ".join(f"{name}/hf = {rate[name, mode] / rate['hf', mode]:.2f}x"
                         for name in engines)
        print(f"ratio {mode:8s} {line}")


if __name__ == "__main__":
    main()
