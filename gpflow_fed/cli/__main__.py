"""``python -m gpflow_fed.cli``: the ``gpflow-fed`` command."""

import sys

from . import main

sys.exit(main())
