"""Whole models, framework-neutral: every framework-specific step is a call to the model's adapter
(converters/model_adapter.py, one per framework package).

- `loading`: model files without executing code (`file_headers`: a file refused from its first bytes);
  `walking`: a model's normalization layers;
- `inspection`, `hazards`: every layer with its spec, mode, statistics and hazards;
- `porting`: normalization state between twin models; `artifact`: what the registry stores of a model;
- `serving/`: export for serving (`export`), the serving contract (`contract`), the inputs both replay (`samples`);
- `monitoring/`: drift against the running statistics (`drift`), recalibration (`recalibration`).

This package imports none of the frameworks itself.
"""
