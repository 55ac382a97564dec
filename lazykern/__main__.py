"""``python -m lazykern``: the ``lazykern`` command (:func:`lazykern.cli.main`), for environments
where the console script is not on the path."""

from .cli import main

raise SystemExit(main())
