"""One exception type for every problem a user can fix (bad file, bad field, damaged index).

The command line turns it into a one-line message and a non-zero exit; anything else is a bug.
"""


class HyperProveError(Exception):
    """A user-fixable problem; the message names the file/field and what is wrong."""


def first_line(error: BaseException, limit: int = 200) -> str:
    """The first line of a third-party error's message, cut to `limit` characters: enough to
    name the problem in a one-line error without pasting a library's multi-line report."""
    return (str(error).strip().splitlines() or [""])[0][:limit]
