"""A toy kind and a toy framework, each added from these files alone (tests/converters/test_toy_additions.py).

`scalenorm_kind.py` and `scalenorm_reference.py` are a sixth kind, ScaleNorm (y = scale * x / max(||x||_2, eps) over
the last axis), with no native ONNX op and no stock class in any framework. `toynp/` is a pure-NumPy "framework"
(a top-level package once this folder is on sys.path, as torch is), and `toynp_adapter/` its adapter package, holding
a LayerNorm and a ScaleNorm adapter. Nothing in the source tree names either.
"""
