# gdlint: disable=max-public-methods
# (one call's results, read by the game: each kind of call adds its reader)
class_name XlmCall
extends RefCounted
## One call to the daemon: a reply being streamed (or several candidate replies), or a status,
## budget, session, embedding or token request. `token` carries the reply's text as it arrives;
## `finished` fires exactly once when the call ends, whether it succeeded or failed, so
## `await call.finished` always returns.

## New text of the reply: a few tokens at a time, always whole characters.
signal token(text: String)
## The call is over: see `ok()`, then `text` and `final_message` (or `result`), or `error_code`.
signal finished

const Protocol := preload("res://addons/xlm_sidecar/xlm_protocol.gd")
const Logprobs := preload("res://addons/xlm_sidecar/xlm_logprobs.gd")

## The id it carries on the socket; pass it to XlmSidecarClient.cancel().
var id := ""
var method := ""
var session_id := ""
## The reply so far (the whole reply once finished); detokenize(): the text of the tokens.
var text := ""
## Tokens received so far.
var token_count := 0
## The reply's token ids so far (the ids XlmAskOptions.logit_bias takes).
var token_ids := PackedInt32Array()
## With XlmAskOptions.logprobs: each token's log probability and alternatives, one per token of
## token_ids (see XlmLogprobs).
var logprobs: Logprobs = Logprobs.new()
## Generate and AskImage: the last chunk's GenerationFinal (finish reason, usage, timings, image).
var final_message := {}
## GetStatus, SetBudget, EndSession, Embed, Tokenize, Detokenize and ReportFrames: the response
## message.
var result := {}
## ask_candidates: one XlmCall per candidate, in index order, each with its own `token` signal,
## text, final_message and `finished` (all fired before this call's). Empty for other calls.
var candidates: Array = []
## Which candidate this is (its place in the parent call's `candidates`); 0 for other calls.
var index := 0
## A gRPC status name ("CANCELLED", "NOT_FOUND", ...) when the call failed; empty otherwise.
var error_code := ""
var error_message := ""
var done := false
## The frame that starts the call (the client sends it once connected).
var frame := {}
## export_sessions: the save's bytes as they arrive (whole once finished), for the game's save file.
var archive := PackedByteArray()


func _init(call_id: String, call_method: String, call_session_id: String) -> void:
	id = call_id
	method = call_method
	session_id = call_session_id


func ok() -> bool:
	return done and error_code.is_empty()


## "FINISH_REASON_STOP", "FINISH_REASON_LENGTH", ... (XlmProtocol.FINISH_*); empty until the end.
func finish_reason() -> String:
	return Protocol.read_string(final_message, Protocol.FIELD_FINISH_REASON)


## The prompt's tokens (for embed(): the tokens of all its texts).
func prompt_tokens() -> int:
	if method == Protocol.METHOD_EMBED:
		return Protocol.read_int(result, Protocol.FIELD_PROMPT_TOKENS)
	return Protocol.read_int(_usage(), Protocol.FIELD_PROMPT_TOKENS)


## Of prompt_tokens, those the session's cache already held.
func cached_prompt_tokens() -> int:
	return Protocol.read_int(_usage(), Protocol.FIELD_CACHED_PROMPT_TOKENS)


func completion_tokens() -> int:
	return Protocol.read_int(_usage(), Protocol.FIELD_COMPLETION_TOKENS)


func time_to_first_token_ms() -> float:
	var timings := Protocol.read_dict(final_message, Protocol.FIELD_TIMINGS)
	return Protocol.read_float(timings, Protocol.FIELD_TIME_TO_FIRST_TOKEN_MS)


func decode_tokens_per_s() -> float:
	var timings := Protocol.read_dict(final_message, Protocol.FIELD_TIMINGS)
	return Protocol.read_float(timings, Protocol.FIELD_DECODE_TOKENS_PER_S)


## Image questions: the size the model saw and the tokens the image took.
func image_size() -> Vector2i:
	var image := Protocol.read_dict(final_message, Protocol.FIELD_IMAGE)
	return Vector2i(
		Protocol.read_int(image, Protocol.FIELD_ENCODED_WIDTH),
		Protocol.read_int(image, Protocol.FIELD_ENCODED_HEIGHT)
	)


func image_tokens() -> int:
	var image := Protocol.read_dict(final_message, Protocol.FIELD_IMAGE)
	return Protocol.read_int(image, Protocol.FIELD_IMAGE_TOKENS)


## ask_tools: whether the reply is a call of one of the tools (finish reason FINISH_TOOL_CALL).
func is_tool_call() -> bool:
	return not tool_call_name().is_empty()


## The tool the reply called, or "" when it called none.
func tool_call_name() -> String:
	return Protocol.read_string(_tool_call(), Protocol.FIELD_NAME)


## The call's arguments, parsed: a Dictionary that fits the tool's parameters schema; null when
## the reply called no tool.
func tool_call_arguments() -> Variant:
	if not is_tool_call():
		return null
	var json := JSON.new()
	if json.parse(Protocol.read_string(_tool_call(), Protocol.FIELD_ARGUMENTS_JSON)) != OK:
		return null
	return json.data


## The reply parsed as JSON (for ask_json), or null when it is not valid JSON, e.g. because
## max_tokens cut it short.
func parse_json() -> Variant:
	var json := JSON.new()
	if json.parse(text) != OK:
		return null
	return json.data


## ask_candidates: each candidate's text, in index order.
func candidate_texts() -> PackedStringArray:
	var texts := PackedStringArray()
	for each: Variant in candidates:
		texts.append(each.text)
	return texts


## embed(): one vector per text, in order; unit vectors of one length, so
## XlmSidecarClient.similarity() (a dot product) compares them.
func embeddings() -> Array[PackedFloat32Array]:
	var vectors: Array[PackedFloat32Array] = []
	for embedding: Dictionary in Protocol.read_array(result, Protocol.FIELD_EMBEDDINGS):
		vectors.append(PackedFloat32Array(Protocol.read_array(embedding, Protocol.FIELD_VALUES)))
	return vectors


## tokenize(): the served model's token ids for the text.
func tokens() -> PackedInt32Array:
	var ids := PackedInt32Array()
	for token_id: Variant in Protocol.read_array(result, Protocol.FIELD_TOKENS):
		ids.append(int(token_id))
	return ids


## export_sessions and import_sessions: what was saved or restored of each session, one
## Dictionary each, keyed by XlmProtocol's names: FIELD_SESSION_ID, FIELD_TOKENS, FIELD_KV_BYTES
## (an int), FIELD_RESTORED ("kv": its KV cache is back; "text": its conversation is computed
## again at its next line) and FIELD_REASON (why "text").
## Remember, ListMemories: the memories, each a Dictionary of the proto's Memory (id as a
## string: 64 bits; scope, text, tags, source, sessionId, turn, uses).
func memories() -> Array[Dictionary]:
	var found: Array[Dictionary] = []
	for memory: Dictionary in Protocol.read_array(result, Protocol.FIELD_MEMORIES):
		found.append(memory)
	return found


## Recall: the memories found, best first, each with its score (cosine, -1 to 1) under
## XlmProtocol.FIELD_SCORE beside the memory's own fields.
func recalled() -> Array[Dictionary]:
	var found: Array[Dictionary] = []
	for hit: Dictionary in Protocol.read_array(result, Protocol.FIELD_MEMORIES):
		var memory := Protocol.read_dict(hit, Protocol.FIELD_MEMORY).duplicate()
		memory[Protocol.FIELD_SCORE] = Protocol.read_float(hit, Protocol.FIELD_SCORE)
		found.append(memory)
	return found


## Forget: how many memories went.
func forgotten() -> int:
	return Protocol.read_int(result, Protocol.FIELD_FORGOTTEN)


## ListMemories: how many memories the scope holds (the page is memories()).
func memories_total() -> int:
	return Protocol.read_int(result, Protocol.FIELD_TOTAL)


## A session's turn: the memories told to the model, and those its dropped turns became (the
## "context full" signal), as ids.
func memories_used() -> PackedInt64Array:
	return _ids(Protocol.FIELD_MEMORIES_USED)


func memories_added() -> PackedInt64Array:
	return _ids(Protocol.FIELD_MEMORIES_ADDED)


func _ids(field: String) -> PackedInt64Array:
	var ids := PackedInt64Array()
	for memory_id: Variant in Protocol.read_array(final_message, field):
		ids.append(int(str(memory_id)))
	return ids


func saved_sessions() -> Array[Dictionary]:
	var infos: Array[Dictionary] = []
	for info: Dictionary in Protocol.read_array(result, Protocol.FIELD_SESSIONS):
		var saved := {}
		saved[Protocol.FIELD_SESSION_ID] = Protocol.read_string(info, Protocol.FIELD_SESSION_ID)
		saved[Protocol.FIELD_TOKENS] = Protocol.read_int(info, Protocol.FIELD_TOKENS)
		saved[Protocol.FIELD_KV_BYTES] = Protocol.read_int64(info, Protocol.FIELD_KV_BYTES)
		saved[Protocol.FIELD_RESTORED] = Protocol.read_string(info, Protocol.FIELD_RESTORED)
		saved[Protocol.FIELD_REASON] = Protocol.read_string(info, Protocol.FIELD_REASON)
		infos.append(saved)
	return infos


## export_sessions: the archive's size as the daemon counted it; import_sessions: bytes received.
func archive_size() -> int:
	if method == Protocol.METHOD_EXPORT_SESSIONS:
		return Protocol.read_int64(result, Protocol.FIELD_ARCHIVE_BYTES)
	return Protocol.read_int64(result, Protocol.FIELD_RECEIVED_BYTES)


## Called by XlmSidecarClient for ask_candidates: one XlmCall per candidate, before any chunk.
func expect_candidates(n: int) -> void:
	for i in n:
		var each: Variant = get_script().new(id, method, session_id)
		each.index = i
		each.frame = frame
		candidates.append(each)


## Called by XlmSidecarClient for each chunk of a streamed reply; a candidate's chunk goes to that
## candidate. Returns the chunk's text.
func receive_chunk(chunk: Dictionary) -> String:
	if not candidates.is_empty():
		var i := Protocol.read_int(chunk, Protocol.FIELD_INDEX)
		if i < 0 or i >= candidates.size():
			push_warning(
				"xlm-sidecar: %s: a chunk of candidate %d of %d" % [id, i, candidates.size()]
			)
			return ""
		var each: Variant = candidates[i]
		return each.receive_chunk(chunk)
	if method == Protocol.METHOD_EXPORT_SESSIONS:
		archive.append_array(Protocol.read_bytes(chunk, Protocol.FIELD_DATA))
		if Protocol.read_bool(chunk, Protocol.FIELD_LAST):
			result = chunk
		return ""
	var chunk_text := Protocol.read_string(chunk, Protocol.FIELD_TEXT)
	for token_id: Variant in Protocol.read_array(chunk, Protocol.FIELD_TOKEN_IDS):
		token_ids.append(int(token_id))
	token_count = token_ids.size()
	logprobs.add(Protocol.read_array(chunk, Protocol.FIELD_LOGPROBS))
	var chunk_final := Protocol.read_dict(chunk, Protocol.FIELD_FINAL)
	if not chunk_final.is_empty():
		final_message = chunk_final
	if not chunk_text.is_empty():
		token.emit(chunk_text)
	return chunk_text


## Called by XlmSidecarClient when the call ends well (`response` is empty for streams).
func complete(response: Dictionary) -> void:
	if done:
		return
	for each: Variant in candidates:
		each.complete({})
	if not response.is_empty() or method != Protocol.METHOD_EXPORT_SESSIONS:
		result = response
	if method == Protocol.METHOD_DETOKENIZE:
		text = Protocol.read_string(response, Protocol.FIELD_TEXT)
	done = true
	finished.emit()


## Called by XlmSidecarClient when the call fails.
func fail(code: String, message: String) -> void:
	if done:
		return
	for each: Variant in candidates:
		each.fail(code, message)
	error_code = code
	error_message = message
	done = true
	finished.emit()


func _usage() -> Dictionary:
	return Protocol.read_dict(final_message, Protocol.FIELD_USAGE)


func _tool_call() -> Dictionary:
	return Protocol.read_dict(final_message, Protocol.FIELD_TOOL_CALL)
