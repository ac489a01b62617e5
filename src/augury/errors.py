"""User-facing errors.

Anything a user can cause (a bad path, a corrupt file, a bad parameter) raises
`AuguryError` with a one-line message naming the problem. The CLI prints that
line and exits non-zero; the server turns it into a 4xx. Everything else is a
bug and keeps its traceback.
"""


class AuguryError(Exception):
    """A problem with the user's input or environment, explained in one line."""


class NoChatTemplateError(AuguryError):
    """Chat messages for a model whose files carry no chat template (each front end says what to do instead)."""
