"""Exceptions shared by every solver family.

CLIs turn :class:`InputError` into a one-line message and exit code 2, and
:class:`DeviceError` into a one-line message and exit code 2 as well: both mean
the run could not start, never that a solve failed.
"""


class InputError(ValueError):
    """Bad user input: a file, a parameter or a combination of them.

    Parameters
    ----------
    message : str
        What is wrong, in one line.
    source : str, optional
        The file (or parameter) at fault; prefixed to the message.
    """

    def __init__(self, message, source=None):
        self.source = source
        self.problem = message
        super().__init__(f"{source}: {message}" if source else message)

    def naming(self, source):
        """This error, or the same problem attributed to ``source`` when it names no source yet."""
        return self if self.source else InputError(self.problem, source)


class DeviceError(RuntimeError):
    """The requested device cannot be used (no GPU, no CuPy, out of memory)."""
