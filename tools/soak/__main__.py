import sys

from tools.soak.main import main

sys.exit(main())
