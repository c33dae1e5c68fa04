"""Serving: exporting a model to ONNX with every normalization verified (`export`; `verification` pairs graph
sites with source layers, `opset` holds the graph to the asked opset, `source_hazards` repeats what `inspect`
finds), the serving contract (`contract`: the ONNX file computes what the source computes in eval mode,
batch-independently; `diagnosis` names the layer and setting behind a differing output), and the inputs both
replay (`samples`).
"""
