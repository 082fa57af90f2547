"""Compile options shared by every numba kernel."""

# Reassociation and FMA contraction let LLVM vectorize reductions; infinities and NaNs stay
# legal (no "ninf"/"nnan": silu's exp overflows to inf on purpose) and library calls stay exact
# (no "afn"). `cache=True` keeps the machine code on disk next to the sources (__pycache__), so
# only the first start on a machine compiles; `nogil` lets two engines run in two threads.
JIT = dict(cache=True, fastmath={"nsz", "arcp", "contract", "reassoc"}, nogil=True)
