"""Graph engine: run one iteration body eagerly, as a relaunched graph, or in a WHILE node;
or, across ranks, graph segments with communication between them (:class:`SegmentDriver`).

The engine is generic: it knows bodies, not algorithms. A *body* is any callable
``launch(stream, loop)`` that enqueues one iteration of kernels on the CuPy
``stream``, working only on buffers allocated at setup. ``loop`` is a
:class:`LoopContext` that gives the body

* ``loop.handle``: the WHILE node's condition handle as ``numpy.uint64``, to be
  passed to the body's condition kernel, which calls ``cudaGraphSetConditional``
  when the handle is non-zero (it is zero outside ``while`` mode);
* ``loop.condition(name)`` and ``loop.if_then(name)``: an IF node inside the
  body (``while`` mode) or, in the other modes, a plain inline branch whose
  kernels must themselves return early when their device flag is clear.

Every body must be idempotent once finished: after its condition kernel has
recorded a stop reason, further iterations must change nothing. This is what
makes ``graph`` mode (k unrolled iterations per launch) and ``eager`` mode give
the same numbers as ``while`` mode.

Modes
-----
eager
    Plain kernel launches; the host checks ``done()`` every ``check_every``
    iterations.
graph
    ``unroll`` iterations captured once into a graph and relaunched; the host
    checks ``done()`` after each launch (one synchronisation per ``unroll``
    iterations).
while
    ``unroll`` iterations sit in the body of a WHILE conditional node: the
    whole run is one launch.
"""
import contextlib
import inspect
import time
import weakref
from typing import Any, Callable, NamedTuple

import numpy as np

from .backend import require_cupy

MODES = ("auto", "eager", "graph", "while")
# Conditional nodes need CUDA 12.4 in both the driver and the runtime.
_MIN_CONDITIONAL_VERSION = 12040


def conditional_nodes_supported():
    """True when the driver and the runtime both support WHILE/IF graph nodes."""
    cupy = require_cupy()
    rt = cupy.cuda.runtime
    return min(rt.driverGetVersion(), rt.runtimeGetVersion()) >= _MIN_CONDITIONAL_VERSION


def resolve_mode(mode):
    """Map ``auto`` to a concrete mode.

    Returns
    -------
    (str, str or None)
        The mode and a note explaining an automatic choice.
    """
    if mode not in MODES:
        raise ValueError(f"mode must be one of {', '.join(MODES)}, not {mode!r}")
    if mode != "auto":
        if mode == "while" and not conditional_nodes_supported():
            from .errors import DeviceError
            raise DeviceError("mode 'while' needs CUDA >= 12.4 (driver and runtime) for conditional graph nodes")
        return mode, None
    if conditional_nodes_supported():
        return "while", "auto: CUDA supports conditional nodes, using while"
    return "graph", "auto: CUDA < 12.4 has no conditional nodes, using graph"


def _core():
    """The ``cuda.core`` namespace holding ``Device`` (1.x or the older experimental one)."""
    try:
        from cuda import core
        core.Device  # noqa: B018 - raise AttributeError on 0.x
        return core
    except (ImportError, AttributeError):
        from cuda.core import experimental
        return experimental


class _StreamRef:
    """Expose a raw stream pointer through the ``__cuda_stream__`` protocol."""

    def __init__(self, ptr):
        self._ptr = int(ptr)

    def __cuda_stream__(self):
        return (0, self._ptr)


def _cupy_stream(builder):
    """A CuPy stream object that enqueues onto a cuda.core graph builder's capture stream."""
    cupy = require_cupy()
    from_external = getattr(cupy.cuda.Stream, "from_external", None)  # CuPy >= 14
    if from_external is not None:
        return from_external(builder)
    _, ptr = builder.__cuda_stream__()
    return cupy.cuda.ExternalStream(int(ptr))


class LoopContext:
    """What a body sees of the driver running it (see module docstring)."""

    def __init__(self, builder=None, handle=0):
        self._builder = builder          # cuda.core builder of the WHILE body, or None
        self.handle = np.uint64(handle)
        self._conditions = {}

    @property
    def conditional(self):
        """True when IF nodes are real graph nodes (``while`` mode)."""
        return self._builder is not None

    def condition(self, name):
        """Handle (``numpy.uint64``) of the IF condition ``name``; 0 outside ``while`` mode."""
        if self._builder is None:
            return np.uint64(0)
        if name not in self._conditions:
            self._conditions[name] = self._builder.create_condition(default_value=0)
        return np.uint64(int(self._conditions[name].handle))

    @contextlib.contextmanager
    def if_then(self, name, stream):
        """Yield the stream on which the branch ``name``'s kernels are launched.

        In ``while`` mode the kernels land in an IF node controlled by the
        condition ``name`` (set on the device by an earlier kernel of the body);
        elsewhere they are launched inline on ``stream``.
        """
        if self._builder is None:
            yield stream
            return
        if name not in self._conditions:
            raise RuntimeError(f"condition {name!r} must be created and set before its IF node")
        branch = self._builder.if_then(self._conditions[name]).begin_building()
        try:
            with _cupy_stream(branch) as inner:
                yield inner
        finally:
            branch.end_building()


def held_weakly(call):
    """``call``, or where it is a bound method, a callable that calls it through a weak reference to its object.

    An object that keeps an engine, or steps, made of its own methods then does not sit in a reference cycle
    with them: dropped, it frees its device buffers at once, not at Python's next cyclic collection.
    """
    if not inspect.ismethod(call):
        return call
    method, name = weakref.WeakMethod(call), call.__name__  # the closure must not hold `call` itself

    def weak(*args):
        bound = method()
        if bound is None:
            raise RuntimeError(f"the object whose method {name} this calls no longer exists")
        return bound(*args)
    return weak


class GraphEngine:
    """Drive one iteration body in ``eager``, ``graph`` or ``while`` mode.

    Parameters
    ----------
    body : callable
        ``body(stream, loop)`` enqueues one iteration (see module docstring). A bound
        method is called through a weak reference to its object (:func:`held_weakly`).
    mode : {"auto", "eager", "graph", "while"}
    unroll : int
        Iterations per graph launch in ``graph`` mode and per pass of the
        WHILE body in ``while`` mode.
    stream : cupy.cuda.Stream, optional
        Stream the runs are launched on; a new non-blocking stream by default.

    Attributes
    ----------
    mode : str
        The concrete mode.
    note : str or None
        Why ``auto`` chose ``mode``.
    instantiations : int
        How many executable graphs this engine has built (``graph``/``while``).
    build_time : float
        Seconds the last :meth:`run` spent capturing and instantiating its graph
        (0 when it reused one), so callers can time the iterations apart from it.
    """

    def __init__(self, body, mode="auto", unroll=1, stream=None):
        cupy = require_cupy()
        if unroll < 1:
            raise ValueError("unroll must be >= 1")
        self.body = held_weakly(body)
        self.mode, self.note = resolve_mode(mode)
        self.unroll = int(unroll)
        self.stream = stream if stream is not None else cupy.cuda.Stream(non_blocking=True)
        self.instantiations = 0
        self.build_time = 0.0
        self._graph = None
        self._core_stream = None

    # -- building ---------------------------------------------------------
    def _device(self):
        cupy = require_cupy()
        dev = _core().Device(cupy.cuda.Device().id)
        dev.set_current()
        return dev

    def _build(self):
        t0 = time.perf_counter()
        dev = self._device()
        builder = dev.create_graph_builder().begin_building("relaxed")
        if self.mode == "while":
            cond = builder.create_condition(default_value=1)
            body_builder = builder.while_loop(cond).begin_building("relaxed")
            with _cupy_stream(body_builder) as s:
                # k iterations per pass amortise the loop's own cost; passes after the stop are no-ops.
                # Each copy gets its own context: a condition handle may drive only one IF node.
                for _ in range(self.unroll):
                    self.body(s, LoopContext(body_builder, int(cond.handle)))
            body_builder.end_building()
        else:
            loop = LoopContext()
            with _cupy_stream(builder) as s:
                for _ in range(self.unroll):
                    self.body(s, loop)
        self._graph = builder.end_building().complete()
        self._core_stream = dev.create_stream(_StreamRef(self.stream.ptr))
        self.instantiations += 1
        self.build_time = time.perf_counter() - t0

    def invalidate(self):
        """Forget the captured graph (the body's buffers moved); the next run recaptures."""
        if self._graph is not None:
            self._graph.close()
        self._graph = None

    # -- running ----------------------------------------------------------
    def _wait(self, on_wait, poll_interval):
        if on_wait is None:
            self.stream.synchronize()
            return
        while not self.stream.done:
            on_wait()
            time.sleep(poll_interval)
        on_wait()

    def run(self, done, max_iterations, *, check_every=1, on_wait=None, poll_interval=0.1, eager=False):
        """Run the body until ``done()`` is true or ``max_iterations`` have been launched.

        Parameters
        ----------
        done : callable
            ``done() -> bool``, read on the host after the stream has been
            synchronised (typically the body's device status word).
        max_iterations : int
            Upper bound on iterations launched; the body's own condition must
            stop the device loop at the same bound in ``while`` mode.
        check_every : int
            Host checks in ``eager`` mode happen every this many iterations.
        on_wait : callable, optional
            Called about every ``poll_interval`` seconds while the host waits
            (e.g. to show progress from host-mapped memory).
        eager : bool
            Use plain launches for this run whatever the engine's mode (for
            callers that must see every iteration on the host).

        Returns
        -------
        int
            Number of launches made (kernel iterations in eager mode, graph launches otherwise).
        """
        self.build_time = 0.0
        if eager or self.mode == "eager":
            loop = LoopContext()
            launched = 0
            with self.stream:
                while launched < max_iterations:
                    steps = min(check_every, max_iterations - launched)
                    for _ in range(steps):
                        self.body(self.stream, loop)
                    launched += steps
                    self._wait(on_wait, poll_interval)
                    if done():
                        break
            return launched

        if self._graph is None:
            self._build()
        if self.mode == "while":
            self._graph.launch(self._core_stream)
            self._wait(on_wait, poll_interval)
            return 1
        launches = 0
        bound = -(-max_iterations // self.unroll)  # ceil: the host loop can never spin
        while launches < bound:
            self._graph.launch(self._core_stream)
            launches += 1
            self._wait(on_wait, poll_interval)
            if done():
                break
        return launches


# -- graph segments with communication between them --------------------------------------------
# NCCL calls cannot sit in a graph that has a conditional node, so an iteration across ranks is a
# list of steps: captured graphs of local work, and the host's communication calls between them.
class Segment(NamedTuple):
    """A captured graph of local kernels, launched on the main stream."""

    graph: Any


class Communicate(NamedTuple):
    """``call(stream)`` enqueues communication (an allreduce, an exchange) on the main stream."""

    call: Callable


class Overlap(NamedTuple):
    """On the side stream, once the main stream's work so far is done: ``graph`` (or None), then
    ``call(side_stream)``; it runs while the main stream goes on, until a :class:`Join`."""

    graph: Any
    call: Callable


class Join(NamedTuple):
    """The main stream waits for the side stream's last :class:`Overlap`."""


class SegmentDriver:
    """Enqueue iterations made of :class:`Segment`, :class:`Communicate`, :class:`Overlap` and :class:`Join` steps.

    The driver only enqueues: nothing here synchronises with the host, so a
    caller enqueues several iterations and reads its device status once. It
    knows graphs and streams, not what they compute.

    Parameters
    ----------
    stream : CuPy stream (or an object with the same methods)
        The main stream.
    event : callable
        Makes an event (``cupy.cuda.Event``); called with ``disable_timing=True``
        for ordering, plainly for timing.
    side_stream : CuPy stream, optional
        The stream :class:`Overlap` steps run on (iterations without them need none).
    """

    def __init__(self, stream, event, side_stream=None):
        self.stream, self.side_stream = stream, side_stream
        self._event = event
        self._ready = event(disable_timing=True)
        self._side_done = event(disable_timing=True)

    def capture(self, launch):
        """A plain graph of the kernels ``launch(stream)`` enqueues on the main stream."""
        s = self.stream
        s.begin_capture()
        try:
            launch(s)
        finally:
            graph = s.end_capture()
        return graph

    def timing_events(self, steps):
        """Enough timing events for :meth:`enqueue` of ``steps`` with timing."""
        return [self._event() for _ in range(2 + 2 * len(steps))]

    def enqueue(self, steps, events=None):
        """Enqueue ``steps``; with ``events`` (:meth:`timing_events`), time them on the main stream.

        Returns
        -------
        int
            Events recorded: the intervals between consecutive ones alternate
            local work and communication (a :class:`Communicate`, or the wait of a :class:`Join`).
        """
        s, side = self.stream, self.side_stream
        used = 0
        if events is not None:
            events[0].record(s)
            used = 1
        for step in steps:
            if isinstance(step, Segment):
                step.graph.launch(s)
                continue
            if isinstance(step, Overlap):
                if side is None:
                    raise ValueError("an Overlap step needs the driver's side stream")
                self._ready.record(s)
                side.wait_event(self._ready)
                if step.graph is not None:
                    step.graph.launch(side)
                step.call(side)
                self._side_done.record(side)
                continue
            if events is not None:
                events[used].record(s)
            if isinstance(step, Join):
                s.wait_event(self._side_done)
            else:
                step.call(s)
            if events is not None:
                events[used + 1].record(s)
                used += 2
        if events is not None:
            events[used].record(s)
            used += 1
        return used

    def join(self):
        """The main stream waits for the side stream's last :class:`Overlap` (before reusing its buffers)."""
        self.stream.wait_event(self._side_done)


class StatusCopies:
    """Copies of a small device array taken at points of a stream, for the host to read later.

    A driver that reads its device status only after queuing more work keeps the
    device busy while the host waits for the older copy and acts on it. Each copy
    goes to pinned host memory behind an event; up to ``slots`` may be outstanding
    (taking more reuses the oldest slot).

    Parameters
    ----------
    array : cupy.ndarray
        The device array (its buffer is copied; it must stay the same buffer).
    stream : cupy.cuda.Stream
        Where the copies are ordered.
    slots : int
        Copies that may be outstanding at once.
    """

    def __init__(self, array, stream, slots=2):
        cp = require_cupy()
        import cupyx
        self._array, self._stream = array, stream
        self._host = [cupyx.empty_pinned(array.shape, array.dtype) for _ in range(slots)]
        self._events = [cp.cuda.Event(disable_timing=True) for _ in range(slots)]
        self._next = 0

    def take(self):
        """Queue a copy of the array as the stream will have it here; returns the copy's ticket."""
        k = self._next
        self._next = (k + 1) % len(self._host)
        require_cupy().asnumpy(self._array, stream=self._stream, out=self._host[k], blocking=False)
        self._events[k].record(self._stream)
        return k

    def read(self, ticket):
        """The copy ``ticket`` (a NumPy array; waits until it is done)."""
        self._events[ticket].synchronize()
        return np.array(self._host[ticket])
