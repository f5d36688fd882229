"""``python -m scheduler`` is the same CLI as ``kai-scheduler``."""

from scheduler.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
