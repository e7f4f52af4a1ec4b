"""One stage attempt: the runner through its lifecycle, the closer, their assembly, and GC."""
