class_name XlmCall
extends RefCounted
## One call to the daemon: a reply being streamed, or a status, budget or session request.
## `token` carries the reply's text as it arrives; `finished` fires exactly once when the call
## ends, whether it succeeded or failed, so `await call.finished` always returns.

## New text of the reply: a few tokens at a time, always whole characters.
signal token(text: String)
## The call is over: see `ok()`, then `text` and `final_message` (or `result`), or `error_code`.
signal finished

const Protocol := preload("res://addons/xlm_sidecar/xlm_protocol.gd")

## The id it carries on the socket; pass it to XlmSidecarClient.cancel().
var id := ""
var method := ""
var session_id := ""
## The reply so far (the whole reply once finished).
var text := ""
## Tokens received so far.
var token_count := 0
## Generate and AskImage: the last chunk's GenerationFinal (finish reason, usage, timings, image).
var final_message := {}
## GetStatus, SetBudget and EndSession: the response message.
var result := {}
## A gRPC status name ("CANCELLED", "NOT_FOUND", ...) when the call failed; empty otherwise.
var error_code := ""
var error_message := ""
var done := false
## The frame that starts the call (the client sends it once connected).
var frame := {}


func _init(call_id: String, call_method: String, call_session_id: String) -> void:
	id = call_id
	method = call_method
	session_id = call_session_id


func ok() -> bool:
	return done and error_code.is_empty()


## "FINISH_REASON_STOP", "FINISH_REASON_LENGTH", ... (XlmProtocol.FINISH_*); empty until the end.
func finish_reason() -> String:
	return Protocol.read_string(final_message, Protocol.FIELD_FINISH_REASON)


func prompt_tokens() -> int:
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


## Called by XlmSidecarClient for each chunk of a streamed reply.
func receive_chunk(chunk_text: String, tokens: int, chunk_final: Dictionary) -> void:
	text += chunk_text
	token_count += tokens
	if not chunk_final.is_empty():
		final_message = chunk_final
	if not chunk_text.is_empty():
		token.emit(chunk_text)


## Called by XlmSidecarClient when the call ends well (`response` is empty for streams).
func complete(response: Dictionary) -> void:
	if done:
		return
	result = response
	done = true
	finished.emit()


## Called by XlmSidecarClient when the call fails.
func fail(code: String, message: String) -> void:
	if done:
		return
	error_code = code
	error_message = message
	done = true
	finished.emit()


func _usage() -> Dictionary:
	return Protocol.read_dict(final_message, Protocol.FIELD_USAGE)


func _tool_call() -> Dictionary:
	return Protocol.read_dict(final_message, Protocol.FIELD_TOOL_CALL)
