"""``python -m fastload`` runs the command-line interface."""

from fastload.cli import main

raise SystemExit(main())
