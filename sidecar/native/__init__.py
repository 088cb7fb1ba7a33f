"""llama.cpp's C API as the engine and the vision encoder use it: the model, its context, chat
templates, tensor placement overrides and the capture of llama.cpp's log.

Only these modules (and sidecar.vision.encoder) touch native code; they import nothing from
sidecar.engine, so the engine and the vision worker can both build on them without a cycle.
"""
