"""The arrays the studies pass, by what their elements are (numpy's typing): a signature
says whether it takes fields, levels or a mask."""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

Floats = NDArray[np.float64]
Ints = NDArray[np.int64]  # quantised levels, labels, counts
Complex = NDArray[np.complex128]  # optical fields and transfer matrices
Bools = NDArray[np.bool_]
