"""Output files written whole or not at all.

A new version of a file is written to a temporary file in the same directory,
flushed and synced to disk, then renamed over the target: readers see either
the previous file or the complete new one, never a truncated mix. A write that
fails (disk full, quota, file-size limit) or is interrupted removes the
temporary file and leaves the previous file as it was. Only regular files (or
new paths) are ever replaced; a device, a directory or a pipe at the path is
refused up front by :func:`check_target`, before any work is done.

Every problem raises :class:`~solvers.errors.InputError` naming the path.
"""
import gzip
import io
import os
import stat
import tempfile

from . import interrupts
from .errors import InputError


def _reason(exc):
    """The system's words for an OSError (``No space left on device``)."""
    if exc.strerror:
        return exc.strerror
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _resolve(path):
    """The file a write to ``path`` replaces: a symbolic link is followed, and kept."""
    return os.path.realpath(path) if os.path.islink(path) else os.path.abspath(path)


def check_target(path, what):
    """Raise :class:`InputError` unless ``path`` can be replaced by a new regular file.

    Parameters
    ----------
    path : str
        The output path as the user gave it.
    what : str
        What is written there ("solution", "JSON report", ...), for the message.
    """
    path = os.fspath(path)
    if not path or path.endswith(os.sep):
        raise InputError(f"not a file name for the {what}", path or "''")
    target = _resolve(path)
    try:
        st = os.stat(target)
    except FileNotFoundError:
        st = None
    except OSError as exc:
        raise InputError(f"cannot write {what} ({_reason(exc)})", path) from None
    if st is not None and not stat.S_ISREG(st.st_mode):
        kind = "a directory" if stat.S_ISDIR(st.st_mode) else "not a regular file"
        raise InputError(f"is {kind}; only regular files are replaced by the {what}", path)
    directory = os.path.dirname(target)
    if not os.path.isdir(directory):
        raise InputError(f"cannot write {what} (directory {directory} does not exist)", path)
    if not os.access(directory, os.W_OK | os.X_OK):
        raise InputError(f"cannot write {what} (directory {directory} is not writable)", path)


def _new_file_mode(existing):
    """The permission bits of the new file: those of the file it replaces, else the umask's."""
    if existing is not None:
        return stat.S_IMODE(existing.st_mode)
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask


class AtomicFile:
    """A new version of ``path``, written beside it and published by :meth:`commit`.

    Use as a context manager (commit at the end of the block, discard on an
    exception) or, for a file written over a long run, call :meth:`commit` or
    :meth:`discard` yourself.

    Parameters
    ----------
    path : str
    what : str
        What the file holds, for messages.
    text : bool
        ``stream`` takes ``str`` (UTF-8) instead of ``bytes``.
    compress : bool
        gzip the content.

    Attributes
    ----------
    stream : file object
        Where to write.
    """

    def __init__(self, path, what, *, text=False, compress=False):
        check_target(path, what)
        self.path, self.what = os.fspath(path), what
        self._target = _resolve(self.path)
        try:
            existing = os.stat(self._target)
        except FileNotFoundError:
            existing = None
        directory, name = os.path.split(self._target)
        try:
            fd, self._tmp = tempfile.mkstemp(prefix=f".{name}.", suffix=".tmp", dir=directory)
        except OSError as exc:
            raise InputError(f"cannot write {what} ({_reason(exc)})", self.path) from None
        self._raw = os.fdopen(fd, "wb")
        self._layers = []
        try:
            os.chmod(self._tmp, _new_file_mode(existing))
            stream = self._raw
            if compress:
                inner = name[:-3] if name.endswith(".gz") else name
                # no time stamp in the header: the same content gives the same bytes
                stream = gzip.GzipFile(filename=inner, mode="wb", fileobj=stream, mtime=0)
                self._layers.append(stream)
            if text:
                stream = io.TextIOWrapper(stream, encoding="utf-8", newline="\n")
                self._layers.append(stream)
        except BaseException as exc:
            self.discard()
            if isinstance(exc, OSError):
                raise self.error(exc) from None
            raise
        self.stream = stream

    def error(self, exc):
        """The :class:`InputError` to raise for the OSError ``exc`` met while writing."""
        return InputError(f"cannot write {self.what} ({_reason(exc)})", self.path)

    def commit(self):
        """Finish the file (compression trailer, flush, fsync) and rename it over ``path``."""
        try:
            for layer in reversed(self._layers):
                # text: flush only (closing it would close the file under it); gzip: close writes
                # the trailer and leaves the raw file open
                layer.flush() if isinstance(layer, io.TextIOWrapper) else layer.close()
            self._raw.flush()
            os.fsync(self._raw.fileno())
            self._raw.close()
            with interrupts.deferred():
                os.replace(self._tmp, self._target)
                self._tmp = None
            self._sync_directory()
        except BaseException as exc:
            self.discard()
            if isinstance(exc, OSError):
                raise self.error(exc) from None
            raise

    def _sync_directory(self):
        """Make the rename itself durable (best effort: not every file system allows it)."""
        try:
            fd = os.open(os.path.dirname(self._target), os.O_RDONLY)
        except OSError:
            return
        try:
            os.fsync(fd)
        except OSError:
            pass
        finally:
            os.close(fd)

    def discard(self):
        """Drop what was written; ``path`` stays as it was. Safe to call more than once."""
        for stream in (*reversed(self._layers), self._raw):
            try:
                stream.close()  # what is still buffered may fail to go out: it is dropped anyway
            except (OSError, ValueError):
                pass
        if self._tmp is not None:
            try:
                os.unlink(self._tmp)
            except FileNotFoundError:
                pass
            self._tmp = None

    def __enter__(self):
        return self.stream

    def __exit__(self, exc_type, exc, tb):
        if exc_type is None:
            self.commit()
            return False
        self.discard()
        if isinstance(exc, OSError):
            raise self.error(exc) from None
        return False
