class_name XlmFrameReporter
extends Node
## Tells the daemon how the game's frames go, once a second, so its frame-time guard keeps out of
## their way (fewer threads, shorter passes, pauses between them). XlmSidecarClient makes one as
## its internal child; it runs while the client is connected and `auto_report_frames` is on.
##
## Each _process adds the frame's time: the real time since the last frame (`delta` without
## Engine.time_scale). Once `interval_s` of frames are in, the report (XlmProtocol's
## frame_report_request) goes out as a ReportFrames call; nothing waits for the answer. A report
## still unanswered when the next is due makes that window be dropped, not queued. A failed report
## is warned about once (again only after one has gone through); a daemon without ReportFrames
## (UNIMPLEMENTED) stops the reports.

## Each answer, an XlmFrameGuard: what the daemon's guard does now (also the client's
## `frame_guard`).
signal reported(guard: RefCounted)

const Protocol := preload("res://addons/xlm_sidecar/xlm_protocol.gd")
const Call := preload("res://addons/xlm_sidecar/xlm_call.gd")
const FrameGuard := preload("res://addons/xlm_sidecar/xlm_frame_guard.gd")
## The daemon refuses more than 20 reports a second.
const MIN_INTERVAL_S := 0.1

## Seconds of frames each report covers (at least MIN_INTERVAL_S).
var interval_s := 1.0
## The XlmSidecarClient whose connection carries the reports; set by the client. Untyped: the
## client's script preloads this one.
var client = null
## Reports answered, and windows dropped because the last report was still out.
var answered := 0
var dropped := 0
## True once a daemon without ReportFrames said so: nothing more is sent.
var stopped := false

var _frame_ms := PackedFloat64Array()
var _total_ms := 0.0
var _last_frame_usec := 0
var _pending: Call = null
var _warned := false


func _notification(what: int) -> void:
	# The first frame after a pause spans the pause: not a frame the game struggled with.
	if what == NOTIFICATION_UNPAUSED:
		_last_frame_usec = 0
		reset()


func _process(_delta: float) -> void:
	var now := Time.get_ticks_usec()
	var last := _last_frame_usec
	_last_frame_usec = now
	if stopped or client == null or not client.auto_report_frames or not client.is_ready():
		reset()
		return
	if last > 0:
		add_frame((now - last) / 1000.0)


## One frame's time (ms). Sends the window's report once it holds interval_s of frames (or the
## most frames one report may carry); returns the call when it did.
func add_frame(frame_ms: float) -> Call:
	if is_nan(frame_ms) or frame_ms < 0.0 or client == null:
		return null
	_frame_ms.append(frame_ms)
	_total_ms += minf(frame_ms, Protocol.MAX_FRAME_MS)
	var full := _frame_ms.size() >= Protocol.MAX_REPORT_FRAMES
	if _total_ms < maxf(interval_s, MIN_INTERVAL_S) * 1000.0 and not full:
		return null
	if _pending != null and not _pending.done:
		dropped += 1
		reset()
		return null
	_pending = report(_frame_ms, 0.0, frame_budget_ms())
	reset()
	_pending.finished.connect(_on_finished.bind(_pending))
	return _pending


## Tells the daemon how a window of the game's frames went: their times in ms (any order), the
## window's length (0: their sum) and the frame budget (0: the daemon's --frame-budget-ms). The
## call's result is what the daemon's frame-time guard does now (the client's `frame_guard`
## follows it); INVALID_ARGUMENT without frames or for impossible figures. The reporter sends one
## a second by itself; this is for a game that measures its frames its own way (then turn
## auto_report_frames off).
func report(frame_ms: PackedFloat64Array, window_ms: float = 0.0, budget_ms: float = 0.0) -> Call:
	return client._report_frames(Protocol.frame_report_request(frame_ms, window_ms, budget_ms))


## The frame budget the reports carry: from the client's target_fps, else Engine.max_fps, else 60.
func frame_budget_ms() -> float:
	var fps: int = client.target_fps if client != null and client.target_fps > 0 else Engine.max_fps
	return Protocol.frame_budget_ms(fps)


## Forgets the window's frames so far.
func reset() -> void:
	_frame_ms = PackedFloat64Array()
	_total_ms = 0.0


func _on_finished(call: Call) -> void:
	if call.ok():
		answered += 1
		_warned = false
		reported.emit(FrameGuard.new(call.result))
		return
	if call.error_code == Protocol.STATUS_UNIMPLEMENTED:
		stopped = true
	if not _warned:
		_warned = true
		var next := "no more are sent" if stopped else "the reports go on"
		push_warning(
			(
				"xlm-sidecar: a frame report failed (%s: %s); %s"
				% [call.error_code, call.error_message, next]
			)
		)
