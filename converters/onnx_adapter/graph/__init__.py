"""ONNX graph analysis: every normalization of a whole graph, native or spelled as several nodes.

- `index`: producers, consumers, constants and shapes of one graph, for the matchers;
- `algebra`, `forms`, `moments`, `channels`, `match`: reading what a subgraph computes and
  reporting a `Match` (the recognizers in converters/recognizers/ call them, `patterns.find_matches`
  asks the recognizers in order);
- `sites`: the matches as `NormSite`s with their specs;
- `rewrite`: decompositions replaced by the native ops with their exact eps;
- `unfold`: a BatchNorm folded into a Conv kernel by the exporter, put back with the source model's kernels.
"""
