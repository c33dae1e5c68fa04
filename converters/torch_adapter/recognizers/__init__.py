"""The stock torch recognizers, asked by converters.recognizers (which says what a recognizer is) in this order."""

#: Modules here holding a RECOGNIZER each, in the order they are asked: computed first, since a stock subclass with its
#: own forward computes what its forward says, not what its base class does.
STOCK_RECOGNIZERS = ("computed", "modules", "aten_ops")
