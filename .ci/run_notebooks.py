"""Execute every notebook in a folder headless (used by .ci/run with SMOKE_TEST=1)."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient


def main(folder: str) -> int:
    notebooks = sorted(Path(folder).glob("*.ipynb"))
    failed = []
    for path in notebooks:
        t0 = time.perf_counter()
        nb = nbformat.read(path, as_version=4)
        client = NotebookClient(
            nb,
            timeout=900,
            kernel_name="python3",
            resources={"metadata": {"path": str(path.parent)}},
        )
        try:
            client.execute()
        except Exception as err:  # noqa: BLE001 - report and continue with the others
            failed.append(path.name)
            print(f"FAILED {path.name}: {type(err).__name__}: {str(err)[-2000:]}", flush=True)
            continue
        print(f"ok {path.name} ({time.perf_counter() - t0:.1f} s)", flush=True)
    print(f"{len(notebooks) - len(failed)} passed, {len(failed)} failed", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1] if len(sys.argv) > 1 else "tutorials"))
