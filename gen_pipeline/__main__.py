"""`python -m gen_pipeline` runs the command line."""

from .cli import main

raise SystemExit(main())
