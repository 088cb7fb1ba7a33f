class_name XlmFrameGuard
extends RefCounted
## What the daemon's frame-time guard sees of the game and does about it (xlm.v1.FrameGuardState):
## the answer to each frame report, and the status's frameGuard. XlmSidecarClient.frame_guard
## holds the latest.

const Protocol := preload("res://addons/xlm_sidecar/xlm_protocol.gd")

## False when the daemon runs with --no-frame-guard: nothing below is applied.
var enabled := false
## What the guard goes by: "frame reports", "watching the game process", "machine load" or
## "nothing seen".
var source := ""
var frame_budget_ms := 0.0
## The levers now: threads per pass (0: the plan's), tokens per pass (0: the plan's batch), the
## pause after each pass, and whether the daemon runs below the game's scheduling priority.
var max_threads := 0
var max_pass_tokens := 0
var pause_ms := 0.0
var low_priority := false
## Why, in a sentence.
var reason := ""
## What the guard last saw of the game.
var game_frame_ms_p99 := 0.0
var game_over_budget_share := 0.0
var game_busy_cores := 0.0
var game_busy_threads := 0
## How many times the levers moved since the daemon started, and the reports it has had.
var changes := 0
var reports := 0
## The message as the daemon sent it.
var message := {}


## Reads a FrameGuardState message (empty: the defaults above).
func _init(state: Dictionary = {}) -> void:
	message = state
	enabled = Protocol.read_bool(state, Protocol.FIELD_ENABLED)
	source = Protocol.read_string(state, Protocol.FIELD_SOURCE)
	frame_budget_ms = Protocol.read_float(state, Protocol.FIELD_FRAME_BUDGET_MS)
	max_threads = Protocol.read_int(state, Protocol.FIELD_MAX_THREADS)
	max_pass_tokens = Protocol.read_int(state, Protocol.FIELD_MAX_PASS_TOKENS)
	pause_ms = Protocol.read_float(state, Protocol.FIELD_PAUSE_MS)
	low_priority = Protocol.read_bool(state, Protocol.FIELD_LOW_PRIORITY)
	reason = Protocol.read_string(state, Protocol.FIELD_REASON)
	game_frame_ms_p99 = Protocol.read_float(state, Protocol.FIELD_GAME_FRAME_MS_P99)
	game_over_budget_share = Protocol.read_float(state, Protocol.FIELD_GAME_OVER_BUDGET_SHARE)
	game_busy_cores = Protocol.read_float(state, Protocol.FIELD_GAME_BUSY_CORES)
	game_busy_threads = Protocol.read_int(state, Protocol.FIELD_GAME_BUSY_THREADS)
	changes = Protocol.read_int64(state, Protocol.FIELD_CHANGES)
	reports = Protocol.read_int64(state, Protocol.FIELD_REPORTS)
