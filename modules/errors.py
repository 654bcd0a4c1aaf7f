"""One exception type for every problem a user can fix (bad file, bad field, damaged index).

The command line turns it into a one-line message and a non-zero exit; anything else is a bug.
"""


class HyperProveError(Exception):
    """A user-fixable problem; the message names the file/field and what is wrong."""


class UnrecordedCall(BaseException):
    """A replayed run asked the LM something its record of LM calls does not hold.

    A BaseException, as KeyboardInterrupt is: the run must stop here, and the program's own
    fallbacks (a failed step retried, a question's error kept in its row) would otherwise turn
    the miss into a quietly different answer. The command line prints it as one line."""


def first_line(error: BaseException, limit: int = 200) -> str:
    """The first line of a third-party error's message, cut to `limit` characters: enough to
    name the problem in a one-line error without pasting a library's multi-line report."""
    return (str(error).strip().splitlines() or [""])[0][:limit]
