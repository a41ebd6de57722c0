"""The recipe's command line: argument dataclasses by group (model, data, engine, reliability, regularization,
streaming), parsing of flags and .yaml/.json files (`parse`), and the checks across groups (`checks`)."""
