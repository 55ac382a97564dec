"""``python -m lazykern.cli``: the ``lazykern`` command without the installed script."""

import sys

from . import main

sys.exit(main())
