"""The installed console scripts, run by the tests as a user runs them."""

import sys
from pathlib import Path

#: The ``fraud`` command installed next to this interpreter.
FRAUD = str(Path(sys.executable).parent / "fraud")
