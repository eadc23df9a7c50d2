"""The CPU lane: the C lowering of verified kernels (compiled as their own translation
unit next to cffi's glue) and its compile-and-cache front (`runtime.compile`)."""
