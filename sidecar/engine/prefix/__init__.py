"""Prompt prefixes computed once and copied: the prefix cache and the sharing of prefixes among
requests in flight."""
