"""Progressive filling compiled (fillkernel.pyx): its interface, for the type checker."""

import numpy as np

def max_min_arrays(rows: np.ndarray, cols: np.ndarray, nf: int, cap: np.ndarray,
                   weights: np.ndarray | None = None) -> np.ndarray: ...
