"""The daemon's life around the service: where its runtime files live, one daemon per port or
socket, stopping on signals or when the game that launched it dies, and draining on the way out."""
