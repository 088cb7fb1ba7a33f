"""The local backend put together: from the budget to llama.cpp settings (executor), how many
conversations to decode together (crowd), the serve loop around the engine (serve), and where
llama.cpp put each sub-layer once loaded (measured_placement). Remote mode uses none of it."""
