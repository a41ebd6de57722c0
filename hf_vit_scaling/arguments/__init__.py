"""The recipe's command line: argument dataclasses by group, parsing (yaml/json files and flags), and the checks across groups."""
