"""Helpers the tests and the benchmarks share: twin models built in code (`model_zoo`),
servers in child processes (`processes`).

A package of its own because `bench/` may not import `tests` (tests/test_layering.py); nothing
shipped (schemas, converters, registry, cli) imports it.
"""
