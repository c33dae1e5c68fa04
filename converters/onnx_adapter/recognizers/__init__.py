"""The stock ONNX recognizers, asked by converters.recognizers (which says what a recognizer is) in this order."""

#: Modules here holding a RECOGNIZER each, in the order they are asked: the node recognizer, then the graph recognizers,
#: the more specific spellings first, so they claim their nodes before a native node inside them (torch.onnx's grouped
#: InstanceNormalization) is read alone.
STOCK_RECOGNIZERS = ("ops", "grouped_instance_norm", "moments", "native_nodes", "folded_batchnorm")
