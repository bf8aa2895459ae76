"""tracerl.io: what the algorithm meets outside itself, with no torch; five rooms, by what they hold.

- `files`: what tracerl reads and writes: text and nesting (`tracerl.io.files` itself), typed configs, prompt rows,
  a run's folder, its metrics and trees, state files, and the checks for numbers and key listings from a peer;
- `sandbox`: model-written Python run under every isolation layer (`tracerl.io.sandbox.run_python`), stdlib only;
- `env`: the environment protocol (`tracerl.io.env` itself), tool calls, the one runner for a user's code, rewards,
  and a user's own task (`tracerl.io.env.task`, from Python or verl's files);
- `domains`: the built-in domains (multihop with its BM25 search, math, funcall, bfcl) and their registry;
- `rollout`: the engine protocol and the scripted engine, chat rendering and tokenizer training, and the ReAct
  driver, the only code that tokenizes.

A room imports only itself and the rooms before it: files and sandbox import no other room, env imports files,
domains and rollout import env and files (domains the sandbox too); `tests/unit/test_layers.py` checks it.
"""
