"""One exception type for every problem a user can fix (bad file, bad field, damaged index).

The command line turns it into a one-line message and a non-zero exit; anything else is a bug.
"""


class HyperProveError(Exception):
    """A user-fixable problem; the message names the file/field and what is wrong."""
