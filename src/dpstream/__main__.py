"""``python -m dpstream`` runs the command line."""

from .cli import main

raise SystemExit(main())
