"""How many CPU threads a pass runs on: the planned tier's, adjusted by what passes measure."""
