"""Adapters that plug tracerl into trainers other than its own.

- `tracerl.integrations.verl`: a TRACE agent-loop manager and worker for verl's V1 trainer (needs the `verl` extra,
  in its own environment: verl pins transformers below 5.11).
- `tracerl.integrations.verl_plugin`: what verl itself loads in every process when `VERL_USE_EXTERNAL_MODULES` names
  it: a trainer mode that logs TRACE's metrics, a transformers rollout server and a CPU platform, so verl's own
  `main_ppo` runs TRACE on a machine without an accelerator.

Nothing here is imported by the rest of tracerl; importing this package imports no trainer.
"""
