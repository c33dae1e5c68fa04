"""Serving: exporting a model to ONNX with every normalization verified (`export`), the serving contract
(`contract`: the ONNX file computes what the source computes in eval mode, batch-independently), and the
inputs both replay (`samples`).
"""
