"""One error type for bad user input, so recipes can print one clear message and exit non-zero."""


class UserInputError(ValueError):
    """Bad input from the user: the message names the flag or file and says how to fix it."""
