import sys

from leasework.cli import main

sys.exit(main())
