"""``python -m gpext`` is the same as the ``gpext`` console script."""

from gpext.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
