"""The one exception type the command line turns into a one-line message."""


class HarnessError(Exception):
    """A problem with the user's input or set-up, reported as one line without a traceback."""
