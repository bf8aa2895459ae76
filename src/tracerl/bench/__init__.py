"""Benchmarks behind `tracerl bench ...`: measured side by side in one run, printed as tables or JSON."""
