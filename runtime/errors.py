"""Exceptions raised by the capqr runtime."""

from __future__ import annotations


class CapqrError(Exception):
    """Base class of every capqr error.

    Picklable with its attributes whatever its constructor takes (an error raised in
    a worker process reaches the parent whole: pickle would call ``cls(*args)``, and
    the subclasses take other arguments than their message)."""

    def __reduce__(self) -> tuple:
        return _rebuild, (type(self), self.args, self.__dict__.copy())


def _rebuild(cls: type, args: tuple, state: dict) -> CapqrError:
    err = Exception.__new__(cls)
    err.args = args
    err.__dict__.update(state)
    return err


class VerifyError(CapqrError):
    """Kernel source rejected before compiling.

    Attributes: ``line`` (1-based source line, or None), ``construct`` (what was
    found, e.g. ``"pointer declarator"``) and ``reason`` (why it is unsafe).
    """

    def __init__(self, line: int | None, construct: str, reason: str, kernel: str | None = None):
        self.line = line
        self.construct = construct
        self.reason = reason
        self.kernel = kernel
        where = f"line {line}" if line is not None else "source"
        name = f"kernel {kernel!r}, " if kernel else ""
        super().__init__(f"{name}{where}: {construct}: {reason}")


class CompileError(CapqrError):
    """The C compiler rejected verified source (a capqr bug or an unsupported construct).

    Attributes: ``line`` (the kernel source line of the first error the compiler
    reported, or None) and ``compiler_output`` (the compiler's own text, unmapped;
    "" when there was none).
    """

    def __init__(self, message: str, *, line: int | None = None, compiler_output: str = ""):
        self.line = line
        self.compiler_output = compiler_output
        super().__init__(message)


class CapabilityFault(CapqrError):
    """A checked access was refused; it did not happen.

    Attributes: ``kernel``, ``block``, ``buffer`` (name), ``index`` (element
    index), ``access`` (``"load"``/``"store"``), ``reason`` (``"out-of-bounds"``,
    ``"read-only"``, ``"freed"``, ``"no-bounds"``, ``"local-array"``,
    ``"alloc"``, ``"division-by-zero"``, ``"type"`` (numbers through a cap table or
    slots through a number buffer), ``"lost"`` (a device buffer whose CUDA context was
    reset after a kernel did not stop)), ``line`` (kernel source line or None),
    ``thread`` (GPU only),
    ``launch_index`` (raised by ``runtime.sync()``: the faulting launch's position in the
    sequence since the previous sync, 0-based; None for a synchronous launch).
    """

    def __init__(
        self,
        reason: str,
        *,
        kernel: str | None = None,
        block: int | None = None,
        buffer: str | None = None,
        index: int | None = None,
        access: str | None = None,
        line: int | None = None,
        thread: int | None = None,
        detail: str = "",
        launch_index: int | None = None,
    ):
        self.reason = reason
        self.kernel = kernel
        self.block = block
        self.buffer = buffer
        self.index = index
        self.access = access
        self.line = line
        self.thread = thread
        self.launch_index = launch_index
        what = ""
        if access and buffer is not None and index is not None:
            what = f"{access} of {buffer!r}[{index}]"
        elif access and buffer is not None:
            what = f"{access} of {buffer!r}"
        elif buffer is not None:
            what = f"buffer {buffer!r}"
        where = ""
        if kernel:
            where = f"in kernel {kernel!r}"
            if block is not None:
                where += f" block {block}"
            if thread is not None:
                where += f" thread {thread}"
            if line:
                where += f" (line {line})"
            if launch_index is not None:
                where += f", launch {launch_index} of the sequence"
        msg = ", ".join(x for x in (what, where, detail) if x)
        super().__init__(f"{reason}: {msg}" if msg else reason)


class KernelTimeout(CapqrError):
    """The launch deadline passed; blocks stopped at their next pollcheck.

    A GPU kernel that had not stopped when the grace after the deadline ran out (a
    barrier or shuffle that some threads never reach, a raw kernel without pollchecks)
    can only be ended by ending the process that owns its CUDA context:

    - ``context_reset`` (the isolated lane, ``CAPQR_CUDA_ISOLATE=1``): the lane restarted
      its device process; every device buffer allocated before is lost (any use raises
      ``CapabilityFault("lost")``) and kernels load again on their next launch.
    - ``stuck`` (the direct lane): the kernel still runs in this process's context, which
      the driver cannot reset while it runs; every later GPU call raises
      :class:`DeviceStuck` until the kernel ends."""

    def __init__(self, kernel: str, timeout: float, blocks_done: int | None = None, *,
                 context_reset: bool = False, stuck: bool = False, grace: float = 0.0):
        self.kernel = kernel
        self.timeout = timeout
        self.blocks_done = blocks_done
        self.context_reset = context_reset
        self.stuck = stuck
        msg = f"kernel {kernel!r} exceeded its timeout of {timeout:g} s"
        if context_reset or stuck:
            msg += (f" and was still running {grace:g} s after it was cancelled (a barrier "
                    "or shuffle some threads never reach, or a kernel without pollchecks)")
        if context_reset:
            msg += (": the lane restarted its device process to stop it; every device "
                    "buffer allocated before is lost (any use raises CapabilityFault "
                    "'lost'), kernels load again at their next launch")
        elif stuck:
            msg += (": " + STUCK_ADVICE)
        super().__init__(msg)


#: why a stuck kernel cannot be ended in the direct lane, and what to do
STUCK_ADVICE = ("the CUDA driver cannot reset a context while one of its kernels runs, so "
                "no GPU work can run in this process until that kernel ends; run GPU work "
                "with CAPQR_CUDA_ISOLATE=1 (or runtime.cuda.isolate() before the first GPU "
                "call) so the lane can end such a kernel by restarting its device process")


class DeviceStuck(CapqrError):
    """A GPU call in the direct lane while a kernel that ignored its cancel still runs
    (see :class:`KernelTimeout`, ``stuck``)."""

    def __init__(self, kernel: str):
        self.kernel = kernel
        super().__init__(f"the GPU is still running {kernel!r}, which ignored its cancel: "
                         + STUCK_ADVICE)


def fault_detail(reason: str, index: int | None) -> str:
    """The explanation both lanes attach to a fault of kind ``reason``."""
    if reason == "local-array":
        return "local array index outside its declared size"
    if reason == "type":
        return "cap tables hold capabilities: use cap_load_cap/cap_store_cap, aligned slots"
    if reason == "division-by-zero":
        return "integer division or remainder by zero"
    if reason == "alloc":
        return f"cap_alloc of {index} elements refused"
    if reason == "argument":
        return ("a warp MMA (rt_warp_mma_tf32/_f32) needs a full warp whose lanes agree on "
                "its arguments, k a positive multiple of 8, tile offsets that are multiples "
                "of 8 and strides that are multiples of 4 and at least the tile's width "
                "(index: the argument's position, 0: the warp)")
    return ""
