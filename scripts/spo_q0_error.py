"""How many samples of pi_0 spo.py's Monte-Carlo Q0_hat needs: its error against the sample count.

[SPO] Cohen et al., "Soft Policy Optimization: Online Off-Policy RL for Sequence Models", 2025,
arXiv:2503.05453, §3.1.3: Q0(x) = beta log(S0 + (1 - S0) e^{-1/beta}), S0 = pi_0's success rate
on x, estimated from N samples (the paper: 800; spo.py: --q0-samples 64).

    python scripts/spo_q0_error.py runs/spo-countdown-TIME/q0.jsonl [--beta B] [--samples 4,...]

Takes each prompt's success rate in a q0.jsonl cache (a spo.py run's) as the truth p, and computes
exactly, with S ~ Binomial(N, p), the mean over prompts of |Q0_hat - Q0| and of Q0_hat - Q0 (a
concave function of S/N: biased low), and the share of prompts with S = 0, whose Q0_hat is -1 (as if
pi_0 never solved them). The cost of N is N samples per prompt, linear in N.
"""
import argparse
import json
import math
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import spo  # noqa: E402


def q0(s0: np.ndarray, beta: float) -> np.ndarray:
    """spo.q0_from_successes on success rates."""
    return beta * np.log(s0 + (1 - s0) * math.exp(-1 / beta))


def binomial_pmf(n: int, p: float) -> np.ndarray:
    """P(S = k), k = 0..n, computed in log space (no overflow at n = 800)."""
    k = np.arange(n + 1)
    if p <= 0 or p >= 1:
        return (k == round(p * n)).astype(float)
    logc = np.array([math.lgamma(n + 1) - math.lgamma(i + 1) - math.lgamma(n - i + 1) for i in k])
    return np.exp(logc + k * np.log(p) + (n - k) * np.log1p(-p))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("cache", help="a spo.py run's q0.jsonl")
    p.add_argument("--beta", type=float, default=spo.BETA, help="spo.py's default, the paper's")
    p.add_argument("--samples", default="4,8,16,32,64,128,256,800")
    args = p.parse_args()
    rows = [json.loads(line) for line in open(args.cache)]
    rates = np.array([r["successes"] / r["samples"] for r in rows])
    print(f"{len(rates)} prompts from {args.cache} ({rows[0]['samples']} samples each, taken as "
          f"the truth); beta {args.beta:.4f}; mean success rate {rates.mean():.3f}")
    print("\n| samples N | mean abs error of Q0_hat | mean bias | prompts with S = 0 |")
    print("|---|---|---|---|")
    for n in map(int, args.samples.split(",")):
        err, bias, zero = [], [], []
        for rate in rates:
            pmf = binomial_pmf(n, rate)
            est = q0(np.arange(n + 1) / n, args.beta) - q0(np.array(rate), args.beta)
            err.append((pmf * np.abs(est)).sum())
            bias.append((pmf * est).sum())
            zero.append(pmf[0])
        print(f"| {n} | {np.mean(err):.4f} | {np.mean(bias):+.4f} | {100 * np.mean(zero):.1f}% |")


if __name__ == "__main__":
    main()
