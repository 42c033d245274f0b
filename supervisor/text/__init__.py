"""Text as the supervisor shows it: a value in a line (show.py, the one way), sizes and digits (units.py),
terminal escapes (ansi.py), secrets masked (redact.py), and stdout/stderr that may be closed or full (stdio.py).
"""

from collections.abc import Callable

# Where a line the supervisor says goes: its own log (engine/logs.SupervisorLog), or a test's list. One type,
# named once here at the bottom layer, so that every layer above can say what it is handed.
Log = Callable[[str], None]
