extends Node
## The addon's headless test; tests/clients/test_godot_headless.py runs it with `godot --headless`.
##
## Replays every protocol fixture through the real XlmSidecarClient against a live daemon: the
## frames it sends must be exactly the fixture's, each call must end as the fixture says, and the
## client must read the replies (finish reason, token counts, status). Then it launches a daemon of
## its own, talks to it and stops it. Prints a line per check; quits with 0 when all passed.

const Client := preload("res://addons/xlm_sidecar/xlm_sidecar_client.gd")
const Call := preload("res://addons/xlm_sidecar/xlm_call.gd")
const AskOptions := preload("res://addons/xlm_sidecar/xlm_ask_options.gd")
const Protocol := preload("res://addons/xlm_sidecar/xlm_protocol.gd")
const Tool := preload("res://addons/xlm_sidecar/xlm_tool.gd")
const Logprobs := preload("res://addons/xlm_sidecar/xlm_logprobs.gd")
const FIXTURES := "res://addons/xlm_sidecar/protocol_fixtures/"
const TOKEN_PLACEHOLDER := "$TOKEN"
## "$RESULT:<call id>:<field>": that field of an earlier call's result.
const RESULT_PLACEHOLDER := "$RESULT:"
const TOKEN_ENV := "XLM_SIDECAR_TOKEN"
const STEP_TIMEOUT_MS := 60000
const WHOLE_TIMEOUT_S := 270.0

var _failures := PackedStringArray()
var _shapes := {}


func _ready() -> void:
	get_tree().create_timer(WHOLE_TIMEOUT_S).timeout.connect(_on_timeout)
	_shapes = _load_json(FIXTURES + "shapes.json")
	var prelude := _load_json(FIXTURES + "connect.json")
	var url := OS.get_environment("XLM_TEST_WS_URL")
	var token := OS.get_environment("XLM_TEST_TOKEN")
	var vision := OS.get_environment("XLM_TEST_VISION") == "1"
	for file_name in _fixture_files():
		await _run_fixture(file_name, prelude, url, token, vision)
	await _run_frame_reports(url, token)
	if not OS.get_environment("XLM_TEST_DAEMON_EXE").is_empty():
		await _run_launch()
	if _failures.is_empty():
		print("ALL PASSED")
		get_tree().quit(0)
	else:
		print("FAILED: %d check(s)" % _failures.size())
		get_tree().quit(1)


func _on_timeout() -> void:
	print("FAIL the whole test took over %.0f s" % WHOLE_TIMEOUT_S)
	get_tree().quit(1)


func _fixture_files() -> PackedStringArray:
	var names := PackedStringArray()
	for file_name in DirAccess.get_files_at(FIXTURES):
		if file_name.ends_with(".json") and not (file_name in ["shapes.json", "connect.json"]):
			names.append(file_name)
	names.sort()
	return names


func _run_fixture(
	file_name: String, prelude: Dictionary, url: String, daemon_token: String, vision: bool
) -> void:
	var fixture := _load_json(FIXTURES + file_name)
	if fixture.get("needs", "") == "smollm2":
		# Tool calls need the real model: a second daemon, serving SmolLM2.
		url = OS.get_environment("XLM_TEST_SMOLLM2_WS_URL")
		daemon_token = OS.get_environment("XLM_TEST_SMOLLM2_TOKEN")
		if url.is_empty():
			print("skip %s: no SmolLM2 daemon (XLM_TEST_SMOLLM2_WS_URL)" % file_name)
			return
	var token: String = fixture.get("token", daemon_token)
	var steps: Array = []
	if fixture.get("prelude", true):
		steps.append_array(prelude["steps"])
	steps.append_array(fixture["steps"])
	# Without a vision projector the image question fails, but its frame must still be right.
	var lax: bool = fixture.get("needs", "") == "vision" and not vision
	var client: Client = Client.new()
	# Only the fixture's frames: the automatic frame reports are checked on their own.
	client.auto_report_frames = false
	add_child(client)
	var sent: Array = []
	var events := {"connected": false, "disconnected": ""}
	client.frame_sent.connect(func(frame: Dictionary) -> void: sent.append(_normalized(frame)))
	client.connected.connect(func(_status: Dictionary) -> void: events["connected"] = true)
	client.disconnected.connect(func(reason: String) -> void: events["disconnected"] = reason)
	var calls := {}
	var expected: Array = []
	for step: Dictionary in steps:
		for frame: Variant in step["sends"]:
			expected.append(_normalized(_substitute(frame, token, calls)))
		var where := "%s %s" % [file_name, step["do"]]
		var passed: bool = await _run_step(client, step, calls, events, url, token, lax, where)
		if not passed:
			break
	_check(
		file_name + ": the frames sent are the fixture's",
		JSON.stringify(sent) == JSON.stringify(expected),
		"\n  sent     %s\n  expected %s" % [JSON.stringify(sent), JSON.stringify(expected)]
	)
	client.disconnect_from_daemon()
	client.queue_free()


func _run_step(
	client: Client,
	step: Dictionary,
	calls: Dictionary,
	events: Dictionary,
	url: String,
	token: String,
	lax: bool,
	where: String
) -> bool:
	var args: Dictionary = step.get("args", {})
	var call: Call = null
	match step["do"]:
		"connect":
			client.connect_to_daemon(url, token)
		"automatic":
			pass
		"ask":
			call = client.ask(args["text"], args["session_id"], _options(args))
		"ask_json":
			call = client.ask_json(args["text"], args["schema"], args["session_id"], _options(args))
		"ask_tools":
			var tools: Array = []
			for spec: Dictionary in args["tools"]:
				tools.append(Tool.new(spec["name"], spec["description"], spec["parameters"]))
			call = client.ask_tools(
				args["text"], tools, args["session_id"], _options(args), args["tool_choice"]
			)
		"ask_candidates":
			call = client.ask_candidates(args["text"], int(args["n"]), _options(args))
		"embed":
			var texts: Array = args["texts"]
			call = client.embed(PackedStringArray(texts))
		"tokenize":
			call = client.tokenize(args["text"], args["add_special"], args["parse_special"])
		"detokenize":
			var ids := PackedInt32Array()
			for token_id: Variant in _substitute(args["tokens"], "", calls):
				ids.append(int(token_id))
			call = client.detokenize(ids)
		"send_tool_result":
			call = client.send_tool_result(calls[args["call_id"]], args["result"], _options(args))
		"ask_about_image":
			var image := _image(args["image"])
			call = client.ask_about_image(
				image, args["question"], args["session_id"], _options(args)
			)
		"cancel":
			client.cancel(args["call_id"])
		"set_vram_budget":
			call = client.set_vram_budget(
				args["vram_size"], int(args["max_cpu_threads"]), args.get("ram_size", "")
			)
		"frame_reporter.report":
			var frame_ms: Array = args["frame_ms"]
			call = client.frame_reporter.report(
				PackedFloat64Array(frame_ms), float(args["window_ms"]), float(args["budget_ms"])
			)
		"get_status":
			call = client.get_status()
		"end_session":
			call = client.end_session(args["session_id"])
		"remember":
			var texts: Array = args["texts"]
			var tags: Array = args["tags"]
			call = client.remember(args["scope"], PackedStringArray(texts), PackedStringArray(tags))
		"recall":
			var scopes: Array = args["scopes"]
			call = client.recall(args["query"], PackedStringArray(scopes), int(args["k"]))
		"list_memories":
			call = client.list_memories(args["scope"], int(args["limit"]))
		"forget":
			var ids := PackedInt64Array()
			for memory_id: Variant in args["ids"]:
				ids.append(int(memory_id))
			var tags: Array = args["tags"]
			call = client.forget(ids, PackedStringArray(tags), args["scope"])
		_:
			return _check(where, false, "a step this test does not know")
	if call != null:
		calls[call.id] = call
	return await _await(client, step["await"], calls, events, lax, where)


func _await(
	client: Client,
	wait: Dictionary,
	calls: Dictionary,
	events: Dictionary,
	lax: bool,
	where: String
) -> bool:
	var deadline := Time.get_ticks_msec() + STEP_TIMEOUT_MS
	if wait.has("frame"):
		while client.state != Client.State.READY and events["disconnected"] == "":
			if not await _tick(deadline):
				break
		return _check(where + ": authenticated", client.is_ready(), events["disconnected"])
	var call_id: Variant = wait["id"]
	if call_id == null:
		while events["disconnected"] == "":
			if not await _tick(deadline):
				break
		var reason: String = events["disconnected"]
		return _check(where + ": refused", reason.begins_with(wait["error_code"]), reason)
	if not calls.has(call_id):
		# The client's own status call on connecting.
		while not events["connected"] and events["disconnected"] == "":
			if not await _tick(deadline):
				break
		var read := client.phase == Protocol.PHASE_READY and not client.model_name.is_empty()
		var detail := "phase %s, model %s, %s" % [client.phase, client.model_name, events]
		return _check(
			where + ": connected and read the status", events["connected"] and read, detail
		)
	var call: Call = calls[call_id]
	if wait.get("until", "") == "chunk":
		while call.token_count == 0 and not call.done:
			if not await _tick(deadline):
				break
		return _check(where + ": streaming", call.token_count > 0 or lax, _describe(call))
	while not call.done:
		if not await _tick(deadline):
			break
	if lax:
		return _check(where + ": ended (no vision projector: outcome not checked)", call.done, "")
	return _check_end(call, wait, where)


func _check_end(call: Call, wait: Dictionary, where: String) -> bool:
	if wait["terminal"] == "error":
		var code: String = wait["error_code"]
		return _check(where + ": failed with " + code, call.error_code == code, _describe(call))
	if not _check(where + ": ended well", call.ok(), _describe(call)):
		return false
	var passed := true
	if wait.has("final") and not wait.has("candidates"):
		var reasons: Array = _shapes["enums"]["FinishReason"]
		passed = _check(where + ": finish reason", call.finish_reason() in reasons, _describe(call))
		passed = (
			_check(
				where + ": token counts agree",
				call.completion_tokens() == call.token_count,
				_describe(call)
			)
			and passed
		)
	if wait.has("candidates"):
		passed = _check_candidates(call, int(wait["candidates"]), where) and passed
	if wait.has("tool_call"):
		passed = _check_tool_call(call, wait["tool_call"], where) and passed
	passed = _check_token_controls(call, wait, where) and passed
	var message: Dictionary = call.final_message if wait.has("final") else call.result
	for dotted: String in wait.get("positive", []):
		var value: Variant = message
		for part in dotted.split("."):
			value = value.get(part, 0) if value is Dictionary else 0
		passed = _check(where + ": %s > 0" % dotted, float(value) > 0.0, str(message)) and passed
	return passed


## "none": no call; "any": a call of one of the request's tools; else that tool's name. The
## arguments must be an object holding the tool's required parameters (the Python replay
## validates them against the whole schema).
func _check_tool_call(call: Call, expected: String, where: String) -> bool:
	if expected == "none":
		return _check(where + ": no tool call", not call.is_tool_call(), _describe(call))
	var reason_ok := call.finish_reason() == Protocol.FINISH_TOOL_CALL
	var tools: Array = call.frame[Protocol.KEY_REQUEST].get(Protocol.FIELD_TOOLS, [])
	var schema: Variant = null
	for tool: Dictionary in tools:
		if tool[Protocol.FIELD_NAME] == call.tool_call_name():
			schema = JSON.parse_string(tool.get(Protocol.FIELD_PARAMETERS_JSON_SCHEMA, "{}"))
	var named := schema != null and (expected == "any" or call.tool_call_name() == expected)
	var arguments: Variant = call.tool_call_arguments()
	var fits := arguments is Dictionary
	if fits and schema is Dictionary:
		for required: String in schema.get("required", []):
			fits = fits and arguments.has(required)
	var detail := "%s %s" % [call.tool_call_name(), str(arguments)]
	return _check(where + ": a tool call (%s)" % expected, reason_ok and named and fits, detail)


## Each candidate of an ask_candidates call ended with its own final, its tokens its own.
func _check_candidates(call: Call, n: int, where: String) -> bool:
	var reasons: Array = _shapes["enums"]["FinishReason"]
	var passed := _check(
		where + ": %d candidates" % n, call.candidates.size() == n, _describe(call)
	)
	for position in call.candidates.size():
		var each: Call = call.candidates[position]
		var label := "%s: candidate %d" % [where, position]
		var ended := each.ok() and each.index == position and each.finish_reason() in reasons
		passed = _check(label + " ended with its own final", ended, _describe(each)) and passed
		var agree := each.token_count > 0 and each.completion_tokens() == each.token_count
		passed = _check(label + ": token counts agree", agree, _describe(each)) and passed
	return passed


## What the token-control fixtures ask of a call (the Python replay checks the same frames).
func _check_token_controls(call: Call, wait: Dictionary, where: String) -> bool:
	var passed := true
	if wait.has("logprobs"):
		passed = _check_logprobs(call, int(wait["logprobs"]), where) and passed
	if wait.has("every_token"):
		var wanted := int(wait["every_token"])
		var every := call.token_count > 0
		for token_id in call.token_ids:
			every = every and token_id == wanted
		var label := where + ": every token is %d" % wanted
		passed = _check(label, every, str(call.token_ids)) and passed
	if wait.has("text_in"):
		var allowed: Array = wait["text_in"]
		var label := where + ": the text is one of %s" % str(allowed)
		passed = _check(label, call.text in allowed, call.text) and passed
	if wait.has("embeddings"):
		passed = _check_embeddings(call, int(wait["embeddings"]), where) and passed
	var equals: Dictionary = wait.get("equals", {})
	for field: String in equals:
		var same := JSON.stringify(call.result.get(field)) == JSON.stringify(equals[field])
		var label := where + ": %s is %s" % [field, str(equals[field])]
		passed = _check(label, same, str(call.result)) and passed
	var lengths: Dictionary = wait.get("lengths", {})
	for field: String in lengths:
		var value: Variant = call.result.get(field, [])
		var size: int = value.size() if value is Array else -1
		var label := where + ": %s has %d entries" % [field, int(lengths[field])]
		passed = _check(label, size == int(lengths[field]), str(call.result)) and passed
	return passed


## One entry per token, each a log probability with as many alternatives as asked.
func _check_logprobs(call: Call, alternatives: int, where: String) -> bool:
	var logprobs: Logprobs = call.logprobs
	var values := logprobs.values()
	var fits := call.token_count > 0 and logprobs.size() == call.token_count
	for position in logprobs.size():
		fits = fits and logprobs.token_id(position) == call.token_ids[position]
		fits = fits and values[position] <= 0.0
		fits = fits and logprobs.alternative_ids(position).size() == alternatives
	var label := where + ": a log probability per token, %d alternatives" % alternatives
	return _check(label, fits, str(logprobs.entries))


## As many embeddings as texts, of one length, each a unit vector.
func _check_embeddings(call: Call, count: int, where: String) -> bool:
	var vectors := call.embeddings()
	var fits := count > 0 and vectors.size() == count and vectors[0].size() > 0
	for vector in vectors:
		fits = fits and vector.size() == vectors[0].size()
		fits = fits and absf(Client.similarity(vector, vector) - 1.0) < 1e-3
	var label := where + ": %d unit vectors of one length" % count
	return _check(label, fits, str(call.result).left(200))


## The client reports the game's frames by itself while connected (here every 0.25 s of frames),
## reads the guard's state from the status and from each answer, and stops when told to.
func _run_frame_reports(url: String, token: String) -> void:
	var client: Client = Client.new()
	add_child(client)
	client.frame_reporter.interval_s = 0.25
	var reports: Array = []
	var on_frame := func(frame: Dictionary) -> void:
		if frame.get(Protocol.KEY_METHOD) == Protocol.METHOD_REPORT_FRAMES:
			reports.append(frame[Protocol.KEY_REQUEST])
	client.frame_sent.connect(on_frame)
	client.connect_to_daemon(url, token)
	var deadline := Time.get_ticks_msec() + STEP_TIMEOUT_MS
	while not client.is_ready():
		if not await _tick(deadline):
			break
	var status_guard := client.frame_guard.source
	_check("frames: the status's frame guard is read", not status_guard.is_empty(), status_guard)
	while client.frame_reporter.answered < 2:
		if not await _tick(deadline):
			break
	_check("frames: reports go out by themselves", reports.size() >= 2, str(reports))
	if reports.is_empty():
		client.queue_free()
		return
	var report: Dictionary = reports[0]
	var frames := int(report[Protocol.FIELD_FRAMES])
	var window := float(report[Protocol.FIELD_WINDOW_MS])
	var budget := Protocol.frame_budget_ms(Engine.max_fps)
	var fits := frames >= 1 and frames <= Protocol.MAX_REPORT_FRAMES and window > 0.0
	_check("frames: a window of frames", fits, str(report))
	var sent_budget := float(report[Protocol.FIELD_FRAME_BUDGET_MS])
	_check("frames: the budget of Engine.max_fps or 60", is_equal_approx(sent_budget, budget), "")
	var guard := client.frame_guard
	_check("frames: the answer is the guard's state", guard.reports >= 2, str(guard.message))
	var empty := client.frame_reporter.report(PackedFloat64Array())
	await empty.finished
	var refused := empty.error_code == Protocol.STATUS_INVALID_ARGUMENT
	_check("frames: a report without frames is refused", refused, _describe(empty))
	client.auto_report_frames = false
	var before := reports.size()
	var quiet := Time.get_ticks_msec() + 600
	while Time.get_ticks_msec() < quiet:
		await get_tree().process_frame
	_check("frames: off, none are sent", reports.size() == before, str(reports.size()))
	client.disconnect_from_daemon()
	client.queue_free()


func _run_launch() -> void:
	var client: Client = Client.new()
	client.daemon_executable = OS.get_environment("XLM_TEST_DAEMON_EXE")
	client.daemon_port = OS.get_environment("XLM_TEST_DAEMON_PORT").to_int()
	var daemon_args: Array = JSON.parse_string(OS.get_environment("XLM_TEST_DAEMON_ARGS"))
	client.daemon_args = PackedStringArray(daemon_args)
	var events := {"connected": false, "disconnected": ""}
	client.connected.connect(func(_status: Dictionary) -> void: events["connected"] = true)
	client.disconnected.connect(func(reason: String) -> void: events["disconnected"] = reason)
	add_child(client)
	var err := client.launch_daemon()
	if not _check("launch: started", err == OK, error_string(err)):
		return
	var pid := client.daemon_pid()
	var deadline := Time.get_ticks_msec() + STEP_TIMEOUT_MS
	while not events["connected"] and events["disconnected"] == "":
		if not await _tick(deadline):
			break
	if _check("launch: connected with its token", events["connected"], str(events)):
		_check_launch_arguments(pid)
		var options := AskOptions.new()
		options.max_tokens = 4
		var call := client.ask("Hello!", "", options)
		while not call.done:
			if not await _tick(deadline):
				break
		_check("launch: the launched daemon answers", call.ok(), _describe(call))
	client.stop_daemon()
	_check("launch: stopped", not OS.is_process_running(pid), "pid %d still runs" % pid)
	_check("launch: disconnected", client.state == Client.State.DISCONNECTED, str(client.state))
	var leaked := OS.has_environment(TOKEN_ENV)
	_check("launch: the token left the game's environment", not leaked, "")
	client.queue_free()


## On Linux: the daemon's command line carries the game's pid but not the token, which it got
## through its environment.
func _check_launch_arguments(pid: int) -> void:
	var cmdline := _proc_strings("/proc/%d/cmdline" % pid)
	if cmdline.is_empty():
		print("skip launch: no /proc here to read the daemon's command line")
		return
	var at := cmdline.find("--parent-pid")
	var given := ""
	if at >= 0 and at + 1 < cmdline.size():
		given = cmdline[at + 1]
	_check("launch: --parent-pid is the game's", given == str(OS.get_process_id()), str(cmdline))
	var token := ""
	for entry in _proc_strings("/proc/%d/environ" % pid):
		if entry.begins_with(TOKEN_ENV + "="):
			token = entry.substr(TOKEN_ENV.length() + 1)
	_check("launch: the daemon got a token in its environment", token.length() >= 16, token)
	var joined := " ".join(cmdline)
	_check("launch: the token is not on its command line", joined.find(token) < 0, joined)


## A /proc file's NUL-separated strings. Such files report a length of 0, so they are read up to
## a fixed size rather than by length.
func _proc_strings(path: String) -> PackedStringArray:
	var strings := PackedStringArray()
	var file := FileAccess.open(path, FileAccess.READ)
	if file == null:
		return strings
	var data := file.get_buffer(1 << 20)
	file.close()
	var current := PackedByteArray()
	for byte in data:
		if byte == 0:
			strings.append(current.get_string_from_utf8())
			current = PackedByteArray()
		else:
			current.append(byte)
	return strings


func _options(args: Dictionary) -> AskOptions:
	var options := AskOptions.new()
	var given: Dictionary = args.get("options", {})
	for key: String in given:
		var value: Variant = given[key]
		var current: Variant = options.get(key)
		if current is int:
			value = int(value)
		elif current is PackedStringArray:
			var items: Array = value
			value = PackedStringArray(items)
		options.set(key, value)
	return options


func _image(spec: Dictionary) -> Image:
	var pixels := Marshalls.base64_to_raw(spec["rgba_base64"])
	var width := int(spec["width"])
	var height := int(spec["height"])
	return Image.create_from_data(width, height, false, Image.FORMAT_RGBA8, pixels)


func _substitute(value: Variant, token: String, calls: Dictionary) -> Variant:
	if value is String and value == TOKEN_PLACEHOLDER:
		return token
	if value is String and value.begins_with(RESULT_PLACEHOLDER):
		var parts: PackedStringArray = value.trim_prefix(RESULT_PLACEHOLDER).split(":")
		var earlier: Call = calls.get(parts[0])
		return null if earlier == null else earlier.result.get(parts[1])
	if value is Dictionary:
		var copy := {}
		for key: Variant in value:
			copy[key] = _substitute(value[key], token, calls)
		return copy
	if value is Array:
		var items: Array = []
		for item: Variant in value:
			items.append(_substitute(item, token, calls))
		return items
	return value


## JSON turns every number into a float: both sides go through it before they are compared.
func _normalized(value: Variant) -> Variant:
	return JSON.parse_string(JSON.stringify(value))


func _describe(call: Call) -> String:
	return (
		"%s %s: %s %s, finish %s, %d tokens (%d reported)"
		% [
			call.id,
			call.method,
			call.error_code,
			call.error_message,
			call.finish_reason(),
			call.token_count,
			call.completion_tokens()
		]
	)


func _tick(deadline: int) -> bool:
	await get_tree().process_frame
	return Time.get_ticks_msec() < deadline


func _check(label: String, passed: bool, detail: String) -> bool:
	if passed:
		print("ok   " + label)
	else:
		print("FAIL " + label + ": " + detail)
		_failures.append(label)
	return passed


func _load_json(path: String) -> Dictionary:
	var parsed: Variant = JSON.parse_string(FileAccess.get_file_as_string(path))
	if parsed is Dictionary:
		return parsed
	_check("read " + path, false, "not a JSON object")
	return {}
