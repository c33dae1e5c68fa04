"""The stock Keras recognizers, asked by converters.recognizers (which says what a recognizer is) in this order."""

#: Modules here holding a RECOGNIZER each, in the order they are asked: the behavioural probe last, after the stock
#: classes and the refused standardisation, so it never guesses at a layer those know.
STOCK_RECOGNIZERS = ("layers", "standardization", "probed")
