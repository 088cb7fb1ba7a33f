class_name XlmProtocol
extends RefCounted
## The daemon's WebSocket frames (xlm.v1 in protobuf's JSON mapping), built and read in one place.
##
## Every name the addon puts on the wire or reads from it is a constant here, and
## protocol_fixtures/*.json spells out the same frames: a test checks that the two agree and
## replays the fixtures against a live daemon, so a protocol change cannot silently break the addon.

# Frame envelope (sidecar/service/json_frames.py).
const KEY_ID := "id"
const KEY_METHOD := "method"
const KEY_REQUEST := "request"
const KEY_CANCEL := "cancel"
const KEY_AUTH := "auth"
const KEY_TIMEOUT_MS := "timeoutMs"
const KEY_CHUNK := "chunk"
const KEY_RESULT := "result"
const KEY_END := "end"
const KEY_ERROR := "error"
const KEY_CODE := "code"
const KEY_MESSAGE := "message"
const AUTH_OK := "ok"
## The bridge closes a connection whose token it refuses with this code (policy violation).
const CLOSE_UNAUTHENTICATED := 1008

# RPCs of xlm.v1.Sidecar the addon calls.
const METHOD_GENERATE := "Generate"
const METHOD_ASK_IMAGE := "AskImage"
const METHOD_SET_BUDGET := "SetBudget"
const METHOD_GET_STATUS := "GetStatus"
const METHOD_END_SESSION := "EndSession"
const METHOD_EMBED := "Embed"
const METHOD_TOKENIZE := "Tokenize"
const METHOD_DETOKENIZE := "Detokenize"
const METHOD_REPORT_FRAMES := "ReportFrames"
const METHOD_EXPORT_SESSIONS := "ExportSessions"
const METHOD_IMPORT_SESSIONS := "ImportSessions"
const METHOD_REMEMBER := "Remember"
const METHOD_RECALL := "Recall"
const METHOD_FORGET := "Forget"
const METHOD_LIST_MEMORIES := "ListMemories"

# NPC memory: requests, replies, a Memory's fields and a session's MemoryOptions.
const FIELD_MEMORY := "memory"
const FIELD_MEMORIES := "memories"
const FIELD_SCOPE := "scope"
const FIELD_READ_SCOPES := "readScopes"
const FIELD_SCOPES := "scopes"
const FIELD_TEXTS := "texts"
const FIELD_TAGS := "tags"
const FIELD_QUERY := "query"
const FIELD_K := "k"
const FIELD_IDS := "ids"
const FIELD_SCORE := "score"
const FIELD_FORGOTTEN := "forgotten"
const FIELD_TOTAL := "total"
const FIELD_LIMIT := "limit"
const FIELD_MEMORIES_USED := "memoriesUsed"
const FIELD_MEMORIES_ADDED := "memoriesAdded"

# Request fields.
const FIELD_MESSAGES := "messages"
const FIELD_ROLE := "role"
const FIELD_CONTENT := "content"
const FIELD_SAMPLING := "sampling"
const FIELD_TEMPERATURE := "temperature"
const FIELD_SEED := "seed"
const FIELD_MAX_TOKENS := "maxTokens"
const FIELD_STOP := "stop"
const FIELD_JSON_SCHEMA := "jsonSchema"
const FIELD_SESSION_ID := "sessionId"
const FIELD_RESET_SESSION := "resetSession"
const FIELD_CONTEXT := "context"
const FIELD_QUESTION := "question"
const FIELD_IMAGE := "image"
const FIELD_RAW := "raw"
const FIELD_PIXELS := "pixels"
const FIELD_WIDTH := "width"
const FIELD_HEIGHT := "height"
const FIELD_FORMAT := "format"
const FIELD_VRAM_SIZE := "vramSize"
const FIELD_MAX_CPU_THREADS := "maxCpuThreads"
const FIELD_RAM_SIZE := "ramSize"
const FIELD_TOOLS := "tools"
const FIELD_DESCRIPTION := "description"
const FIELD_PARAMETERS_JSON_SCHEMA := "parametersJsonSchema"
const FIELD_TOOL_CHOICE := "toolChoice"
const FIELD_LOGIT_BIAS := "logitBias"
## Asked for in a request, and the log probabilities of a chunk's tokens in a reply.
const FIELD_LOGPROBS := "logprobs"
const FIELD_N := "n"
const FIELD_GRAMMAR := "grammar"
const FIELD_INPUT := "input"
const FIELD_ADD_SPECIAL := "addSpecial"
const FIELD_PARSE_SPECIAL := "parseSpecial"
## A Tokenize reply's ids, and a Detokenize request's.
const FIELD_TOKENS := "tokens"
# FrameReport: one window of the game's frames, in milliseconds.
const FIELD_FRAMES := "frames"
const FIELD_WINDOW_MS := "windowMs"
const FIELD_FRAME_MS_P50 := "frameMsP50"
const FIELD_FRAME_MS_P99 := "frameMsP99"
const FIELD_FRAME_MS_MAX := "frameMsMax"
const FIELD_FRAMES_OVER_BUDGET := "framesOverBudget"
## Sent in a FrameReport, and read back in FrameGuardState.
const FIELD_FRAME_BUDGET_MS := "frameBudgetMs"
const FIELD_GPU_FRAME_MS_P99 := "gpuFrameMsP99"
# Save games: ExportSessions' request and chunks, ImportSessions' request and reply.
const FIELD_SESSION_IDS := "sessionIds"
const FIELD_INCLUDE_KV := "includeKv"
const FIELD_CHUNK_BYTES := "chunkBytes"
const FIELD_DATA := "data"
const FIELD_LAST := "last"
const FIELD_ARCHIVE_BYTES := "archiveBytes"
const FIELD_ARCHIVE := "archive"
const FIELD_REPLACE := "replace"
const FIELD_UPLOAD_ID := "uploadId"
const FIELD_MORE := "more"
const FIELD_RECEIVED_BYTES := "receivedBytes"
## SavedSessionInfo: "kv" or "text" (and FIELD_REASON why), the KV bytes saved.
const FIELD_RESTORED := "restored"
const FIELD_KV_BYTES := "kvBytes"

# Reply fields the addon reads.
const FIELD_TEXT := "text"
const FIELD_TOKEN_IDS := "tokenIds"
const FIELD_FINAL := "final"
const FIELD_FINISH_REASON := "finishReason"
const FIELD_USAGE := "usage"
const FIELD_PROMPT_TOKENS := "promptTokens"
const FIELD_CACHED_PROMPT_TOKENS := "cachedPromptTokens"
const FIELD_COMPLETION_TOKENS := "completionTokens"
const FIELD_TIMINGS := "timings"
const FIELD_TIME_TO_FIRST_TOKEN_MS := "timeToFirstTokenMs"
const FIELD_DECODE_TOKENS_PER_S := "decodeTokensPerS"
const FIELD_ENCODED_WIDTH := "encodedWidth"
const FIELD_ENCODED_HEIGHT := "encodedHeight"
const FIELD_IMAGE_TOKENS := "imageTokens"
const FIELD_PHASE := "phase"
const FIELD_MODEL := "model"
const FIELD_NAME := "name"
const FIELD_VISION_AVAILABLE := "visionAvailable"
const FIELD_BUDGET := "budget"
const FIELD_VRAM_BYTES := "vramBytes"
const FIELD_SESSIONS := "sessions"
const FIELD_LIMITS := "limits"
const FIELD_MAX_MESSAGE_BYTES := "maxMessageBytes"
const FIELD_RELOADED := "reloaded"
const FIELD_PAUSE_MS := "pauseMs"
const FIELD_TOKENS_FREED := "tokensFreed"
const FIELD_TOOL_CALL := "toolCall"
const FIELD_ARGUMENTS_JSON := "argumentsJson"
const FIELD_INDEX := "index"
const FIELD_TOKEN_ID := "tokenId"
const FIELD_PIECE := "piece"
const FIELD_LOGPROB := "logprob"
const FIELD_TOP := "top"
const FIELD_EMBEDDINGS := "embeddings"
const FIELD_VALUES := "values"
# FrameGuardState (ReportFrames' answer, and the status's frameGuard).
const FIELD_FRAME_GUARD := "frameGuard"
const FIELD_ENABLED := "enabled"
const FIELD_SOURCE := "source"
const FIELD_MAX_THREADS := "maxThreads"
const FIELD_MAX_PASS_TOKENS := "maxPassTokens"
const FIELD_LOW_PRIORITY := "lowPriority"
const FIELD_REASON := "reason"
const FIELD_GAME_FRAME_MS_P99 := "gameFrameMsP99"
const FIELD_GAME_OVER_BUDGET_SHARE := "gameOverBudgetShare"
const FIELD_GAME_BUSY_CORES := "gameBusyCores"
const FIELD_GAME_BUSY_THREADS := "gameBusyThreads"
const FIELD_CHANGES := "changes"
const FIELD_REPORTS := "reports"

# Enum values, by name as the JSON mapping writes them.
const ROLE_SYSTEM := "system"
const ROLE_USER := "user"
const PIXEL_FORMAT_RGBA8 := "PIXEL_FORMAT_RGBA8"
const FINISH_STOP := "FINISH_REASON_STOP"
const FINISH_LENGTH := "FINISH_REASON_LENGTH"
const FINISH_STOP_STRING := "FINISH_REASON_STOP_STRING"
const FINISH_CANCELLED := "FINISH_REASON_CANCELLED"
const FINISH_CONTEXT_FULL := "FINISH_REASON_CONTEXT_FULL"
const FINISH_TOOL_CALL := "FINISH_REASON_TOOL_CALL"
## tool_choice values besides a tool's own name.
const TOOL_CHOICE_REQUIRED := "required"
const TOOL_CHOICE_AUTO := "auto"
const TOOL_CHOICE_NONE := "none"
const PHASE_LOADING := "ENGINE_PHASE_LOADING"
## Listening, the model not loaded yet (LOADING, then READY follow).
const PHASE_STARTING := "ENGINE_PHASE_STARTING"
const PHASE_READY := "ENGINE_PHASE_READY"
const PHASE_RELOADING := "ENGINE_PHASE_RELOADING"
const PHASE_DRAINING := "ENGINE_PHASE_DRAINING"

# Error codes: gRPC status names. The addon also uses them for failures it detects itself.
const STATUS_CANCELLED := "CANCELLED"
const STATUS_INVALID_ARGUMENT := "INVALID_ARGUMENT"
const STATUS_DEADLINE_EXCEEDED := "DEADLINE_EXCEEDED"
const STATUS_NOT_FOUND := "NOT_FOUND"
const STATUS_RESOURCE_EXHAUSTED := "RESOURCE_EXHAUSTED"
const STATUS_FAILED_PRECONDITION := "FAILED_PRECONDITION"
const STATUS_UNIMPLEMENTED := "UNIMPLEMENTED"
const STATUS_UNAVAILABLE := "UNAVAILABLE"
const STATUS_UNAUTHENTICATED := "UNAUTHENTICATED"

## The longest frame and window a FrameReport may carry (ms), the most frames, and the frame
## rate assumed when the game sets none.
const MAX_FRAME_MS := 60000.0
const MAX_REPORT_FRAMES := 100000
const DEFAULT_FPS := 60.0

const AskOptions := preload("res://addons/xlm_sidecar/xlm_ask_options.gd")
const Tool := preload("res://addons/xlm_sidecar/xlm_tool.gd")


static func auth_frame(token: String) -> Dictionary:
	return {KEY_AUTH: token}


static func call_frame(
	call_id: String, method: String, request: Dictionary, timeout_ms: int = 0
) -> Dictionary:
	var frame := {KEY_ID: call_id, KEY_METHOD: method, KEY_REQUEST: request}
	if timeout_ms > 0:
		frame[KEY_TIMEOUT_MS] = timeout_ms
	return frame


static func cancel_frame(call_id: String) -> Dictionary:
	return {KEY_ID: call_id, KEY_CANCEL: true}


## A Generate request: chat messages (the persona first, when given), the shared world context
## when given, sampling and limits, and the tools the reply may call.
static func generate_request(
	text: String,
	system_prompt: String,
	session_id: String,
	options: AskOptions,
	world_context: String = ""
) -> Dictionary:
	var messages: Array = []
	if not system_prompt.is_empty():
		messages.append({FIELD_ROLE: ROLE_SYSTEM, FIELD_CONTENT: system_prompt})
	messages.append({FIELD_ROLE: ROLE_USER, FIELD_CONTENT: text})
	var request := {FIELD_MESSAGES: {FIELD_MESSAGES: messages}}
	_add_common(request, session_id, options)
	if options.reset_session:
		request[FIELD_RESET_SESSION] = true
	if not world_context.is_empty():
		request[FIELD_CONTEXT] = world_context
	if not options.tools.is_empty():
		var tools: Array = []
		for tool: Tool in options.tools:
			tools.append(tool_definition(tool))
		request[FIELD_TOOLS] = tools
	if not options.tool_choice.is_empty():
		request[FIELD_TOOL_CHOICE] = options.tool_choice
	if options.logprobs >= 0:
		request[FIELD_LOGPROBS] = options.logprobs
	if not options.grammar.is_empty():
		request[FIELD_GRAMMAR] = options.grammar
	if not session_id.is_empty() and not options.memory_read_scopes.is_empty():
		var memory := {FIELD_READ_SCOPES: Array(options.memory_read_scopes)}
		if not options.memory_scope.is_empty():
			memory[FIELD_SCOPE] = options.memory_scope
		request[FIELD_MEMORY] = memory
	return request


## A Generate request for `n` candidate replies to one line; candidates are one-offs, so it has
## no session.
static func candidates_request(
	text: String, system_prompt: String, n: int, options: AskOptions, world_context: String = ""
) -> Dictionary:
	var request := generate_request(text, system_prompt, "", options, world_context)
	request[FIELD_N] = n
	return request


## NPC memory: memories added to `scope`, with tags to recall or forget them by.
static func remember_request(
	scope: String, texts: PackedStringArray, tags: PackedStringArray
) -> Dictionary:
	var request := {FIELD_SCOPE: scope, FIELD_TEXTS: Array(texts)}
	if not tags.is_empty():
		request[FIELD_TAGS] = Array(tags)
	return request


static func recall_request(query: String, scopes: PackedStringArray, k: int) -> Dictionary:
	var request := {FIELD_QUERY: query, FIELD_SCOPES: Array(scopes)}
	if k > 0:
		request[FIELD_K] = k
	return request


## Memories by id (64-bit, so strings in JSON), by tags (within `scope`), or a whole scope.
static func forget_request(
	ids: PackedInt64Array, tags: PackedStringArray, scope: String
) -> Dictionary:
	var request := {}
	if not ids.is_empty():
		var names: Array = []
		for memory_id in ids:
			names.append(str(memory_id))
		request[FIELD_IDS] = names
	if not tags.is_empty():
		request[FIELD_TAGS] = Array(tags)
	if not scope.is_empty():
		request[FIELD_SCOPE] = scope
	return request


static func list_memories_request(scope: String, limit: int) -> Dictionary:
	var request := {}
	if not scope.is_empty():
		request[FIELD_SCOPE] = scope
	if limit > 0:
		request[FIELD_LIMIT] = limit
	return request


static func embed_request(texts: PackedStringArray) -> Dictionary:
	return {FIELD_INPUT: Array(texts)}


static func tokenize_request(text: String, add_special: bool, parse_special: bool) -> Dictionary:
	var request := {FIELD_TEXT: text}
	if add_special:
		request[FIELD_ADD_SPECIAL] = true
	if parse_special:
		request[FIELD_PARSE_SPECIAL] = true
	return request


static func detokenize_request(tokens: PackedInt32Array) -> Dictionary:
	return {FIELD_TOKENS: Array(tokens)}


## A logit bias as the JSON mapping writes a map<int32, float>: the token ids as text keys.
static func logit_bias_map(biases: Dictionary) -> Dictionary:
	var written := {}
	for token_id: Variant in biases:
		written[str(int(token_id))] = float(biases[token_id])
	return written


## A tool as xlm.v1.Tool: its parameters schema goes as text (JSON.stringify: keys sorted, no
## spaces); an empty description or schema is left out.
static func tool_definition(tool: Tool) -> Dictionary:
	var definition := {FIELD_NAME: tool.name}
	if not tool.description.is_empty():
		definition[FIELD_DESCRIPTION] = tool.description
	if not tool.parameters.is_empty():
		definition[FIELD_PARAMETERS_JSON_SCHEMA] = JSON.stringify(tool.parameters)
	return definition


## The user line that reports a tool call's outcome to the model (the daemon's HTTP API writes
## OpenAI's role "tool" messages the same way): the result as text, or as JSON when it is not.
static func tool_result_text(tool_name: String, result: Variant) -> String:
	var written: String = result if result is String else JSON.stringify(result)
	return "Result of %s: %s" % [tool_name, written]


## An AskImage request with tightly packed, top-down RGBA8 pixels.
static func ask_image_request(
	rgba: PackedByteArray,
	width: int,
	height: int,
	question: String,
	session_id: String,
	options: AskOptions
) -> Dictionary:
	var raw := {
		FIELD_PIXELS: Marshalls.raw_to_base64(rgba),
		FIELD_WIDTH: width,
		FIELD_HEIGHT: height,
		FIELD_FORMAT: PIXEL_FORMAT_RGBA8,
	}
	var request := {FIELD_IMAGE: {FIELD_RAW: raw}, FIELD_QUESTION: question}
	_add_common(request, session_id, options)
	return request


## A SetBudget request: VRAM as people write it ("512M", "3G", "0"; empty keeps it), when not
## negative a cap on CPU threads (0 removes the cap), and when given the host memory the daemon
## may hold, written the same way ("0" removes that cap).
static func set_budget_request(
	vram_size: String, max_cpu_threads: int, ram_size: String = ""
) -> Dictionary:
	var request := {}
	if not vram_size.is_empty():
		request[FIELD_VRAM_SIZE] = vram_size
	if max_cpu_threads >= 0:
		request[FIELD_MAX_CPU_THREADS] = max_cpu_threads
	if not ram_size.is_empty():
		request[FIELD_RAM_SIZE] = ram_size
	return request


## A FrameReport of frame times in milliseconds (any order) over a window of `window_ms` (their
## sum when 0 or less): the median and the 99th percentile (nearest rank), the longest frame and
## how many took longer than `budget_ms` (0: the daemon's --frame-budget-ms). Empty without
## frames. Times past the daemon's minute count as a minute.
static func frame_report_request(
	frame_ms: PackedFloat64Array, window_ms: float, budget_ms: float
) -> Dictionary:
	if frame_ms.is_empty():
		return {}
	var ordered := PackedFloat64Array()
	var total := 0.0
	var over := 0
	for ms in frame_ms:
		var clamped := clampf(ms, 0.0, MAX_FRAME_MS)
		ordered.append(clamped)
		total += clamped
		if budget_ms > 0.0 and clamped > budget_ms:
			over += 1
	ordered.sort()
	var window := window_ms if window_ms > 0.0 else total
	return {
		FIELD_FRAMES: ordered.size(),
		FIELD_WINDOW_MS: clampf(maxf(window, ordered[-1]), 0.001, MAX_FRAME_MS),
		FIELD_FRAME_MS_P50: nearest_rank(ordered, 0.5),
		FIELD_FRAME_MS_P99: nearest_rank(ordered, 0.99),
		FIELD_FRAME_MS_MAX: ordered[-1],
		FIELD_FRAMES_OVER_BUDGET: over,
		FIELD_FRAME_BUDGET_MS: maxf(budget_ms, 0.0),
		FIELD_GPU_FRAME_MS_P99: 0.0,
	}


## The nearest-rank percentile `q` (0 to 1) of ascending `ordered` values.
static func nearest_rank(ordered: PackedFloat64Array, q: float) -> float:
	if ordered.is_empty():
		return 0.0
	return ordered[clampi(ceili(q * ordered.size()) - 1, 0, ordered.size() - 1)]


## The frame budget of a target frame rate: 1000 / fps, 60 fps where it is 0 (Engine.max_fps 0:
## unlimited), within the 1 to 1000 ms the daemon takes.
static func frame_budget_ms(target_fps: float) -> float:
	var fps := target_fps if target_fps > 0.0 else DEFAULT_FPS
	return clampf(1000.0 / fps, 1.0, 1000.0)


static func end_session_request(session_id: String) -> Dictionary:
	return {FIELD_SESSION_ID: session_id}


## Save games: the sessions to export (all when empty), with their KV caches or not, in chunks of
## chunk_bytes (small enough for WebSocketPeer's inbound buffer).
static func export_sessions_request(
	session_ids: PackedStringArray, include_kv: bool, chunk_bytes: int
) -> Dictionary:
	var request := {FIELD_CHUNK_BYTES: chunk_bytes}
	if not session_ids.is_empty():
		request[FIELD_SESSION_IDS] = Array(session_ids)
	if include_kv:
		request[FIELD_INCLUDE_KV] = true
	return request


## One part of an import: every part carries the upload's id, all but the last `more`.
static func import_sessions_request(
	part: PackedByteArray, replace: bool, upload_id: String, more: bool
) -> Dictionary:
	var request := {
		FIELD_ARCHIVE: Marshalls.raw_to_base64(part), FIELD_UPLOAD_ID: upload_id, FIELD_MORE: more
	}
	if replace:
		request[FIELD_REPLACE] = true
	return request


## Fields shared by Generate and AskImage; defaults are left out so the daemon's apply.
static func _add_common(request: Dictionary, session_id: String, options: AskOptions) -> void:
	if options.max_tokens > 0:
		request[FIELD_MAX_TOKENS] = options.max_tokens
	var sampling := {}
	if options.temperature >= 0.0:
		sampling[FIELD_TEMPERATURE] = options.temperature
	if options.sampling_seed >= 0:
		# uint64: the JSON mapping carries 64-bit integers as strings.
		sampling[FIELD_SEED] = str(options.sampling_seed)
	if not options.logit_bias.is_empty():
		sampling[FIELD_LOGIT_BIAS] = logit_bias_map(options.logit_bias)
	if not sampling.is_empty():
		request[FIELD_SAMPLING] = sampling
	if not options.stop.is_empty():
		request[FIELD_STOP] = Array(options.stop)
	if not options.json_schema.is_empty():
		request[FIELD_JSON_SCHEMA] = options.json_schema
	if not session_id.is_empty():
		request[FIELD_SESSION_ID] = session_id


## A uint64/int64 field: the JSON mapping writes them as strings; numbers are taken too.
static func read_int64(message: Dictionary, field: String) -> int:
	var value: Variant = message.get(field, 0)
	if value is String:
		var digits: String = value
		return digits.to_int()
	return read_int(message, field)


## JSON numbers arrive as floats.
static func read_int(message: Dictionary, field: String) -> int:
	var value: Variant = message.get(field, 0)
	if value is float or value is int:
		return int(value)
	return 0


static func read_float(message: Dictionary, field: String) -> float:
	var value: Variant = message.get(field, 0.0)
	if value is float or value is int:
		return float(value)
	return 0.0


static func read_string(message: Dictionary, field: String) -> String:
	var value: Variant = message.get(field, "")
	if value is String:
		return value
	return ""


## A bytes field: base64 in the JSON mapping.
static func read_bytes(message: Dictionary, field: String) -> PackedByteArray:
	return Marshalls.base64_to_raw(read_string(message, field))


static func read_bool(message: Dictionary, field: String) -> bool:
	var value: Variant = message.get(field, false)
	if value is bool:
		return value
	return false


static func read_dict(message: Dictionary, field: String) -> Dictionary:
	var value: Variant = message.get(field, {})
	if value is Dictionary:
		return value
	return {}


static func read_array(message: Dictionary, field: String) -> Array:
	var value: Variant = message.get(field, [])
	if value is Array:
		return value
	return []
