"""The frame-time guard (issue 26): the daemon keeps out of the game's way, by what the game reports
of its frames and by watching the game's process and the machine's load."""
