"""capseal.judge — judgment records kept apart from evidence (see issue 5)."""
