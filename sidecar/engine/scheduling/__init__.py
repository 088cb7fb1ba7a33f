"""Which sequence serves which request, and what one forward pass carries: slots, the choice of
a sequence, packing, the step plan, and when a resent turn is decided."""
