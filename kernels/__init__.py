"""capqr QR kernel family: Householder QR kernels in the checked dialect.

``qr(A, variant=...)`` factors (batched) matrices into LAPACK compact form,
``householder_product`` forms Q, ``check`` judges a result (LAPACK ratios and
contest bounds), ``variants()`` lists what exists.  Kernel C lives in
``kernels/src`` (see ``kernels.sources``); ``kernels.mutate`` makes faulty
variants of it (the safety fuzz) and renders the search's genomes
(``kernels.search``).
"""

from .check import CheckReport, MatrixReport, check
from .qr import HalfOverflowError, Variant, householder_product, qr, variants
from .warmup import precompile

__all__ = ["qr", "householder_product", "variants", "check", "CheckReport", "MatrixReport",
           "Variant", "HalfOverflowError", "precompile"]
