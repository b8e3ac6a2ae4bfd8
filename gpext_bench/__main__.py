"""``python -m gpext_bench`` is the same as the ``gpext`` console script."""

from gpext_bench.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
