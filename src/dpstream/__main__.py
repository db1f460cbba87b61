"""``python -m dpstream`` runs the command line (layer 6 of dpstream)."""

from .cli import main

raise SystemExit(main())
