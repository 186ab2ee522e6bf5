"""The one exception type for user mistakes.

Entry points catch :class:`UserError` and print its message on one line
(``error: ...``) instead of a traceback; everything else is a bug and keeps its
traceback.
"""

import functools
import signal
import sys

# What a shell reports for a process ended by Ctrl-C.
INTERRUPTED_EXIT_CODE = 128 + signal.SIGINT


class UserError(Exception):
    """A mistake in the user's input: a file, a line, a key or a value.

    The message names what is at fault and what would be valid.
    """


def report_user_errors(main):
    """Decorates an entry point ``main(argv)``: a :class:`UserError` becomes one
    ``error: ...`` line on standard error and exit code 2; Ctrl-C that reaches it
    (``KeyboardInterrupt``) one ``interrupted`` line and exit code 130 (128 + SIGINT)."""

    @functools.wraps(main)
    def wrapper(argv=None):
        try:
            return main(argv) or 0
        except UserError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        except KeyboardInterrupt:
            print("interrupted: stopped by SIGINT (Ctrl-C); files already written are complete", file=sys.stderr)
            return INTERRUPTED_EXIT_CODE

    return wrapper


def first_line(error):
    """The first line of an exception's message (its type's name when empty)."""
    return (str(error).strip().splitlines() or [type(error).__name__])[0]
