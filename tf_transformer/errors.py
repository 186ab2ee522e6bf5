"""The one exception type for user mistakes.

Entry points catch :class:`UserError` and print its message on one line
(``error: ...``) instead of a traceback; everything else is a bug and keeps its
traceback.
"""


class UserError(Exception):
    """A mistake in the user's input: a file, a line, a key or a value.

    The message names what is at fault and what would be valid.
    """
