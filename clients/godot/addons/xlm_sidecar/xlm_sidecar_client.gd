# gdlint: disable=max-public-methods
# (the client is the addon's API: one public method per daemon call, as the Unity client's)
class_name XlmSidecarClient
extends Node
## Talks to an xlm-sidecar daemon over its WebSocket bridge: NPC replies streamed token by token,
## one session per NPC, JSON-schema, grammar and candidate replies, questions about
## screenshots, embeddings and tokens, the VRAM budget, the game's frame times (sent once a second
## by frame_reporter), and launching and stopping the daemon.
## Enabling the plugin registers it as the `XlmSidecar` autoload; it also works as a plain node.
##
## Every ask returns an XlmCall at once. Calls made while the connection is still being set up
## wait and go out once it is ready; the node's _process drives the socket, so it must run.

## Authenticated and ready (the daemon's model is loaded); `status` is its GetStatus answer.
signal connected(status: Dictionary)
## The connection is gone (or could not be made); every call in flight has failed.
signal disconnected(reason: String)
## New text of a reply.
signal token_received(call_id: String, text: String)
## A reply ended well; `text` is all of it (the call's XlmCall has the details).
signal reply_finished(call_id: String, text: String)
## A call failed; `code` is a gRPC status name ("CANCELLED", "UNAVAILABLE", ...).
signal request_failed(call_id: String, code: String, message: String)
signal status_received(status: Dictionary)
## The budget a set_vram_budget call put in force.
signal budget_changed(vram_bytes: int, reloaded: bool, pause_ms: float)
signal session_ended(session_id: String, tokens_freed: int)
## The daemon this node launched is no longer running.
signal daemon_exited
## Each frame as it leaves (for debugging and for the protocol test).
signal frame_sent(frame: Dictionary)

enum State { DISCONNECTED, CONNECTING, AUTHENTICATING, READY }

const Protocol := preload("res://addons/xlm_sidecar/xlm_protocol.gd")
const Call := preload("res://addons/xlm_sidecar/xlm_call.gd")
const AskOptions := preload("res://addons/xlm_sidecar/xlm_ask_options.gd")
const Daemon := preload("res://addons/xlm_sidecar/xlm_daemon.gd")
const Tool := preload("res://addons/xlm_sidecar/xlm_tool.gd")
const FrameGuard := preload("res://addons/xlm_sidecar/xlm_frame_guard.gd")
const FrameReporter := preload("res://addons/xlm_sidecar/xlm_frame_reporter.gd")
const CALL_ID_PREFIX := "xlm-"
## A daemon that was just launched refuses connections until it listens: try again this often.
const RETRY_INTERVAL_MS := 250
const DAEMON_CHECK_INTERVAL_MS := 500
## A cancelled call the daemon has not ended by then is ended here, so `finished` always fires.
const CANCEL_CONFIRM_MS := 2000
## Room for a screenshot of max_image_side pixels in base64 (WebSocketPeer's default is 64 KiB).
const OUTBOUND_BUFFER_BYTES := 16 << 20
const INBOUND_BUFFER_BYTES := 1 << 20
## Save games move in pieces of this size: an export chunk's frame (base64) fits the inbound
## buffer, and an import part fits one frame.
const SAVE_PART_BYTES := 512 << 10
## While the daemon loads its model, its status is read again this often until it is READY.
const STATUS_POLL_MS := 250

## The daemon's WebSocket bridge: its gRPC port + 1.
@export var url := "ws://127.0.0.1:50552"
## How long connect_to_daemon keeps trying (a daemon loading a large model takes a while).
@export var connect_timeout_s := 120.0
## Screenshots are scaled down to this longer side before they are sent: the daemon scales them
## to its vision encoder's size anyway, and the bridge refuses frames over its message limit.
@export var max_image_side := 1024
@export_group("Daemon")
## Launch the daemon when the node enters the tree (stopped again when the game closes).
@export var launch_on_ready := false
@export var daemon_executable := "xlm-sidecar"
@export var daemon_port := 50551
@export var daemon_budget := "0"
## More `serve` flags, e.g. ["--model", "/path/model.gguf"].
@export var daemon_args := PackedStringArray()
@export_group("Frame reports")
## While connected, send the game's frame times to the daemon once a second (frame_reporter), so
## its frame-time guard keeps out of the frames' way.
@export var auto_report_frames := true
## The frame rate the game aims at, for the frame budget: 0 takes Engine.max_fps, or 60 fps
## when that is 0 (unlimited).
@export var target_fps := 0

var state: State = State.DISCONNECTED
## From the daemon's status, read on connecting.
var phase := ""
var model_name := ""
var vision_available := false
var vram_budget_bytes := 0
## What the daemon's frame-time guard does now: from the status, then each frame report's answer.
var frame_guard: FrameGuard = FrameGuard.new()
## Sends the frame reports (report(), interval_s, answered, the `reported` signal); made in
## _ready.
var frame_reporter: FrameReporter = null

var _socket: WebSocketPeer = null
var _token := ""
var _calls := {}
var _unsent: Array[Call] = []
var _next_id := 0
var _status_call: Call = null
## When to ask for the status again while the daemon still loads its model (0: not waiting).
var _status_poll_at_ms := 0
var _sessions_begun := {}
var _daemon: Daemon = null
var _deadline_ms := 0
var _retry_at_ms := 0
var _daemon_check_at_ms := 0
var _cancel_deadlines := {}
var _max_frame_bytes := 0


func _ready() -> void:
	frame_reporter = FrameReporter.new()
	frame_reporter.client = self
	add_child(frame_reporter, false, Node.INTERNAL_MODE_FRONT)
	if launch_on_ready:
		launch_daemon()


func _process(_delta: float) -> void:
	var now := Time.get_ticks_msec()
	if _daemon != null and now >= _daemon_check_at_ms:
		_daemon_check_at_ms = now + DAEMON_CHECK_INTERVAL_MS
		if not _daemon.is_running():
			_on_daemon_exited()
	if not _cancel_deadlines.is_empty():
		_end_unconfirmed_cancels(now)
	if _status_poll_at_ms > 0 and now >= _status_poll_at_ms and state == State.READY:
		_status_poll_at_ms = 0
		_status_call = _new_call(Protocol.METHOD_GET_STATUS, "", {})
		_send_call(_status_call, false)
	if state != State.READY and state != State.DISCONNECTED and now > _deadline_ms:
		_drop_connection(
			Protocol.STATUS_UNAVAILABLE,
			"no daemon answered at %s within %.0f s" % [url, connect_timeout_s]
		)
		return
	if _socket == null:
		if _retry_at_ms > 0 and now >= _retry_at_ms:
			_open_socket()
		return
	_socket.poll()
	var socket_state := _socket.get_ready_state()
	if socket_state == WebSocketPeer.STATE_OPEN and state == State.CONNECTING:
		state = State.AUTHENTICATING
		_send_frame(Protocol.auth_frame(_token))
	# Once the socket is closing WebSocketPeer hands out no more frames: _on_socket_closed reads
	# what the close code says instead.
	while _socket != null and _socket.get_available_packet_count() > 0:
		_on_frame_text(_socket.get_packet().get_string_from_utf8())
	if _socket != null and socket_state == WebSocketPeer.STATE_CLOSED:
		_on_socket_closed()


func _notification(what: int) -> void:
	if what == NOTIFICATION_WM_CLOSE_REQUEST or what == NOTIFICATION_PREDELETE:
		if _daemon != null:
			_daemon.stop()
			_daemon = null


## Starts `xlm-sidecar serve` with the Daemon settings above, the game's process id and a fresh
## token, and connects to it.
func launch_daemon() -> Error:
	stop_daemon()
	var daemon := Daemon.new()
	daemon.executable = daemon_executable
	daemon.port = daemon_port
	daemon.budget = daemon_budget
	daemon.extra_args = daemon_args
	var err := daemon.start()
	if err != OK:
		push_error("xlm-sidecar: could not start %s (%s)" % [daemon_executable, error_string(err)])
		return err
	_daemon = daemon
	_daemon_check_at_ms = Time.get_ticks_msec() + DAEMON_CHECK_INTERVAL_MS
	return connect_to_daemon(daemon.websocket_url(), daemon.token)


## Disconnects and stops the daemon this node launched (it waits for the daemon to exit).
func stop_daemon() -> void:
	disconnect_from_daemon()
	if _daemon != null:
		_daemon.stop()
		_daemon = null


## Connects to a running daemon's bridge with its token (the daemon's XLM_SIDECAR_TOKEN, or its
## token file). Keeps trying for connect_timeout_s; `connected` or `disconnected` tells how it went.
func connect_to_daemon(ws_url: String = "", token: String = "") -> Error:
	if state != State.DISCONNECTED:
		disconnect_from_daemon()
	if not ws_url.is_empty():
		url = ws_url
	_token = token
	_deadline_ms = Time.get_ticks_msec() + int(connect_timeout_s * 1000.0)
	state = State.CONNECTING
	# The first call on every connection reads the daemon's status (model, limits, sessions).
	_status_call = _new_call(Protocol.METHOD_GET_STATUS, "", {})
	return _open_socket()


## Closes the connection; calls in flight fail with UNAVAILABLE (the daemon cancels them).
func disconnect_from_daemon() -> void:
	if state != State.DISCONNECTED:
		_drop_connection(Protocol.STATUS_UNAVAILABLE, "disconnected by the game")


func is_ready() -> bool:
	return state == State.READY and not _loading() and _status_call == null


func _loading() -> bool:
	return phase == Protocol.PHASE_STARTING or phase == Protocol.PHASE_LOADING


## The process id of the daemon this node launched, or -1.
func daemon_pid() -> int:
	if _daemon == null:
		return -1
	return _daemon.pid


## Asks the model. With a session id (one per NPC) the daemon keeps the conversation, so later
## turns send only the new line; options.system_prompt (the NPC's persona) and
## options.world_context (shared by every NPC of a scene) go with a session's first turn only.
func ask(text: String, session_id: String = "", options: AskOptions = null) -> Call:
	var opts := _options(options)
	var system_prompt := opts.system_prompt
	var world_context := opts.world_context
	if not session_id.is_empty() and _sessions_begun.has(session_id) and not opts.reset_session:
		system_prompt = ""
		world_context = ""
	var request := Protocol.generate_request(text, system_prompt, session_id, opts, world_context)
	if not session_id.is_empty():
		_sessions_begun[session_id] = true
	return _start_call(Protocol.METHOD_GENERATE, session_id, request, opts.timeout_ms)


## Asks for a reply that is JSON valid against `schema` (structured NPC actions); read it with
## XlmCall.parse_json() once finished.
func ask_json(
	text: String, schema: Dictionary, session_id: String = "", options: AskOptions = null
) -> Call:
	var opts := _options(options).duplicate() as AskOptions
	opts.json_schema = JSON.stringify(schema)
	return ask(text, session_id, opts)


## Asks for an action as a function call: the reply calls one of `tools` (XlmTool resources)
## with arguments that fit its parameters schema; read XlmCall.tool_call_name() and
## tool_call_arguments() once finished. `tool_choice` (else options.tool_choice): "required" (the
## default), one tool's name, "auto" (a call or words) or "none". Then report how the action went
## with send_tool_result().
func ask_tools(
	text: String,
	tools: Array,
	session_id: String = "",
	options: AskOptions = null,
	tool_choice: String = ""
) -> Call:
	var opts := _options(options).duplicate() as AskOptions
	var typed: Array[Tool] = []
	typed.assign(tools)
	opts.tools = typed
	if not tool_choice.is_empty():
		opts.tool_choice = tool_choice
	return ask(text, session_id, opts)


## Tells the model how the action `call` asked for went (`result`: words, or any value JSON can
## hold) in the call's session; the reply goes on in words, or calls again if options has tools.
func send_tool_result(call: Call, result: Variant, options: AskOptions = null) -> Call:
	if call == null or not call.is_tool_call():
		var refused := _new_call(Protocol.METHOD_GENERATE, "", {})
		_calls.erase(refused.id)
		_fail_later(refused, Protocol.STATUS_INVALID_ARGUMENT, "that call made no tool call")
		return refused
	var text := Protocol.tool_result_text(call.tool_call_name(), result)
	return ask(text, call.session_id, options)


## Asks for `n` candidate replies (1 to 16) to one line, computed side by side from one prefill:
## lines for the player to choose from, or barks to pick among. The call's `candidates` holds one
## XlmCall per candidate, each with its own `token` signal, text and final_message; the call's own
## `finished` fires once every candidate has ended. Candidates are one-offs (no session): send the
## chosen line in the NPC's session afterwards. With a sampling_seed, candidate i uses seed + i.
func ask_candidates(text: String, n: int, options: AskOptions = null) -> Call:
	var opts := _options(options)
	var request := Protocol.candidates_request(
		text, opts.system_prompt, n, opts, opts.world_context
	)
	var call := _start_call(Protocol.METHOD_GENERATE, "", request, opts.timeout_ms)
	call.expect_candidates(maxi(n, 1))
	return call


## Embeddings of short texts (1 to 256, each at most 512 tokens) from the served model:
## call.embeddings() once finished, one unit vector per text (an NPC's memory: recall what the
## player said by similarity()).
func embed(texts: PackedStringArray) -> Call:
	return _start_call(Protocol.METHOD_EMBED, "", Protocol.embed_request(texts), 0)


## The served model's token ids for `text` (call.tokens() once finished): count a line before
## sending it, or find the ids XlmAskOptions.logit_bias takes. add_special adds the model's
## beginning-of-text token where it wants one; parse_special reads control-token text
## (<|im_end|>) as those tokens.
func tokenize(text: String, add_special: bool = false, parse_special: bool = false) -> Call:
	var request := Protocol.tokenize_request(text, add_special, parse_special)
	return _start_call(Protocol.METHOD_TOKENIZE, "", request, 0)


## The text of the served model's tokens (call.text once finished).
func detokenize(tokens: PackedInt32Array) -> Call:
	return _start_call(Protocol.METHOD_DETOKENIZE, "", Protocol.detokenize_request(tokens), 0)


## How alike two of embed()'s vectors are: their dot product, which is the cosine for unit
## vectors (1: the same meaning; near 0: unrelated).
static func similarity(a: PackedFloat32Array, b: PackedFloat32Array) -> float:
	var dot := 0.0
	for i in mini(a.size(), b.size()):
		dot += a[i] * b[i]
	return dot


## Asks about an image (any format; sent as top-down RGBA8, scaled to max_image_side).
## FAILED_PRECONDITION when the daemon has no vision projector (see `vision_available`).
func ask_about_image(
	image: Image, question: String, session_id: String = "", options: AskOptions = null
) -> Call:
	var opts := _options(options)
	if image == null or image.is_empty():
		var call := _new_call(Protocol.METHOD_ASK_IMAGE, session_id, {})
		_fail_later(call, Protocol.STATUS_INVALID_ARGUMENT, "the image is empty")
		return call
	var prepared := _prepare_image(image)
	var request := Protocol.ask_image_request(
		prepared.get_data(), prepared.get_width(), prepared.get_height(), question, session_id, opts
	)
	return _start_call(Protocol.METHOD_ASK_IMAGE, session_id, request, opts.timeout_ms)


## Asks about what the viewport shows now (its last drawn frame).
func ask_about_screen(
	question: String, session_id: String = "", options: AskOptions = null
) -> Call:
	var texture := get_viewport().get_texture()
	var image: Image = null
	if texture != null:
		image = texture.get_image()
	return ask_about_image(image, question, session_id, options)


## Stops a call. The daemon ends it with CANCELLED, unless it finished first (then it ends as
## usual): either way its `finished` fires.
func cancel(call_id: String) -> void:
	var call: Call = _calls.get(call_id)
	if call == null:
		return
	if _unsent.has(call):
		_unsent.erase(call)
		_calls.erase(call_id)
		_fail_later(call, Protocol.STATUS_CANCELLED, "cancelled before it was sent")
		return
	_send_frame(Protocol.cancel_frame(call_id))
	_cancel_deadlines[call_id] = Time.get_ticks_msec() + CANCEL_CONFIRM_MS


## NPC memory: adds memories to `scope` (what an NPC, a player's NPC or the whole village
## knows); call.memories() once finished. Turns that leave a session's context become memories
## by themselves, and each turn recalls the best of the scopes it reads (XlmAskOptions).
func remember(scope: String, texts: PackedStringArray, tags := PackedStringArray()) -> Call:
	var request := Protocol.remember_request(scope, texts, tags)
	return _start_call(Protocol.METHOD_REMEMBER, "", request, 0)


## The `k` memories of `scopes` closest to `query`, best first: call.recalled() once finished.
func recall(query: String, scopes: PackedStringArray, k: int = 0) -> Call:
	var request := Protocol.recall_request(query, scopes, k)
	return _start_call(Protocol.METHOD_RECALL, "", request, 0)


## Forgets memories by id, those carrying every tag (within `scope`), or a whole scope;
## call.forgotten() once finished.
func forget(ids := PackedInt64Array(), tags := PackedStringArray(), scope := "") -> Call:
	var request := Protocol.forget_request(ids, tags, scope)
	return _start_call(Protocol.METHOD_FORGET, "", request, 0)


## A scope's memories (every scope when empty), oldest first: call.memories() and
## call.memories_total() once finished.
func list_memories(scope: String = "", limit: int = 0) -> Call:
	var request := Protocol.list_memories_request(scope, limit)
	return _start_call(Protocol.METHOD_LIST_MEMORIES, "", request, 0)


## Forgets an NPC's conversation and frees its memory in the daemon.
func end_session(session_id: String) -> Call:
	var request := Protocol.end_session_request(session_id)
	return _start_call(Protocol.METHOD_END_SESSION, session_id, request, 0)


## Save games: the conversations of `session_ids` (every session when empty) as bytes for the
## game's own save (call.archive once finished: store it with FileAccess.store_buffer), with their
## KV caches when `include_kv` (large: tens of MB for a long conversation, but the NPC then
## resumes at once). call.saved_sessions() says what was saved.
func export_sessions(session_ids := PackedStringArray(), include_kv := false) -> Call:
	var request := Protocol.export_sessions_request(session_ids, include_kv, SAVE_PART_BYTES)
	return _start_call(Protocol.METHOD_EXPORT_SESSIONS, "", request, 0)


## Restores the sessions of an archive export_sessions made, after the daemon or the game
## restarted; call.saved_sessions() says per session whether its KV cache came back ("kv") or it
## is rebuilt from its text ("text", and why). A damaged save fails with INVALID_ARGUMENT and
## nothing changes; ids that exist fail too unless `replace`. A large archive goes in parts.
func import_sessions(archive: PackedByteArray, replace := false) -> Call:
	var upload_id := CALL_ID_PREFIX + str(_next_id + 1)
	var last_start := maxi(0, archive.size() - 1 - (archive.size() - 1) % SAVE_PART_BYTES)
	var last_part := archive.slice(last_start)
	if last_start == 0:
		var request := Protocol.import_sessions_request(last_part, replace, upload_id, false)
		return _start_call(Protocol.METHOD_IMPORT_SESSIONS, "", request, 0)
	# Parts one after the other (the bridge runs calls side by side): the returned call is the
	# last part's, sent once the others are in.
	var last := _new_call(
		Protocol.METHOD_IMPORT_SESSIONS,
		"",
		Protocol.import_sessions_request(last_part, replace, upload_id, false)
	)
	_calls.erase(last.id)
	_send_parts(archive, last_start, replace, upload_id, last)
	return last


func _send_parts(
	archive: PackedByteArray, last_start: int, replace: bool, upload_id: String, last: Call
) -> void:
	for start in range(0, last_start, SAVE_PART_BYTES):
		var part := archive.slice(start, start + SAVE_PART_BYTES)
		var request := Protocol.import_sessions_request(part, replace, upload_id, true)
		var call := _start_call(Protocol.METHOD_IMPORT_SESSIONS, "", request, 0)
		await call.finished
		if not call.ok():
			_fail(last, call.error_code, call.error_message)
			return
	if state != State.READY:
		_fail(last, Protocol.STATUS_UNAVAILABLE, "the connection was lost during the upload")
		return
	_calls[last.id] = last
	_send_call(last, false)


## Changes the VRAM the daemon may use ("0" = CPU only, "512M", "3G", ...; empty keeps it),
## unless negative its CPU thread cap (0 = none), and when given the host memory it may hold
## ("512M", "2G"; "0" removes the cap). Ends once the new budget is in force (`budget_changed`).
func set_vram_budget(vram_size: String, max_cpu_threads: int = -1, ram_size: String = "") -> Call:
	var request := Protocol.set_budget_request(vram_size, max_cpu_threads, ram_size)
	return _start_call(Protocol.METHOD_SET_BUDGET, "", request, 0)


func get_status() -> Call:
	return _start_call(Protocol.METHOD_GET_STATUS, "", {}, 0)


## A ReportFrames call of `request` (XlmProtocol.frame_report_request); frame_reporter.report()
## is the way in.
func _report_frames(request: Dictionary) -> Call:
	if request.is_empty():
		var refused := _new_call(Protocol.METHOD_REPORT_FRAMES, "", {})
		_calls.erase(refused.id)
		_fail_later(refused, Protocol.STATUS_INVALID_ARGUMENT, "a frame report needs frames")
		return refused
	return _start_call(Protocol.METHOD_REPORT_FRAMES, "", request, 0)


func _options(options: AskOptions) -> AskOptions:
	if options == null:
		return AskOptions.new()
	return options


func _new_call(
	method: String, session_id: String, request: Dictionary, timeout_ms: int = 0
) -> Call:
	_next_id += 1
	var call := Call.new(CALL_ID_PREFIX + str(_next_id), method, session_id)
	call.frame = Protocol.call_frame(call.id, method, request, timeout_ms)
	_calls[call.id] = call
	return call


func _start_call(method: String, session_id: String, request: Dictionary, timeout_ms: int) -> Call:
	var call := _new_call(method, session_id, request, timeout_ms)
	if state == State.DISCONNECTED:
		_calls.erase(call.id)
		_fail_later(
			call,
			Protocol.STATUS_UNAVAILABLE,
			"not connected: call connect_to_daemon() or launch_daemon() first"
		)
	elif state == State.READY:
		_send_call(call, true)
	else:
		_unsent.append(call)
	return call


func _send_call(call: Call, deferred_failure: bool) -> void:
	var text := JSON.stringify(call.frame)
	var size := text.to_utf8_buffer().size()
	var failure := ""
	var code := Protocol.STATUS_RESOURCE_EXHAUSTED
	if _max_frame_bytes > 0 and size > _max_frame_bytes:
		failure = (
			"the request is %d bytes, over the daemon's limit of %d (lower max_image_side)"
			% [size, _max_frame_bytes]
		)
	elif _socket.send_text(text) != OK:
		failure = "the request (%d bytes) did not fit in the socket's buffer" % size
	else:
		frame_sent.emit(call.frame)
		return
	_calls.erase(call.id)
	if deferred_failure:
		_fail_later(call, code, failure)
	else:
		_fail(call, code, failure)


func _send_frame(frame: Dictionary) -> void:
	if _socket != null and _socket.send_text(JSON.stringify(frame)) == OK:
		frame_sent.emit(frame)


func _open_socket() -> Error:
	_retry_at_ms = 0
	_socket = WebSocketPeer.new()
	_socket.outbound_buffer_size = OUTBOUND_BUFFER_BYTES
	_socket.inbound_buffer_size = INBOUND_BUFFER_BYTES
	var err := _socket.connect_to_url(url)
	if err != OK:
		_socket = null
		_drop_connection(Protocol.STATUS_INVALID_ARGUMENT, "cannot connect to %s" % url)
	return err


func _on_socket_closed() -> void:
	var close_code := _socket.get_close_code()
	var close_reason := _socket.get_close_reason()
	_socket = null
	var daemon_alive := _daemon == null or _daemon.is_running()
	if state == State.CONNECTING and daemon_alive and Time.get_ticks_msec() < _deadline_ms:
		_retry_at_ms = Time.get_ticks_msec() + RETRY_INTERVAL_MS
		return
	# WebSocketPeer drops frames that arrive together with the close, so a refused token may be
	# known only by the close code.
	if close_code == Protocol.CLOSE_UNAUTHENTICATED:
		_drop_connection(
			Protocol.STATUS_UNAUTHENTICATED, "the daemon refused the token (%s)" % close_reason
		)
		return
	_drop_connection(
		Protocol.STATUS_UNAVAILABLE,
		"the connection to %s closed (code %d %s)" % [url, close_code, close_reason]
	)


func _on_daemon_exited() -> void:
	_daemon = null
	daemon_exited.emit()
	if state != State.DISCONNECTED:
		_drop_connection(Protocol.STATUS_UNAVAILABLE, "the daemon exited (its log says why)")


func _drop_connection(code: String, message: String) -> void:
	_status_poll_at_ms = 0
	state = State.DISCONNECTED
	_retry_at_ms = 0
	if _socket != null:
		_socket.close()
		_socket = null
	var calls := _calls.values()
	_calls.clear()
	_unsent.clear()
	_cancel_deadlines.clear()
	_status_call = null
	for call: Call in calls:
		_fail(call, code, message)
	disconnected.emit("%s: %s" % [code, message])


func _on_frame_text(text: String) -> void:
	var parsed: Variant = JSON.parse_string(text)
	if not (parsed is Dictionary):
		push_warning("xlm-sidecar: a frame that is not a JSON object: %s" % text.left(200))
		return
	var frame: Dictionary = parsed
	if frame.has(Protocol.KEY_AUTH):
		if Protocol.read_string(frame, Protocol.KEY_AUTH) == Protocol.AUTH_OK:
			_on_authenticated()
		return
	var call_id: Variant = frame.get(Protocol.KEY_ID)
	if not (call_id is String and _calls.has(call_id)):
		_on_stray_frame(frame)
		return
	var call: Call = _calls[call_id]
	if frame.has(Protocol.KEY_CHUNK):
		_on_chunk(call, Protocol.read_dict(frame, Protocol.KEY_CHUNK))
	elif frame.has(Protocol.KEY_END):
		_calls.erase(call.id)
		call.complete({})
		reply_finished.emit(call.id, call.text)
	elif frame.has(Protocol.KEY_RESULT):
		_calls.erase(call.id)
		_on_result(call, Protocol.read_dict(frame, Protocol.KEY_RESULT))
	elif frame.has(Protocol.KEY_ERROR):
		_calls.erase(call.id)
		var error := Protocol.read_dict(frame, Protocol.KEY_ERROR)
		var code := Protocol.read_string(error, Protocol.KEY_CODE)
		var message := Protocol.read_string(error, Protocol.KEY_MESSAGE)
		_fail(call, code, message)
		if call == _status_call:
			_drop_connection(code, "reading the daemon's status failed: " + message)


## A frame tied to no call in flight: while authenticating, an error is the refused token; frames
## of a call already ended here (an unconfirmed cancel) are dropped.
func _on_stray_frame(frame: Dictionary) -> void:
	if not frame.has(Protocol.KEY_ERROR) or frame.get(Protocol.KEY_ID) != null:
		return
	var error := Protocol.read_dict(frame, Protocol.KEY_ERROR)
	var code := Protocol.read_string(error, Protocol.KEY_CODE)
	var message := Protocol.read_string(error, Protocol.KEY_MESSAGE)
	if state == State.AUTHENTICATING:
		_drop_connection(code, message)
	else:
		push_warning("xlm-sidecar: %s: %s" % [code, message])


func _on_authenticated() -> void:
	if state != State.AUTHENTICATING:
		return
	state = State.READY
	var waiting: Array[Call] = []
	if _status_call != null:
		waiting.append(_status_call)
	waiting.append_array(_unsent)
	_unsent.clear()
	for call in waiting:
		if state != State.READY:
			break
		_send_call(call, false)


func _on_chunk(call: Call, chunk: Dictionary) -> void:
	var text := call.receive_chunk(chunk)
	if not text.is_empty():
		token_received.emit(call.id, text)


func _on_result(call: Call, result: Dictionary) -> void:
	call.complete(result)
	if call.method == Protocol.METHOD_GET_STATUS:
		_apply_status(result)
		status_received.emit(result)
		if call == _status_call:
			_status_call = null
			if _loading():
				# The daemon listens before its model is loaded: ask again until it is ready, so
				# `connected` means the game's first line will be answered.
				_status_poll_at_ms = Time.get_ticks_msec() + STATUS_POLL_MS
			else:
				connected.emit(result)
	elif call.method == Protocol.METHOD_SET_BUDGET:
		var budget := Protocol.read_dict(result, Protocol.FIELD_BUDGET)
		vram_budget_bytes = Protocol.read_int64(budget, Protocol.FIELD_VRAM_BYTES)
		budget_changed.emit(
			vram_budget_bytes,
			Protocol.read_bool(result, Protocol.FIELD_RELOADED),
			Protocol.read_float(result, Protocol.FIELD_PAUSE_MS)
		)
	elif call.method == Protocol.METHOD_REPORT_FRAMES:
		frame_guard = FrameGuard.new(result)
	elif call.method == Protocol.METHOD_IMPORT_SESSIONS:
		# Restored sessions hold their persona already: their next lines must not repeat it.
		for info: Dictionary in call.saved_sessions():
			_sessions_begun[info[Protocol.FIELD_SESSION_ID]] = true
	elif call.method == Protocol.METHOD_END_SESSION:
		_sessions_begun.erase(call.session_id)
		session_ended.emit(call.session_id, Protocol.read_int(result, Protocol.FIELD_TOKENS_FREED))


func _end_unconfirmed_cancels(now: int) -> void:
	for call_id: String in _cancel_deadlines.keys():
		if now < _cancel_deadlines[call_id]:
			continue
		_cancel_deadlines.erase(call_id)
		var call: Call = _calls.get(call_id)
		if call != null:
			_calls.erase(call_id)
			_fail(call, Protocol.STATUS_CANCELLED, "cancelled (the daemon did not confirm it)")


func _apply_status(status: Dictionary) -> void:
	phase = Protocol.read_string(status, Protocol.FIELD_PHASE)
	var model := Protocol.read_dict(status, Protocol.FIELD_MODEL)
	model_name = Protocol.read_string(model, Protocol.FIELD_NAME)
	vision_available = Protocol.read_bool(model, Protocol.FIELD_VISION_AVAILABLE)
	var budget := Protocol.read_dict(status, Protocol.FIELD_BUDGET)
	vram_budget_bytes = Protocol.read_int64(budget, Protocol.FIELD_VRAM_BYTES)
	frame_guard = FrameGuard.new(Protocol.read_dict(status, Protocol.FIELD_FRAME_GUARD))
	var limits := Protocol.read_dict(status, Protocol.FIELD_LIMITS)
	# The bridge takes a message of maxMessageBytes with its bytes fields in base64 (a third
	# larger); anything bigger would close the whole connection, so it is refused here instead.
	var max_message := Protocol.read_int64(limits, Protocol.FIELD_MAX_MESSAGE_BYTES)
	@warning_ignore("integer_division")
	_max_frame_bytes = max_message + max_message / 3
	# Sessions the daemon already holds have their persona: later turns must not repeat it.
	for session: Variant in Protocol.read_array(status, Protocol.FIELD_SESSIONS):
		if session is Dictionary:
			var session_id := Protocol.read_string(session, Protocol.FIELD_SESSION_ID)
			_sessions_begun[session_id] = true


func _fail(call: Call, code: String, message: String) -> void:
	if not call.session_id.is_empty() and call.method != Protocol.METHOD_END_SESSION:
		# A turn refused outright left no conversation behind: the next one sends the persona.
		if code != Protocol.STATUS_CANCELLED and code != Protocol.STATUS_DEADLINE_EXCEEDED:
			_sessions_begun.erase(call.session_id)
	call.fail(code, message)
	request_failed.emit(call.id, code, message)


## Failures found while the game is still in the asking function are reported on the next idle
## frame, so `await call.finished` right after the ask still sees them.
func _fail_later(call: Call, code: String, message: String) -> void:
	_fail.call_deferred(call, code, message)


func _prepare_image(image: Image) -> Image:
	var longer := maxi(image.get_width(), image.get_height())
	var too_big := max_image_side > 0 and longer > max_image_side
	if image.get_format() == Image.FORMAT_RGBA8 and not image.has_mipmaps() and not too_big:
		return image
	var prepared := image.duplicate() as Image
	if prepared.is_compressed():
		prepared.decompress()
	prepared.clear_mipmaps()
	prepared.convert(Image.FORMAT_RGBA8)
	if too_big:
		var scale := float(max_image_side) / float(longer)
		prepared.resize(
			maxi(1, roundi(image.get_width() * scale)),
			maxi(1, roundi(image.get_height() * scale)),
			Image.INTERPOLATE_BILINEAR
		)
	return prepared
