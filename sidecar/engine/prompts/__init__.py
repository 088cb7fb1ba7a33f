"""A turn's prompt: the session's history and the new turn rendered and tokenized, trimmed to fit,
with images in their places and replies kept as the tokens they were generated as."""
