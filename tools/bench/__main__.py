"""``python -m tools.bench`` (``just bench``): see :mod:`tools.bench.main`."""

import sys

from tools.bench.main import main

sys.exit(main())
