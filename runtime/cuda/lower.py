"""Verified dialect AST -> CUDA C, with capability checks (or raw pointers for the baseline).

What the transformation does (pycparser AST in, CGenerator text out):

* ``cap_load_T(c, i)`` / ``cap_store_T(c, i, v)`` become inline device
  accessors ``rt_load_T(c, i, LINE)`` / ``rt_store_T(c, i, v, LINE)`` that
  compare the index against the by-value bounds of ``c`` (two compares, all in
  registers) before touching memory.  ``cap_len_T``, ``cap_offset_T``,
  ``cap_to_int``, ``cap_from_int`` and the ``rt_*`` intrinsics map to inline
  helpers; the element size is folded in at generation time.
* Subscripts of local arrays (``smem_*`` arrays live in ``__shared__``
  memory, the others per thread) are wrapped in ``rt_local_idx(i, N, ID, LINE)``.
* Each loop condition gets a clocked pollcheck ``RT_POLL(__rt_pc)`` (a clock
  read and one test per iteration; the sequence record's cancel and fault flags
  are read once RT_POLL_CYCLES have passed since the thread's last read), so a
  launch past its deadline can be cancelled and the blocks of a faulted launch
  stop early.  Every function that calls a same-source function polls at its
  entry (hoist.entry_polls: a DAG of loop-free helpers reaches the record too):
  in checked mode the clock of the last read is the thread's one ``unsigned
  int``, declared by the ``__global__`` wrapper and passed by reference
  (``rt_pc_t``) as every device function's hidden first parameter.
* A ``KERNEL`` becomes an ``extern "C" __global__`` wrapper that initialises
  the block's fault flag and calls the body, emitted as a device function (no
  other function calls a KERNEL: the verifier refuses it, since a launch
  contract holds only for the launched kernel).  In checked mode the wrapper has
  two hidden trailing parameters, the sequence record (``rt_gpu_fault *``,
  capabilities/abi.py) and the launch's index in its sequence, and exits at
  entry when the record says the sequence already faulted or was cancelled.

Launch sequences.  The record is one runtime-owned device allocation shared
by every module; it reaches the kernels as a parameter rather than a module
global set at load time because the launch index differs per launch and a
parameter is the only per-launch channel that costs no extra stream
operation (the pointer travels with it, so a module holds no hidden state).
A fault of launch k therefore stops launches k+1, ... of the sequence at
their entry, and the host reads the record once, at the sync.

Fault protocol (why it cannot deadlock).  A failed check never performs the
access.  The thread records the fault in the sequence record (first fault of
the sequence wins, by ``atomicCAS`` on its flag), sets the block-shared flag
``__rt_bfault`` and executes PTX ``exit``.  The PTX ISA specifies that
``barrier.sync`` waits only for *non-exited* threads and that an exiting
thread releases a barrier it was holding up, so the survivors' next
``rt_sync_threads()`` completes; right after that barrier every survivor sees
the flag and exits too.  Survivors that meet no further barrier simply run to
the end doing only checked accesses (or stop at a pollcheck, which also
reads the record's flag).  The host reads the record after synchronising and
raises ``CapabilityFault``.

Raw mode (``checked=False``) compiles the same AST with unchecked accessors,
no pollchecks, no entry check and no hidden parameters, and a plain
``__syncthreads()``: the overhead baseline.
"""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

from pycparser import c_ast

from ...capabilities import INCLUDE_DIR, abi
from ..compiler.astutil import (
    Generator,
    mangle,
    rename_user_names,
    squeeze_line_directives,
    tile_call,
    user_names,
)
from ..compiler.dialect_api import BUILTINS, MMA_ARRAY_ARGS, MMA_FUNCS
from ..compiler.hoist import (
    GPU_BARRIERS,
    GPU_BLOCK_VOTE,
    GPU_WARP_VOTE,
    QUIET_LOOPS,
    PollPoint,
    UncheckedCall,
    UncheckedRef,
    entry_polls,
    hoist_function,
    waiting_helpers,
)
from ..compiler.parse import is_user_node
from ..compiler.ranges import builtin_ranges, prove_subscripts
from ..compiler.verifier import KernelSig, VerifiedSource

#: The device runtime (package data): its #include "..." lines name headers of
#: capabilities/ (cap_abi.h, which includes guards.h, and checks.h).
PRELUDE_PATH = Path(__file__).with_name("prelude.cuh")
_INCLUDE = re.compile(r'^#include "([\w.]+)".*$', re.M)


def inline_includes(text: str) -> str:
    """``text`` with each quoted #include replaced by that header of capabilities/, and
    so on inside it."""
    return _INCLUDE.sub(lambda m: inline_includes((INCLUDE_DIR / m.group(1)).read_text()),
                        text)


@cache
def device_prelude() -> str:
    """The device runtime as one text (prelude.cuh, includes inlined), so NVRTC, the
    nvcc fallback and tests/emulate_cuda.py compile the same characters and the compile
    cache hashes all of them."""
    return inline_includes(PRELUDE_PATH.read_text())


@dataclass
class CudaSource:
    """Result of instrumentation: CUDA C text plus launch metadata."""

    text: str
    kernels: dict[str, KernelSig]
    local_arrays: list[str] = field(default_factory=list)  # fault slot -(id+1) -> name
    checked: bool = True
    #: kernel -> bytes of dynamic shared memory its launches need (see dynamic_shared)
    dynamic_smem: dict[str, int] = field(default_factory=dict)


#: Hidden trailing parameters of every checked kernel: the sequence record and
#: the launch's index in the sequence (runtime/cuda/params.py passes them).
SEQ_PARAM, LAUNCH_PARAM = "__rt_seq", "__rt_launch"
HIDDEN_PARAMS = f"rt_gpu_fault *{SEQ_PARAM}, int {LAUNCH_PARAM}"


def entry_symbol(kernel: str) -> str:
    """The ``extern "C" __global__`` symbol of ``kernel`` (cuModuleGetFunction's name):
    the user's name in its reserved spelling, like every other user name."""
    return mangle(kernel)


#: The hidden first parameter of every device function in checked mode: the thread's
#: poll clock (its last read of the record), by reference (rt_pc_t in the prelude).
PC_NAME = "__rt_pc"
PC_PARAM = f"rt_pc_t {PC_NAME}"


def _with_counter(decl: str) -> str:
    """``void h(cap_t x)`` -> ``void h(rt_pc_t __rt_pc, cap_t x)`` (``h(void)``: the
    counter only)."""
    head, _, rest = decl.partition("(")
    params, _, tail = rest.rpartition(")")
    params = params.strip()
    if params in ("", "void"):
        return f"{head}({PC_PARAM}){tail}"
    return f"{head}({PC_PARAM}, {params}){tail}"


def _with_hidden_params(decl: str) -> str:
    """``void k(cap_t x)`` -> ``void k(cap_t x, <hidden>)`` (``k()``/``k(void)``: hidden only)."""
    head, _, params = decl.rpartition(")")[0].partition("(")
    params = params.strip()
    if params in ("", "void"):
        return f"{head}({HIDDEN_PARAMS})"
    return f"{head}({params}, {HIDDEN_PARAMS})"


def _calls(node: c_ast.Node, names: dict | frozenset | set) -> list[c_ast.FuncCall]:
    """Every call under node of a function in ``names``."""
    out: list[c_ast.FuncCall] = []

    class V(c_ast.NodeVisitor):
        def visit_FuncCall(self, n: c_ast.FuncCall) -> None:
            if isinstance(n.name, c_ast.ID) and n.name.name in names and n.args is not None:
                out.append(n)
            self.generic_visit(n)

    V().visit(node)
    return out


def _children_set(node: c_ast.Node, name: str, new: c_ast.Node) -> None:
    """Replace the child pycparser reports as ``name`` (``attr`` or ``attr[i]``)."""
    if "[" in name:
        attr, idx = name[:-1].split("[")
        getattr(node, attr)[int(idx)] = new
    else:
        setattr(node, name, new)


#: dialect typedef names -> builtin C types (no <stdint.h> under NVRTC; nvcc has its own)
_TYPE_MAP = {name: ctype.split() for name, ctype in abi.DEVICE_CTYPES.items()}


def _map_types(node: c_ast.Node) -> None:
    if isinstance(node, c_ast.IdentifierType) and len(node.names) == 1 \
            and node.names[0] in _TYPE_MAP:
        node.names = list(_TYPE_MAP[node.names[0]])
    for _, c in node.children():
        _map_types(c)


def _call(name: str, args: list[c_ast.Node], coord) -> c_ast.FuncCall:
    return c_ast.FuncCall(c_ast.ID(name, coord), c_ast.ExprList(args, coord), coord)


def _int(v: int) -> c_ast.Constant:
    return c_ast.Constant("int", str(v))


#: CUDA's limit on a kernel's static ``__shared__`` data.  A kernel whose smem_ arrays
#: need more (with PRELUDE_SMEM for the prelude's own __shared__ variables) gets them as
#: offsets into one dynamic buffer, which the lane sizes at launch (opt-in, up to the
#: device's MAX_SHARED_MEMORY_PER_BLOCK_OPTIN: 227 KB on H100/H200).
STATIC_SMEM_LIMIT = 48 * 1024
PRELUDE_SMEM = 256
DSMEM = "__rt_dsmem"  #: the dynamic buffer's name in the generated CUDA


#: The dtype (abi.ELEM_SIZE) a local array's element type word makes it; the dialect's
#: other numeric types (int, unsigned, int32_t, uint32_t) are 32-bit integers.
_ELEM_DTYPE = {"double": "f64", "float": "f32", "long": "i64", "int64_t": "i64",
               "uint64_t": "i64"}


def _elem_bytes(decl: c_ast.Decl) -> int:
    """Bytes of one element of a local array (the dialect's numeric types)."""
    t = decl.type
    while not isinstance(t, c_ast.TypeDecl):
        t = t.type
    names = getattr(t.type, "names", [])
    return abi.ELEM_SIZE[next((_ELEM_DTYPE[n] for n in names if n in _ELEM_DTYPE), "i32")]


def _smem_decls(body: c_ast.Node, dims: dict[str, list[int]]) -> list[c_ast.Decl]:
    """The declarations of the smem_ arrays under ``body``, in source order."""
    out: list[c_ast.Decl] = []

    def walk(n: c_ast.Node) -> None:
        if isinstance(n, c_ast.Decl) and n.name in dims and n.name.startswith("smem_"):
            out.append(n)
        for _, c in n.children():
            walk(c)

    walk(body)
    return out


def dynamic_shared(fn: c_ast.FuncDef, dims: dict[str, list[int]]) -> int:
    """Bytes of dynamic shared memory ``fn`` (a kernel, its smem_ declarations already
    marked ``__shared__``) needs: 0 when its smem_ arrays fit CUDA's static limit, else
    each declaration becomes a pointer of the array's row type into one extern buffer,
    at a fixed offset (its own alignment), so ``smem_a[i][j]`` reads the same element
    and every subscript keeps its check against the declared sizes (``dims``)."""
    decls = _smem_decls(fn.body, dims)
    sizes = []
    for d in decls:
        count = 1
        for k in dims[d.name]:
            count *= k
        sizes.append(count * _elem_bytes(d))
    if sum(sizes) + PRELUDE_SMEM <= STATIC_SMEM_LIMIT:
        return 0
    off = 0
    for d, nbytes in zip(decls, sizes, strict=True):
        align = max([int(s[10:-1]) for s in d.storage if s.startswith("__align__(")] or [16])
        off = -(-off // align) * align
        d.storage = [s for s in d.storage if s != "__shared__" and not s.startswith("__align__")]
        d.type = c_ast.PtrDecl([], d.type.type)  # float a[R][C] -> float (*a)[C]
        cast_type = copy.deepcopy(d.type)
        t = cast_type
        while not isinstance(t, c_ast.TypeDecl):
            t = t.type
        t.declname = None
        d.init = c_ast.Cast(c_ast.Typename(None, [], None, cast_type),
                            c_ast.BinaryOp("+", c_ast.ID(DSMEM), _int(off)))
        off += nbytes
    # 128-byte aligned (as the driver places it): every offset above keeps its alignment
    buf = c_ast.Decl(DSMEM, [], [], ["extern", "__shared__", "__align__(128)"], [],
                     c_ast.ArrayDecl(c_ast.TypeDecl(DSMEM, [], None,
                                                    c_ast.IdentifierType(["unsigned", "char"])),
                                     None, []), None, None)
    fn.body.block_items = [buf] + list(fn.body.block_items or [])
    return off


class _Rewriter:
    """Rewrites one function's body in place (API calls, array subscripts, pollchecks)."""

    def __init__(self, owner: _Instrumenter, arrays: dict[str, list[int]]):
        self.o = owner
        self.arrays = arrays
        self.has_loop = False

    def visit(self, node: c_ast.Node) -> c_ast.Node:
        if isinstance(node, PollPoint):
            return _call("RT_POLL_NOW", [], node.coord)
        if isinstance(node, c_ast.ArrayRef):
            return self.subscript(node)
        if isinstance(node, c_ast.Assignment) and node.op in ("/=", "%="):
            # x /= y -> x = x / y (the verifier admits only side-effect-free targets)
            node.rvalue = c_ast.BinaryOp(node.op[0], copy.deepcopy(node.lvalue), node.rvalue,
                                         node.coord)
            node.op = "="
        for name, child in list(node.children()):
            _children_set(node, name, self.visit(child))
        if isinstance(node, c_ast.FuncCall):
            return self.call(node)
        if isinstance(node, c_ast.BinaryOp) and node.op in ("/", "%"):
            line = node.coord.line if node.coord else 0
            return _call("rt_div" if node.op == "/" else "rt_mod",
                         [node.left, node.right, _int(line)], node.coord)
        if isinstance(node, (c_ast.For, c_ast.While, c_ast.DoWhile)):
            self.has_loop = True
            if isinstance(node, QUIET_LOOPS):
                return node  # polls once after itself (hoist/)
            poll = _call("RT_POLL", [c_ast.ID("__rt_pc")], node.coord)
            cond = node.cond if node.cond is not None else _int(1)
            node.cond = c_ast.ExprList([poll, cond], node.coord)
            return node
        return node

    def subscript(self, node: c_ast.ArrayRef) -> c_ast.Node:
        # Pre-order: handle the whole chain a[i][j] at its outermost ArrayRef.
        chain = []
        base: c_ast.Node = node
        while isinstance(base, c_ast.ArrayRef):
            chain.append(base)
            base = base.name
        for ref in chain:
            ref.subscript = self.visit(ref.subscript)
        if not (isinstance(base, c_ast.ID) and base.name in self.arrays):
            chain[-1].name = self.visit(base)
            return node
        dims = self.arrays[base.name]
        chain.reverse()  # outermost dimension first
        assert len(chain) == len(dims), "the verifier refuses partial subscripts"
        aid = self.o.array_id(base.name)
        for ref, n in zip(chain, dims, strict=True):
            if isinstance(ref, UncheckedRef):
                continue  # covered by a loop guard (hoist/)
            line = ref.coord.line if ref.coord else 0
            ref.subscript = _call("rt_local_idx",
                                  [ref.subscript, _int(n), _int(aid), _int(line)], ref.coord)
        return node

    def call(self, node: c_ast.FuncCall) -> c_ast.Node:
        assert isinstance(node.name, c_ast.ID), "the verifier refuses indirect calls"
        name = node.name.name
        args = list(node.args.exprs) if node.args is not None else []
        line = node.coord.line if node.coord else 0
        coord = node.coord
        if name not in BUILTINS:  # a function of this source, or a loop guard's helper
            if name in self.o.kernel_names:
                node.name = c_ast.ID(f"__rtk_{name}", coord)
            if self.o.checked and name in self.o.funcs:
                # the thread's pollcheck counter travels with every call (PC_PARAM)
                node.args = c_ast.ExprList([c_ast.ID(PC_NAME, coord)] + args, coord)
            return node
        low = BUILTINS[name].lowering("cuda")
        assert low is not None and not low.ctx, f"the verifier refuses {name} for target cuda"
        if isinstance(node, UncheckedCall):  # covered by a loop guard (hoist/)
            assert low.unchecked is not None
            return _call(low.unchecked, args, coord)
        if low.form == "tile":
            return self.tile(low.call, name, args, line, coord)
        if low.form == "mma":
            return self.mma(low.call, name, args, line, coord)
        if low.call == name and not (low.extra or low.line):
            return node
        extra: list[c_ast.Node] = [_int(x) if isinstance(x, int) else c_ast.ID(x, coord)
                                   for x in low.extra]
        return _call(low.call, args + extra + ([_int(line)] if low.line else []), coord)

    def tile(self, call: str, name: str, args: list[c_ast.Node], line: int,
             coord) -> c_ast.Node:
        """cap_tile_OP_T(c, off, ld, rows, cols, arr, aoff, ald) -> ``call`` (rt_tile_OP_T)
        with the shared array's flat length and fault id."""
        tc = tile_call(name, args, self.arrays)
        return _call(call,
                     args[:6] + [_int(tc.flat_len), _int(self.o.array_id(tc.array))]
                     + args[6:8] + [_int(line)], coord)


    def mma(self, call: str, name: str, args: list[c_ast.Node], line: int,
            coord) -> c_ast.Node:
        """rt_warp_mma_*(C, c_off, ldc, A, a_off, lda, B, b_off, ldb[, k]) -> ``call``
        (rt_mma<split, A transposed>) with k (8 for tf32), each array's flat length and
        fault id."""
        form = MMA_FUNCS[name]
        k = args[9] if form.fp32 else _int(8)
        args = args[:9]
        extra: list[c_ast.Node] = [k]
        for k in MMA_ARRAY_ARGS:
            arr = args[k]
            assert isinstance(arr, c_ast.ID), "the verifier admits array names only"
            flat = 1
            for n in self.arrays[arr.name]:
                flat *= n
            extra += [_int(flat), _int(self.o.array_id(arr.name))]
            # a 2-D or 3-D array is one flat tile space (its flat length is the bound)
            args[k] = c_ast.Cast(c_ast.Typename(None, [], None, c_ast.PtrDecl([], c_ast.TypeDecl(
                None, [], None, c_ast.IdentifierType(["float"])))), arr)
        return _call(call, args + extra + [_int(line)], coord)


class _Instrumenter:
    def __init__(self, verified: VerifiedSource, checked: bool, hoist: bool):
        assert verified.target == "cuda", "verify(parsed, target='cuda') first"
        self.verified = verified
        self.ast = copy.deepcopy(verified.parsed.ast)  # lowering edits its own copy
        self.checked = checked
        self.hoist = hoist and checked
        self.kernel_names = set(verified.parsed.kernels)
        self.waits = waiting_helpers(self.ast, GPU_BARRIERS)
        user = [e for e in self.ast.ext if is_user_node(e)]
        self.funcs = {e.decl.name for e in user if isinstance(e, c_ast.FuncDef)}
        # functions that tick the pollcheck counter at entry (none in raw mode)
        self.entry_polls = entry_polls(self.ast) if checked else frozenset()
        self.arrays: list[str] = []
        self.gen = Generator(line_directives=True)
        # printed with their reserved spelling (astutil.USER_PREFIX); analyses keep the
        # user's names, as do fault records (array names) and kernel signatures
        self.user_names = user_names(verified.parsed.ast)
        self.dynamic: dict[str, int] = {}
        #: each function's lowered AST, as printed (runtime/cuda/census.py reads them)
        self.lowered: dict[str, c_ast.FuncDef] = {}

    def array_id(self, name: str) -> int:
        self.arrays.append(name)
        return len(self.arrays) - 1

    def local_arrays(self, fn: c_ast.FuncDef) -> dict[str, list[int]]:
        """The verifier's local arrays of ``fn``; smem_ arrays get __shared__ storage."""
        dims = self.verified.local_arrays.get(fn.decl.name, {})

        # MMA tiles: wmma needs 32-byte aligned rows (offsets are checked to be
        # multiples of 8 floats from the array's start)
        mma = {a.name for call in _calls(fn, MMA_FUNCS) for k, a in
               enumerate(call.args.exprs) if k in MMA_ARRAY_ARGS and isinstance(a, c_ast.ID)}

        def walk(n: c_ast.Node) -> None:
            if isinstance(n, c_ast.Decl) and n.name in dims and n.name.startswith("smem_"):
                # 16-byte aligned: tile copies then move float4/double2 vectors
                align = 32 if n.name in mma else 16
                n.storage = list(n.storage) + ["__shared__", f"__align__({align})"]
            for _, c in n.children():
                walk(c)

        walk(fn.body)
        return {k: list(v) for k, v in dims.items()}

    def function(self, fn: c_ast.FuncDef) -> tuple[str, KernelSig | None]:
        name = fn.decl.name
        arrays = self.local_arrays(fn)
        guards = ""
        if self.hoist:
            dims = {k: tuple(v) for k, v in arrays.items()}
            sig = self.verified.kernels.get(name)
            prove_subscripts(fn, dims, builtin_ranges("cuda", sig.block_dim if sig else None))
            table = hoist_function(fn, dims, self.waits, barriers=GPU_BARRIERS,
                                   warp_vote=GPU_WARP_VOTE, block_vote=GPU_BLOCK_VOTE)
            guards = "".join(self.outlined_guard(g) for g in table.guards)
        rw = _Rewriter(self, arrays)
        rw.visit(fn.body)
        if name in self.kernel_names:
            self.dynamic[name] = dynamic_shared(fn, arrays)
        if name in self.entry_polls:
            # a caller of helpers ticks at entry (hoist.entry_polls: why that bounds
            # the work between two reads of the record)
            poll = _call("RT_POLL", [c_ast.ID(PC_NAME)], fn.body.coord)
            fn.body.block_items = [poll] + list(fn.body.block_items or [])
        _map_types(fn)
        rename_user_names(fn, self.user_names)
        self.lowered[name] = fn
        body = self.gen.visit(fn.body)
        if rw.has_loop and not self.checked:
            # Raw mode never reads the counter (RT_POLL is empty there).
            body = "{\n  unsigned int __rt_pc = 0u; (void)__rt_pc;" + body.lstrip()[1:]
        fn.decl.storage = [s for s in fn.decl.storage if s != "static"]
        own_decl = self.gen.visit(fn.decl)
        if self.checked:
            own_decl = _with_counter(own_decl)
        if name not in self.kernel_names:
            return f"{guards}static __device__ __forceinline__ {own_decl}\n{body}\n", None
        # Kernel: device body + __global__ wrapper that sets up the block's fault flag.
        sig = self.verified.kernels[name]
        decl_txt = self.gen.visit(fn.decl)
        inner = own_decl.replace(mangle(name) + "(", f"__rtk_{name}(", 1)
        out = f"{guards}static __device__ __forceinline__ {inner}\n{body}\n"
        argnames = ", ".join(mangle(n) for n, _ in sig.params)
        prologue = ""
        if self.checked:  # raw builds have neither the hidden parameters nor the entry check
            decl_txt = _with_hidden_params(decl_txt)
            prologue = (f"  RT_PROLOGUE({SEQ_PARAM}, {LAUNCH_PARAM});\n"
                        f"  unsigned int {PC_NAME} = rt_poll_clock();\n")
            argnames = ", ".join([PC_NAME] + [mangle(n) for n, _ in sig.params])
        # a block that returns leaves the group, so the other blocks' barriers complete
        leave = "  rt_group_leave();\n" if sig.group_sync else ""
        out += (f'extern "C" __global__ {decl_txt}\n{{\n{prologue}'
                f"  __rtk_{name}({argnames});\n{leave}}}\n")
        return out, sig

    def outlined_guard(self, fn: c_ast.FuncDef) -> str:
        """A cover guard hoist/ made a function of its own (versioning._outline): not
        inlined, so its bounds do not share registers with the loop it guards."""
        _Rewriter(self, {}).visit(fn.body)
        _map_types(fn)
        rename_user_names(fn, self.user_names)
        fn.decl.storage = []
        decl, body = self.gen.visit(fn.decl), self.gen.visit(fn.body)
        return f"static __device__ __noinline__ {decl}\n{body}\n"

    def run(self) -> CudaSource:
        parts = [("" if self.checked else "#define RT_RAW 1\n") + device_prelude()]
        kernels: dict[str, KernelSig] = {}
        # Forward declarations first so helpers may appear in any order.
        for ext in self.ast.ext:
            if not is_user_node(ext):
                continue
            if isinstance(ext, c_ast.FuncDef):
                txt, info = self.function(ext)
                parts.append(f'#line {ext.coord.line if ext.coord else 1} "kernel"\n' + txt)
                if info:
                    kernels[info.name] = info
            elif isinstance(ext, c_ast.Decl) and isinstance(ext.type, c_ast.FuncDecl):
                ext.storage = [s for s in ext.storage if s != "static"]
                if ext.name in self.kernel_names:
                    continue
                _map_types(ext)
                rename_user_names(ext, self.user_names)
                proto = self.gen.visit(ext)
                if self.checked:
                    proto = _with_counter(proto)
                parts.append(f"static __device__ __forceinline__ {proto};\n")
            else:
                raise AssertionError("the verifier admits only functions at file scope")
        return CudaSource(squeeze_line_directives("\n".join(parts)), kernels, self.arrays,
                          self.checked, {k: v for k, v in self.dynamic.items() if v})


def instrument(verified: VerifiedSource, *, checked: bool = True,
               hoist: bool = True) -> CudaSource:
    """Lower a source verified for target "cuda" to CUDA C.

    ``checked=False`` emits the same code with raw pointer accesses (baseline);
    ``hoist=False`` keeps every access checked inside loops (no versioning).
    """
    return _Instrumenter(verified, checked, hoist).run()
