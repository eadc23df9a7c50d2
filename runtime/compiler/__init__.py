"""The target-independent front end: parse, verify(target), and the analyses both lanes
lower from (loop versioning, range proofs, divergence, line hulls).  Nothing here
imports a lane; runtime/cpu and runtime/cuda import from here."""
