"""Arrow in the runner process without pandas.

pyarrow looks for pandas the first time it builds an array (``pa.array`` asks a lazy shim whether
the values are pandas objects, and the shim imports pandas to answer), so on a host with pandas
installed the runner's first Arrow array imported all of pandas: 0.19 s on the 2-core CPU host,
about 0.25 s on the GPU host (the start-up samples' ``_with_nulls``), inside the start-up before
the first step. The runner process only hands Arrow tables to DuckDB; nothing in it converts
Arrow to or from pandas. So ``arrow_without_pandas`` answers the shim's look "no": an import
finder placed first on ``sys.meta_path`` refuses pandas (``ImportError``, which the shim takes
for "not installed") while one array is built, and the shim remembers the answer (it does not
look again while it only builds arrays). The finder is removed straight after, so an ``import
pandas`` later in the process works as ever, and so do pyarrow's own pandas conversions
(``Table.to_pandas`` imports it again when asked). A ``None`` in ``sys.modules`` does not do:
pyarrow's compiled import takes the ``None`` for the module.

A process that has imported pandas already is left as it is; in one that has built an Arrow
array already without importing pandas, the shim has its answer and the call changes nothing.
"""

from __future__ import annotations

import importlib.abc
import sys


class _RefusePandas(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path, target=None):
        if fullname.partition(".")[0] == "pandas":
            raise ImportError("pandas is left out of the runner process's Arrow")
        return None


def arrow_without_pandas() -> bool:
    """Settle pyarrow's pandas check as "no pandas" without importing it; whether it did."""
    if "pandas" in sys.modules:  # imported, so pyarrow's shim finds it (or has found it)
        return False
    import pyarrow as pa

    refuse = _RefusePandas()
    sys.meta_path.insert(0, refuse)
    try:
        pa.array([0])  # the shim's first look for pandas
    finally:
        sys.meta_path.remove(refuse)
    return True
