"""The reference text: Python's own pydoc topics, shipped with every CPython, so that benchmarks, the load
generator and w8a8's calibration read the same real prose on a machine with no internet."""
from __future__ import annotations

from pydoc_data.topics import topics


def reference_text() -> str:
    """Every pydoc topic in name order: ~465k characters of prose, grammar and examples."""
    return "\n\n".join(topics[name].strip() for name in sorted(topics))
