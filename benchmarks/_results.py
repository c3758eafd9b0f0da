"""How every benchmark writes its results: JSON beside the table it printed."""

from __future__ import annotations

import json
from pathlib import Path


def write_results(out: str | Path, args, **results) -> None:
    """``{"config": vars(args), **results}`` as JSON at ``out`` (its folder made); says where."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"config": vars(args), **results}, indent=2))
    print(f"written: {out}")
