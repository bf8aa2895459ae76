"""Is an embedded build's weights hash the same on another machine, and under another build thread count?

`tracerl.policy.embedded` builds on one torch thread so that a config names one set of weights on one machine; its
docstring says the weights may still depend on the machine and the torch version. This script builds one config
into a fresh cache and prints what a comparison needs: the weights hash, the build's seconds, its held-out success,
torch's version and the CPU. Run it on two machines with the same config and compare the hashes.

    python benchmarks/gpu/build_portability.py --config CACHE/<key>/embedded_config.json --out headroom.json
    python benchmarks/gpu/build_portability.py --config CACHE/<key>/embedded_config.json --sft-steps 200 \
        --build-threads 16 --out headroom-200-16.json

`--config small` is the 30-step config of the embedded tests (a few seconds); a path is a build's
`embedded_config.json`. `--build-threads N` replaces BUILD_THREADS for this build, to see whether a thread count
changes the weights on this machine (the reason the build pins one); `--sft-steps N` shortens the build. It runs on
the CPU only.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

SMALL = dict(num_entities=40, num_distractors=8, hops=[2, 3], num_train_rows=48, p_noise_turn=0.3,
             unanswerable_share=0.0, vocab_size=400, hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1,
             sft_steps=30, batch_size=4, lr=1e-2, num_eval_prompts=4, eval_samples_per_prompt=2)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--config", required=True, help="'small' or a build's embedded_config.json")
    parser.add_argument("--build-threads", type=int, default=0, help="torch threads of the build (0: BUILD_THREADS)")
    parser.add_argument("--sft-steps", type=int, default=0, help="a shorter build than the config's (0: its own)")
    parser.add_argument("--out", required=True, help="the JSON result")
    args = parser.parse_args()

    from tracerl.policy import embedded
    from tracerl.policy.embedded import EmbeddedConfig, build_embedded, machine_description

    data = SMALL if args.config == "small" else json.loads(Path(args.config).read_text())
    config = EmbeddedConfig.from_dict({**data, **({"sft_steps": args.sft_steps} if args.sft_steps else {})})
    if args.build_threads:
        embedded.BUILD_THREADS = args.build_threads
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as cache:
        policy = build_embedded(config, cache, progress=lambda m: print(m, file=sys.stderr, flush=True))
        metrics = json.loads((policy.path / "metrics.json").read_text())
    result = {"config": args.config, "key": config.key(), "build_threads": embedded.BUILD_THREADS,
              "weights_sha256": metrics["build/weights_sha256"], "seconds": round(time.perf_counter() - start, 1),
              "eval/success": metrics.get("eval/success"), "sft_loss_last": metrics["train/sft_loss_curve"][-1],
              **machine_description()}
    Path(args.out).write_text(json.dumps(result, indent=1))
    print(json.dumps(result))


if __name__ == "__main__":
    main()
