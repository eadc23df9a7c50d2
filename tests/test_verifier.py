"""Verifier tests: hostile sources are refused at the right line; valid kernels pass."""

from __future__ import annotations

import pytest
from capqr.runtime.compiler.parse import parse
from capqr.runtime.compiler.verifier import API_FUNCS, CUDA_API_FUNCS, MATH_FUNCS, verify
from capqr.runtime.errors import VerifyError

OK_KERNEL = "KERNEL void ok(cap_t x) { cap_store_f64(x, 0, 1.0); }\n"


def _verify(src: str, target: str = "cpu"):
    return verify(parse(src), target=target)


# (id, source, expected line, substring of construct or reason).  Each source is
# otherwise valid, so the expected violation is the first one.
HOSTILE = [
    ("pointer-cast",
     "KERNEL void k(cap_t x) {\n  int64_t a = (int64_t)(double *)0;\n}\n", 2,
     "pointer declarator"),
    ("pointer-param", "KERNEL void k(double *x) {\n}\n", 1, "pointer declarator"),
    ("pointer-local",
     "KERNEL void k(cap_t x) {\n  int64_t n = 0;\n  double *p;\n}\n", 3, "pointer declarator"),
    ("union-over-cap",
     "union pun { cap_t c; int64_t bits[5]; };\n" + OK_KERNEL, 1, "union"),
    ("union-local",
     "KERNEL void k(cap_t x) {\n  union { cap_t c; int64_t i; } u;\n}\n", 2, "union"),
    ("struct-decl", OK_KERNEL + "struct fake { int64_t p; };\n", 2, "struct"),
    ("enum", "enum e { A, B };\n" + OK_KERNEL, 1, "enum"),
    ("asm-call",
     "KERNEL void k(cap_t x) {\n  int64_t n = 1;\n  asm(\"mov $0, %rax\");\n}\n", 3, "asm"),
    ("asm-volatile",
     "KERNEL void k(cap_t x) {\n  __asm__ volatile (\"nop\");\n}\n", 2, "syntax error"),
    ("include", "#include <string.h>\n" + OK_KERNEL, 1, "preprocessor directive"),
    ("define-macro",
     "KERNEL void k(cap_t x) {\n  int64_t n = 0;\n"
     "#define cap_load_f64(c, i) ((double *)c.p)[i]\n}\n", 3, "preprocessor directive"),
    ("digraph-include", "\n %:include <stdlib.h>\n" + OK_KERNEL, 2, "preprocessor directive"),
    ("trigraph-define", "??=define X 1\n" + OK_KERNEL, 1, "preprocessor directive"),
    ("line-continuation",
     "KERNEL void k(cap_t x) {\n  int64_t a = 1; \\\n  a = 2;\n}\n", 2, "line continuation"),
    ("builtin-memcpy",
     "KERNEL void k(cap_t x, cap_t y) {\n  __builtin_memcpy(x, y, 40);\n}\n", 2,
     "call to '__builtin_memcpy'"),
    ("builtin-trap", "KERNEL void k(cap_t x) {\n\n  __builtin_trap();\n}\n", 3,
     "call to '__builtin_trap'"),
    ("function-pointer-local",
     "KERNEL void k(cap_t x) {\n  void (*fp)(cap_t) = k;\n}\n", 2, "function pointer"),
    ("function-name-as-value",
     "static double h(double v) { return v; }\n"
     "KERNEL void k(cap_t x) {\n  int64_t a = (int64_t)h;\n}\n", 3, "function pointer"),
    ("api-name-as-value",
     "KERNEL void k(cap_t x) {\n  int64_t a = cap_to_int(x);\n  a = a + cap_load_f64;\n}\n", 3,
     "function pointer"),
    ("cap-to-int-cast", "KERNEL void k(cap_t x) {\n  int64_t a = (int64_t)x;\n}\n", 2,
     "cast from cap_t"),
    ("int-to-cap-cast",
     "KERNEL void k(cap_t x, int64_t n) {\n  cap_t y = (cap_t)n;\n}\n", 2, "cast to cap_t"),
    ("member-access-dot",
     "KERNEL void k(cap_t x) {\n  int64_t n = 0;\n  n = x.rlen;\n}\n", 3, "member access"),
    ("member-access-arrow", "KERNEL void k(cap_t x) {\n  x->wlen = 100;\n}\n", 2,
     "member access"),
    ("goto", "KERNEL void k(cap_t x) {\n  goto out;\nout:\n  return;\n}\n", 2, "goto"),
    ("label", "KERNEL void k(cap_t x) {\n  int64_t n = 0;\nagain:\n  n++;\n}\n", 3, "label"),
    ("varargs", "static void v(int64_t n, ...) {\n}\n" + OK_KERNEL, 1, "variadic"),
    ("recursion-direct",
     "static int64_t f(int64_t n) {\n  if (n > 0)\n    return f(n - 1);\n  return 0;\n}\n"
     + OK_KERNEL, 3, "recursion"),
    ("recursion-mutual",
     "static int64_t g(int64_t n);\n"
     "static int64_t f(int64_t n) {\n  return g(n);\n}\n"
     "static int64_t g(int64_t n) {\n  return f(n);\n}\n" + OK_KERNEL, 3, "recursion"),
    ("global-mutable", "int64_t counter = 0;\n" + OK_KERNEL, 1, "global variable"),
    ("global-const", OK_KERNEL + "static const double table[2] = {1.0, 2.0};\n", 2,
     "global variable"),
    ("static-local",
     "KERNEL void k(cap_t x) {\n  static int64_t calls = 0;\n}\n", 2, "static local"),
    ("string-literal",
     "KERNEL void k(cap_t x) {\n  int64_t n = sizeof(\"abc\");\n}\n", 2, "string literal"),
    ("char-literal", "KERNEL void k(cap_t x) {\n  int64_t n = 'a';\n}\n", 2,
     "character literal"),
    ("extern-global", "extern int64_t environ_count;\n" + OK_KERNEL, 1, "extern"),
    ("extern-prototype", "extern int system(int cmd);\n" + OK_KERNEL, 1, "extern"),
    ("extern-local", "KERNEL void k(cap_t x) {\n  extern int64_t errno_;\n}\n", 2, "extern"),
    ("typedef-pointer", "typedef double *dptr;\n" + OK_KERNEL, 1, "typedef"),
    ("sizeof-cap-type",
     "KERNEL void k(cap_t x) {\n  int64_t n = sizeof(cap_t);\n}\n", 2, "sizeof(cap_t)"),
    ("sizeof-cap-expr", "KERNEL void k(cap_t x) {\n  int64_t n = sizeof x;\n}\n", 2,
     "sizeof of cap_t"),
    ("sizeof-pointer-type",
     "KERNEL void k(cap_t x) {\n  int64_t n = sizeof(double *);\n}\n", 2, "pointer declarator"),
    ("compound-literal",
     "KERNEL void k(cap_t x) {\n  double v = ((double[2]){1.0, 2.0})[1];\n}\n", 2,
     "compound literal"),
    ("array-of-caps", "KERNEL void k(cap_t x) {\n  cap_t tbl[4];\n}\n", 2, "array of cap_t"),
    ("runtime-name-function", "void rt_fault(void) {\n}\n" + OK_KERNEL, 1, "runtime name"),
    ("reserved-global", "int __rt;\n" + OK_KERNEL, 1, "reserved identifier"),
    ("reserved-local", "KERNEL void k(cap_t x) {\n  int64_t __rt = 0;\n}\n", 2,
     "reserved identifier"),
    ("cap-prefix-local", "KERNEL void k(cap_t x) {\n  int64_t cap_len = 0;\n}\n", 2,
     "runtime name"),
    ("unknown-call-system",
     "KERNEL void k(cap_t x, int64_t n) {\n  system(n);\n}\n", 2, "call to 'system'"),
    ("unknown-call-malloc",
     "KERNEL void k(cap_t x) {\n  int64_t p = malloc(64);\n}\n", 2, "call to 'malloc'"),
    ("setjmp", "KERNEL void k(cap_t x) {\n  int64_t n = 0;\n  n = setjmp(n);\n}\n", 3,
     "call to 'setjmp'"),
    ("address-of", "KERNEL void k(cap_t x) {\n  int64_t n = 0;\n  int64_t a = &n;\n}\n", 3,
     "address-of"),
    ("deref", "KERNEL void k(cap_t x) {\n  double v = *x;\n}\n", 2, "dereference"),
    ("alloca", "KERNEL void k(cap_t x, int64_t n) {\n  int64_t a = alloca(n);\n}\n", 2,
     "call to 'alloca'"),
    ("vla", "KERNEL void k(cap_t x, int64_t n) {\n  float a[n];\n}\n", 2,
     "non-constant array size"),
    ("array-too-large", "KERNEL void k(cap_t x) {\n  double a[2048][1024];\n}\n", 2,
     "array too large"),
    ("array-4d", "KERNEL void k(cap_t x) {\n  double a[2][2][2][2];\n}\n", 2,
     "more than 3 dimensions"),
    ("array-zero-size", "KERNEL void k(cap_t x) {\n  double a[0];\n}\n", 2, "non-positive"),
    ("array-param", "static double h(double a[4]) {\n  return 0.0;\n}\n" + OK_KERNEL, 1,
     "array parameter"),
    ("array-as-pointer",
     "KERNEL void k(cap_t x) {\n  int64_t a[4];\n  int64_t p = 0;\n  p = a + 1;\n}\n", 4,
     "array used as a value"),
    ("index-reversed", "KERNEL void k(cap_t x) {\n  int64_t a[4];\n  a[0] = 1[a];\n}\n", 3,
     "subscript of a non-array"),
    ("partial-subscript",
     "KERNEL void k(cap_t x) {\n  double a[4][4];\n  double b = a[1] + 0;\n}\n", 3,
     "partial array subscript"),
    ("subscript-cap", "KERNEL void k(cap_t x) {\n  double v = x[3];\n}\n", 2,
     "subscript of cap_t"),
    ("cap-arithmetic", "KERNEL void k(cap_t x) {\n  cap_t y = x + 8;\n}\n", 2,
     "cap_t operand of '+'"),
    ("cap-compare",
     "KERNEL void k(cap_t x, cap_t y) {\n  int64_t n = 0;\n  if (x == y)\n    n = 1;\n}\n", 3,
     "cap_t operand of '=='"),
    ("cap-increment", "KERNEL void k(cap_t x) {\n  x++;\n}\n", 2, "cap_t operand of 'p++'"),
    ("cap-compound-assign", "KERNEL void k(cap_t x) {\n  x += 1;\n}\n", 2,
     "cap_t operand of '+='"),
    ("cap-to-number-assign", "KERNEL void k(cap_t x) {\n  int64_t n = 0;\n  n = x;\n}\n", 3,
     "cap_t stored in a number"),
    ("number-to-cap-assign", "KERNEL void k(cap_t x, int64_t n) {\n  x = n;\n}\n", 2,
     "number assigned to cap_t"),
    ("cap-ternary",
     "KERNEL void k(cap_t x, cap_t y, int64_t n) {\n  cap_t z = n ? x : y;\n}\n", 2,
     "cap_t in conditional expression"),
    ("cap-to-math", "KERNEL void k(cap_t x) {\n  double v = sqrt(x);\n}\n", 2,
     "argument 1 of 'sqrt'"),
    ("int-as-cap-arg", "KERNEL void k(cap_t x, int64_t n) {\n  cap_store_f64(n, 0, 1.0);\n}\n",
     2, "argument 1 of 'cap_store_f64'"),
    ("char-type", "KERNEL void k(cap_t x) {\n  char c = 0;\n}\n", 2, "type 'char'"),
    ("short-type", "KERNEL void k(cap_t x) {\n  short s = 0;\n}\n", 2, "type 'short'"),
    ("long-double", "KERNEL void k(cap_t x) {\n  long double d = 0;\n}\n", 2, "long double"),
    ("long-double-constant", "KERNEL void k(cap_t x) {\n  double d = 1.0L;\n}\n", 2,
     "long double"),
    ("bool-type", "KERNEL void k(cap_t x) {\n  _Bool b = 0;\n}\n", 2, "_Bool"),
    ("complex-type", "KERNEL void k(cap_t x) {\n  _Complex double z;\n}\n", 2, "_Complex"),
    ("volatile-local", "KERNEL void k(cap_t x) {\n  volatile int64_t n = 0;\n}\n", 2,
     "'volatile' qualifier"),
    ("register-local", "KERNEL void k(cap_t x) {\n  register int64_t n = 0;\n}\n", 2,
     "register"),
    ("thread-local", "KERNEL void k(cap_t x) {\n  _Thread_local int64_t n = 0;\n}\n", 2,
     "_Thread_local"),
    ("alignas", "KERNEL void k(cap_t x) {\n  _Alignas(4096) double a[4];\n}\n", 2, "_Alignas"),
    ("kernel-returns-value", "KERNEL int64_t k(cap_t x) {\n  return 0;\n}\n", 1,
     "KERNEL return type"),
    ("kernel-int-param", "KERNEL void k(cap_t x, int n) {\n}\n", 1, "KERNEL parameter type"),
    ("no-kernel", "static double h(double v) {\n  return v;\n}\n", None, "missing KERNEL"),
    ("duplicate-function",
     "static double h(double v) {\n  return v;\n}\nstatic double h(double v) {\n  return v;\n}\n"
     + OK_KERNEL, 4, "duplicate function"),
    ("helper-main", "int main(void) {\n  return 0;\n}\n" + OK_KERNEL, 1, "'main'"),
    ("helper-memcpy",
     "static int64_t memcpy(int64_t a, int64_t b, int64_t n) {\n  return a;\n}\n" + OK_KERNEL,
     1, "'memcpy'"),
    ("helper-shadows-math", "static double sqrt(double v) {\n  return v;\n}\n" + OK_KERNEL, 1,
     "redefinition of 'sqrt'"),
    ("api-wrong-arity", "KERNEL void k(cap_t x) {\n  double v = cap_load_f64(x);\n}\n", 2,
     "takes 2 argument"),
    ("helper-wrong-arity",
     "static double h(double v) {\n  return v;\n}\nKERNEL void k(cap_t x) {\n"
     "  double v = h(1.0, 2.0);\n}\n", 5, "takes 1 argument"),
    ("assign-to-api", "KERNEL void k(cap_t x) {\n  cap_load_f64 = 0;\n}\n", 2,
     "assignment to 'cap_load_f64'"),
    ("knr-definition",
     "static int64_t f(a)\n  int64_t a;\n{\n  return a;\n}\n" + OK_KERNEL, 1, "K&R"),
    ("nested-function",
     "KERNEL void k(cap_t x) {\n  void inner(void) {\n  }\n}\n", 2, "syntax error"),
    ("statement-expression",
     "KERNEL void k(cap_t x) {\n  int64_t n = ({ 1; });\n}\n", 2, "statement expression"),
    ("uninitialised-cap", "KERNEL void k(cap_t x) {\n  cap_t c;\n}\n", 2, "uninitialised cap_t"),
    ("cap-helper-falls-off-end",
     "static cap_t pick(cap_t a, int64_t n) {\n  if (n)\n    return a;\n}\n" + OK_KERNEL, 2,
     "missing return"),
    ("cap-helper-bare-return",
     "static cap_t pick(cap_t a) {\n  return;\n}\n" + OK_KERNEL, 2, "return without a value"),
    ("switch-skips-cap-init",
     "KERNEL void k(cap_t x, int64_t n) {\n  switch (n) {\n  case 0:\n    ;\n"
     "    cap_t c = x;\n  }\n}\n", 5, "cap_t declaration in a switch body"),
    ("duffs-device",
     "KERNEL void k(cap_t x, int64_t n) {\n  switch (n) {\n  case 0:\n    while (n) {\n"
     "    case 1:\n      n--;\n    }\n  }\n}\n", 5, "case label inside a nested statement"),
    ("cap-self-init", "KERNEL void k(cap_t x) {\n  cap_t c = c;\n}\n", 2,
     "undeclared identifier 'c'"),
    ("pragma-operator",
     "KERNEL void k(cap_t x) {\n  _Pragma(\"GCC optimize(\\\"O0\\\")\")\n  int64_t n = 0;\n}\n",
     2, "pragma"),
    ("designated-init", "KERNEL void k(cap_t x) {\n  int64_t a[4] = {[3] = 1};\n}\n", 2,
     "designated initializer"),
    ("init-list-scalar", "KERNEL void k(cap_t x) {\n  int64_t n = {1};\n}\n", 2,
     "initializer list for non-array"),
    ("undeclared-macro-name",
     "KERNEL void k(cap_t x) {\n  int64_t n = 0;\n  n = INT64_MAX;\n}\n", 3,
     "undeclared identifier 'INT64_MAX'"),
    ("gpu-call-on-cpu",
     "KERNEL void k(cap_t x) {\n  int64_t t = rt_thread_idx();\n}\n", 2,
     "call to 'rt_thread_idx'"),
    ("shadowing",
     "KERNEL void k(cap_t x, int64_t n) {\n  for (int64_t i = 0; i < n; i++) {\n"
     "    int64_t n = i;\n  }\n}\n", 3, "redeclaration of 'n'"),
    ("indirect-call", "KERNEL void k(cap_t x) {\n  (*k)(x);\n}\n", 2, "indirect call"),
    ("static-assert", "_Static_assert(1, \"x\");\n" + OK_KERNEL, 1, "_Static_assert"),
    ("undefined-prototype", "static double ext(double v);\n" + OK_KERNEL, 1,
     "declaration of 'ext'"),
    ("local-function-declaration",
     "KERNEL void k(cap_t x) {\n  double ext(double v);\n}\n", 2, "function declaration"),
    ("cap-assignment-as-value",
     "KERNEL void k(cap_t x, cap_t y) {\n  cap_store_f64(x = y, 0, 1.0);\n}\n", 2,
     "cap_t assignment used as a value"),
    ("unnamed-kernel-param", "KERNEL void k(cap_t) {\n}\n", 1, "unnamed parameter"),
]


def test_enough_hostile_cases():
    assert len({case[0] for case in HOSTILE}) == len(HOSTILE) >= 30


@pytest.mark.parametrize("src,line,needle", [c[1:] for c in HOSTILE], ids=[c[0] for c in HOSTILE])
def test_hostile_source_rejected(src: str, line: int | None, needle: str):
    with pytest.raises(VerifyError) as info:
        _verify(src)
    err = info.value
    assert err.line == line, str(err)
    assert needle in err.construct or needle in err.reason, str(err)
    assert err.reason  # every rejection says why


def test_too_many_cap_locals():
    params = ", ".join(f"cap_t c{i}" for i in range(65))
    src = f"static void h({params}) {{\n}}\n" + OK_KERNEL
    with pytest.raises(VerifyError) as info:
        _verify(src)
    assert info.value.line == 1 and "too many cap_t" in info.value.construct


def test_first_violation_in_source_order():
    src = ("KERNEL void k(cap_t x) {\n  int64_t n = 0;\n  n = (int64_t)x;\n"
           "  double *p;\n}\nint64_t g;\n")
    with pytest.raises(VerifyError) as info:
        _verify(src)
    assert info.value.line == 3 and "cast from cap_t" in info.value.construct


AXPY = """\
KERNEL void axpy(cap_t x, cap_t y, int64_t n, double alpha)
{
    for (int64_t i = rt_block_idx(); i < n; i += rt_grid_dim()) {
        double v = alpha * cap_load_f64(x, i) + cap_load_f64(y, i);
        cap_store_f64(y, i, v);
    }
}
"""

HELPERS = """\
static double dot(cap_t a, cap_t b, int64_t n)
{
    double s = 0.0;
    int64_t i = 0;
    while (i < n) {
        s = fma(cap_load_f64(a, i), cap_load_f64(b, i), s);
        i++;
    }
    return s;
}

static cap_t column(cap_t m, int64_t ld, int64_t j)
{
    if (j < 0)
        return cap_from_int(0);
    else
        return cap_offset_f64(m, j * ld);
}

static void fill(cap_t out, int64_t n)
{
    double tile[4][8][2] = {{{0.0}}};
    int32_t idx[16];
    float acc[3];
    for (int64_t k = 0; k < 16; k++)
        idx[k] = (int32_t)k;
    acc[0] = 1.5f;
    acc[1] = sqrtf(acc[0]) + fabsf(-2.0f);
    acc[2] = (float)(copysign(1.0, -0.0) + hypot(3.0, 4.0));
    tile[1][2][1] = pow(2.0, 10.0) + floor(1.5) + ceil(1.5) + tanh(0.5) + exp(1.0) + log(2.0);
    cap_store_f32(out, 0, acc[1] + (float)tile[1][2][1] + (float)sizeof(tile));
    if (isnan(acc[2]) || isinf(acc[2]) || !isfinite(acc[2]))
        cap_store_i32(out, 1, idx[3]);
}

KERNEL void qr_step(cap_t a, cap_t tau, cap_t tables, int64_t m, int64_t n, float scale)
{
    const int64_t j = rt_block_idx();
    cap_t col = column(a, m, j);
    cap_t t = cap_load_cap(tables, j);
    cap_t fresh = cap_alloc_f16(n);
    uint64_t bits = (uint64_t)cap_to_int(col) ^ 0x5555u;
    int64_t len = cap_len_f64(col) + cap_len_f16(fresh) + cap_len_i64(t) + (int64_t)(bits & 1);
    double d = dot(col, col, len);
    unsigned long u = 7ul;
    long q = (long)(u % 3) << 2;
    int r = (int)(q / 2) - -1;
    cap_store_f16(fresh, 0, (float)d * scale + cap_load_f16(fresh, 1));
    cap_store_i64(t, 0, q * r);
    cap_store_cap(tables, j, fresh);
    t = fresh;
    switch (r) {
    case 0: {
        cap_t alias = t;
        cap_store_f64(alias, 0, fmin(d, fmax(0.0, cos(sin(d)))));
        break;
    }
    default:
        break;
    }
    do {
        len--;
        if (len < 2)
            continue;
    } while (len > 0 && cap_load_i32(a, len) != 0);
    fill(tau, n);
}
"""


def test_axpy_signature():
    v = _verify(AXPY)
    sig = v.kernels["axpy"]
    assert sig.name == "axpy"
    assert sig.params == [("x", "cap"), ("y", "cap"), ("n", "int64"), ("alpha", "double")]
    assert (sig.n_caps, sig.n_scalars) == (2, 2)
    assert v.helpers == []
    assert v.cap_locals == {"axpy": ["x", "y"]}
    assert v.local_arrays == {"axpy": {}}
    assert v.call_graph == {"axpy": set()}
    assert v.parsed.kernels == ["axpy"]


def test_helpers_arrays_and_cap_tables():
    v = _verify(HELPERS)
    assert list(v.kernels) == ["qr_step"]
    sig = v.kernels["qr_step"]
    assert sig.params == [("a", "cap"), ("tau", "cap"), ("tables", "cap"), ("m", "int64"),
                          ("n", "int64"), ("scale", "float")]
    assert (sig.n_caps, sig.n_scalars) == (3, 3)
    assert v.helpers == ["dot", "column", "fill"]
    assert v.cap_locals["qr_step"] == ["a", "tau", "tables", "col", "t", "fresh", "alias"]
    assert v.cap_locals["dot"] == ["a", "b"]
    assert v.cap_locals["column"] == ["m"]
    assert v.local_arrays["fill"] == {"tile": (4, 8, 2), "idx": (16,), "acc": (3,)}
    assert v.local_arrays["qr_step"] == {}
    assert v.call_graph["qr_step"] == {"column", "dot", "fill"}
    assert v.call_graph["dot"] == set()


def test_prototype_allows_call_before_definition():
    src = ("static double twice(double);\n"
           "KERNEL void k(cap_t x) {\n  cap_store_f64(x, 0, twice(1.0));\n}\n"
           "static double twice(double v) {\n  return 2.0 * v;\n}\n")
    v = _verify(src)
    assert v.helpers == ["twice"] and v.call_graph["k"] == {"twice"}


def test_prototype_must_match_definition():
    src = ("static double twice(cap_t c);\n" + OK_KERNEL
           + "static double twice(double v) {\n  return 2.0 * v;\n}\n")
    with pytest.raises(VerifyError) as info:
        _verify(src)
    assert info.value.line == 1 and "prototype" in info.value.construct


def test_kernel_calls_are_not_recursion_without_cycle():
    src = ("static int64_t leaf(int64_t n) {\n  return n + 1;\n}\n"
           "static int64_t mid(int64_t n) {\n  return leaf(n) + leaf(n);\n}\n"
           "KERNEL void k(cap_t x) {\n  cap_store_i64(x, 0, mid(1) + leaf(2));\n}\n")
    v = _verify(src)
    assert v.call_graph == {"leaf": set(), "mid": {"leaf"}, "k": {"mid", "leaf"}}


GPU = """\
KERNEL void reduce(cap_t x, cap_t out, int64_t n)
{
    double smem_acc[256];
    int64_t t = rt_thread_idx();
    smem_acc[t] = 0.0;
    for (int64_t i = rt_block_idx() * rt_block_dim() + t; i < n; i += rt_grid_dim())
        smem_acc[t] += cap_load_f64(x, i);
    rt_sync_threads();
    if (t == 0)
        cap_store_f64(out, rt_block_idx(), smem_acc[0]);
}
"""


def test_gpu_names_only_on_cuda():
    v = _verify(GPU, target="cuda")
    assert v.local_arrays["reduce"] == {"smem_acc": (256,)}
    assert v.kernels["reduce"].n_caps == 2
    with pytest.raises(VerifyError) as info:
        _verify(GPU, target="cpu")
    assert info.value.line == 4 and "rt_thread_idx" in info.value.construct


def test_shared_memory_arrays_only_in_kernels():
    src = ("static double h(double v) {\n  double smem_tmp[8];\n  smem_tmp[0] = v;\n"
           "  return smem_tmp[0];\n}\n" + OK_KERNEL)
    with pytest.raises(VerifyError) as info:
        _verify(src, target="cuda")
    assert info.value.line == 2 and "shared-memory" in info.value.construct
    assert _verify(src, target="cpu").local_arrays["h"] == {"smem_tmp": (8,)}


def test_bad_target():
    with pytest.raises(ValueError):
        _verify(OK_KERNEL, target="tpu")


def test_api_constants():
    for t in ("f16", "f32", "f64", "i32", "i64"):
        for op in ("load", "store", "len", "offset", "alloc"):
            assert f"cap_{op}_{t}" in API_FUNCS
    assert {"cap_load_cap", "cap_store_cap", "cap_alloc_cap", "cap_to_int", "cap_from_int",
            "rt_block_idx", "rt_grid_dim"} <= API_FUNCS
    assert CUDA_API_FUNCS == {"rt_thread_idx", "rt_block_dim", "rt_sync_threads", "rt_lane_idx",
                              "rt_shfl_xor_f32", "rt_shfl_xor_f64", "rt_shfl_xor_i64",
                              "rt_shfl_idx_f32", "rt_shfl_idx_f64", "rt_shfl_idx_i64",
                              "rt_warp_sum_f32", "rt_warp_sum_f64", "rt_block_idx_y",
                              "rt_grid_dim_y", "rt_require_block_dim", "rt_warp_mma_tf32",
                              "rt_warp_mma_f32", "rt_warp_mma_f32_at"}
    assert not CUDA_API_FUNCS & API_FUNCS
    assert {"sqrt", "sqrtf", "fma", "fmaf", "tanh", "tanhf", "isnan", "isfinite"} <= MATH_FUNCS
    assert "printf" not in MATH_FUNCS and "abs" not in MATH_FUNCS


# ---- a case label must not skip an initialiser, of any type ------------------------
# The range pass (runtime/compiler/ranges.py) takes a variable's interval from its initialiser;
# a label that jumps past it leaves the variable uninitialised but "proved".
SWITCH_SKIPS = [
    ("numeric-init-before-default",  # the range pass proved t[q] from q = 2
     "KERNEL void k(cap_t x, int64_t s) {\n  double t[4];\n  switch (s) {\n  case 0: ;\n"
     "    int64_t q = 2;\n  default:\n    t[q] = 1.0;\n  }\n  cap_store_f64(x, 0, t[0]);\n}\n",
     5, "int64_t"),
    ("init-before-first-label",
     "KERNEL void k(cap_t x, int64_t s) {\n  switch (s) {\n    int q = 1;\n  case 0:\n"
     "    cap_store_f64(x, q, 1.0);\n  }\n}\n", 3, "int"),
    ("double-init",
     "KERNEL void k(cap_t x, int64_t s) {\n  switch (s) {\n  case 0:\n    ;\n"
     "    double v = 2.0;\n  case 1:\n    cap_store_f64(x, 0, v);\n  }\n}\n", 5, "double"),
    ("array-init",
     "KERNEL void k(cap_t x, int64_t s) {\n  switch (s) {\n  case 0:\n    ;\n"
     "    double a[2] = {1.0, 2.0};\n  default:\n    cap_store_f64(x, 0, a[1]);\n  }\n}\n",
     5, "double"),
]


@pytest.mark.parametrize("target", ["cpu", "cuda"])
@pytest.mark.parametrize("src,line,typ", [c[1:] for c in SWITCH_SKIPS],
                         ids=[c[0] for c in SWITCH_SKIPS])
def test_case_label_cannot_skip_an_initialiser(src: str, line: int, typ: str,
                                               target: str) -> None:
    with pytest.raises(VerifyError) as info:
        _verify(src, target=target)
    err = info.value
    assert err.line == line, str(err)
    assert err.construct == f"initialised {typ} declaration in a switch body", str(err)
    assert "case label" in err.reason and "jump past" in err.reason, str(err)


def test_switch_declarations_a_label_cannot_skip_are_accepted() -> None:
    # after the last label, inside braces, or without an initialiser: no label
    # jumps past an initialiser (C++ accepts these too)
    src = ("KERNEL void k(cap_t x, int64_t s) {\n  double t[4];\n  t[0] = 0.0;\n"
           "  switch (s) {\n  case 0: {\n    int64_t a = 1;\n    t[a] = 1.0;\n    break;\n  }\n"
           "  case 1: ;\n    int64_t b;\n    b = 2;\n    t[b] = 1.0;\n"
           "  default: ;\n    int64_t c = 3;\n    t[c] = 1.0;\n  }\n"
           "  cap_store_f64(x, 0, t[0]);\n}\n")
    for target in ("cpu", "cuda"):
        _verify(src, target=target)


# ---- parse errors: a line number and a reason --------------------------------------
PARSE_ERRORS = [
    ("missing-closing-brace",
     "KERNEL void k(cap_t x) {\n  int64_t n = 0;\n  if (n) {\n    n = 1;\n  }\n\n", 5,
     "syntax error", "'}'"),
    ("missing-two-braces",
     "KERNEL void k(cap_t x) {\n  int64_t n = 0;\n  if (n) {\n    n = 1;\n", 4,
     "syntax error", "line 3"),
    ("missing-semicolon-then-statement",
     "KERNEL void k(cap_t x) {\n  int64_t n = 0\n  n = 2;\n}\n", 2, "syntax error", "';'"),
    ("missing-semicolon-then-brace",
     "KERNEL void k(cap_t x) {\n  int64_t n = 0;\n  n = n + 1\n}\n", 3, "syntax error", "';'"),
    ("missing-semicolon-after-increment",
     "KERNEL void k(cap_t x) {\n  int64_t n = 0;\n  n++\n  n = 2;\n}\n", 3, "syntax error",
     "';'"),
    ("error-inside-a-line",  # not at the start of a line: that line, no guess
     "KERNEL void k(cap_t x) {\n  int64_t n = 0 n = 2;\n}\n", 2, "syntax error", "before: n"),
    ("after-a-parenthesis",  # `if (c)` lines end in ')': no ';' guess there
     "KERNEL void k(cap_t x) {\n  int64_t n = 0;\n  if (n)\n  }\n}\n", 4, "syntax error", "}"),
    ("incomplete-expression",  # an operator at the end of the line: not a missing ';'
     "KERNEL void k(cap_t x) {\n  int64_t n = 0;\n  n = n +\n}\n", 4, "syntax error", "before: }"),
    ("generic-selection",
     "KERNEL void k(cap_t x) {\n  int64_t n = 0;\n  n = _Generic(n, int: 2, default: 3);\n}\n",
     3, "_Generic", "C++"),
]


@pytest.mark.parametrize("src,line,construct,needle", [c[1:] for c in PARSE_ERRORS],
                         ids=[c[0] for c in PARSE_ERRORS])
def test_parse_errors_have_a_line(src: str, line: int, construct: str, needle: str) -> None:
    with pytest.raises(VerifyError) as info:
        parse(src)
    err = info.value
    assert (err.line, err.construct) == (line, construct), str(err)
    assert needle in err.reason, str(err)
    assert not err.reason.startswith("kernel:"), str(err)  # no parser file prefix


def test_missing_semicolon_says_so() -> None:
    with pytest.raises(VerifyError) as info:
        parse("KERNEL void k(cap_t x) {\n  int64_t n = 0\n  n = 2;\n}\n")
    assert "';' may be missing" in info.value.reason, str(info.value)


# ---- a KERNEL is an entry point, not a helper ---------------------------------------
# Its launch contract (rt_require_block_dim(N), group=, its caps matched to buffers)
# holds at the entry of a launch only.
KERNEL_AS_HELPER = """\
KERNEL void inner(cap_t x)
{
    rt_require_block_dim(32);
    double smem_a[32];
    int64_t t = rt_thread_idx();
    smem_a[t] = 1.0;
    cap_store_f64(x, t, smem_a[t]);
}
KERNEL void outer(cap_t x)
{
    inner(x);
}
"""


def test_kernel_called_from_a_kernel_is_refused() -> None:
    # before: accepted, and smem_a[t] was proved from inner's block size of 32 even
    # when outer ran with 1024 threads per block
    with pytest.raises(VerifyError) as info:
        _verify(KERNEL_AS_HELPER, target="cuda")
    err = info.value
    assert err.line == 11 and err.construct == "call to KERNEL 'inner'", str(err)
    assert "entry point" in err.reason and "rt_require_block_dim" in err.reason


@pytest.mark.parametrize("target", ["cpu", "cuda"])
def test_kernel_called_from_a_helper_is_refused(target: str) -> None:
    src = ("KERNEL void k(cap_t x) {\n  cap_store_f64(x, 0, 1.0);\n}\n"
           "static void h(cap_t x) {\n  k(x);\n}\n"
           "KERNEL void k2(cap_t x) {\n  h(x);\n}\n")
    with pytest.raises(VerifyError) as info:
        _verify(src, target=target)
    assert info.value.line == 5 and info.value.construct == "call to KERNEL 'k'"
