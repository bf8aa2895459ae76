"""Adapters that plug tracerl into trainers other than its own.

- `tracerl.integrations.verl`: a TRACE agent-loop manager and worker for verl's V1 trainer (needs the `verl` extra,
  in its own environment: verl pins transformers below 5.11).

Nothing here is imported by the rest of tracerl; importing this package imports no trainer.
"""
