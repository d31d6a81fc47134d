"""An app module that fails at import time."""

raise RuntimeError("this module is broken on purpose")
