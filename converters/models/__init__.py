"""Whole models: loading them safely, finding their normalization layers, and the model-level tools
(inspection, porting state between twins, export for serving, contract tests, drift, recalibration).

Each tool lives in its own module; this package imports none of the frameworks itself.
"""
