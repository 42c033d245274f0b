"""What lasts in state_dir across restarts, named once (paths.py) and written whole or not at all
(atomic.py): given-up.json, first-seen.json (the instance's clocks).
"""
