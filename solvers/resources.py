"""Memory a run may take, checked before it is allocated.

Sizes come from file headers and options; the estimate of what a run needs
is compared with what this process can still get (the host's available
memory, bounded by a cgroup limit and by ``RLIMIT_AS``; on the GPU, the free
device memory), and a run that cannot fit is refused in one line that says
how much it would need instead of failing minutes later.
"""
import os
import resource

from .errors import DeviceError, InputError

_UNITS = ("bytes", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB")


def format_bytes(n):
    """``n`` bytes in binary units (``7.5 GiB``)."""
    n = float(n)
    for unit in _UNITS:
        if n < 1024 or unit == _UNITS[-1]:
            return f"{n:.0f} {unit}" if unit == "bytes" else f"{n:.3g} {unit}"
        n /= 1024


def _read_int(path):
    try:
        with open(path) as f:
            text = f.read().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def _meminfo_available():
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def _cgroup_available():
    limit, used = _read_int("/sys/fs/cgroup/memory.max"), _read_int("/sys/fs/cgroup/memory.current")
    if limit is None:  # cgroup v1
        limit = _read_int("/sys/fs/cgroup/memory/memory.limit_in_bytes")
        used = _read_int("/sys/fs/cgroup/memory/memory.usage_in_bytes")
    if limit is None or used is None or limit >= 1 << 60:  # v1 spells "no limit" as a huge number
        return None
    return max(limit - used, 0)


def _address_space_available():
    limit = resource.getrlimit(resource.RLIMIT_AS)[0]
    if limit == resource.RLIM_INFINITY:
        return None
    try:
        with open("/proc/self/statm") as f:
            size = int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        size = 0
    return max(limit - size, 0)


def available_host_memory():
    """Bytes this process can still allocate on the host, or None when unknown."""
    known = [v for v in (_meminfo_available(), _cgroup_available(), _address_space_available()) if v is not None]
    return min(known) if known else None


def require_host_memory(nbytes, what, source=None):
    """Raise :class:`InputError` when ``what`` (needing about ``nbytes``) cannot fit in host memory.

    Parameters
    ----------
    nbytes : int
        Estimated bytes.
    what : str
        The work that needs them, for the message ("reading a 10 x 10 matrix ...").
    source : str, optional
        The file or option at fault.
    """
    available = available_host_memory()
    if available is not None and nbytes > available:
        raise InputError(f"{what} would need about {format_bytes(nbytes)} of memory, but only "
                         f"{format_bytes(available)} is available", source)


def require_device_memory(nbytes, what, source=None):
    """Raise :class:`DeviceError` when ``what`` cannot fit in the current GPU's free memory."""
    from .backend import require_cupy
    free = require_cupy().cuda.runtime.memGetInfo()[0]
    if nbytes > free:
        raise DeviceError(f"{source + ': ' if source else ''}{what} would need about {format_bytes(nbytes)} of "
                          f"GPU memory, but only {format_bytes(free)} is free")
