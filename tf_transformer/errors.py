"""The one exception type for user mistakes.

Entry points catch :class:`UserError` and print its message on one line
(``error: ...``) instead of a traceback; everything else is a bug and keeps its
traceback.
"""

import functools
import sys


class UserError(Exception):
    """A mistake in the user's input: a file, a line, a key or a value.

    The message names what is at fault and what would be valid.
    """


def report_user_errors(main):
    """Decorates an entry point ``main(argv)``: a :class:`UserError` becomes one
    ``error: ...`` line on standard error and exit code 2."""

    @functools.wraps(main)
    def wrapper(argv=None):
        try:
            return main(argv) or 0
        except UserError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2

    return wrapper
