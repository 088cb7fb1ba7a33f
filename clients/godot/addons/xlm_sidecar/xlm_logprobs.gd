class_name XlmLogprobs
extends RefCounted
## A reply's token log probabilities (asked for with XlmAskOptions.logprobs; XlmCall.logprobs):
## how sure the model was of each token it wrote, and which tokens it might have written there
## instead. Log probabilities are natural logs under the model, before temperature, penalties or
## biases: 0 is certain, -0.7 about even odds, -4.6 one in a hundred.

const Protocol := preload("res://addons/xlm_sidecar/xlm_protocol.gd")

## One entry per token of the reply, in order, as the daemon sends it (tokenId, piece in base64,
## logprob, top: the alternatives).
var entries: Array = []


## How many tokens have their log probability (the reply's token count, when asked for).
func size() -> int:
	return entries.size()


## The token at `position`.
func token_id(position: int) -> int:
	return Protocol.read_int(_at(position), Protocol.FIELD_TOKEN_ID)


## Each token's log probability, in order.
func values() -> PackedFloat32Array:
	var found := PackedFloat32Array()
	for position in entries.size():
		found.append(Protocol.read_float(_at(position), Protocol.FIELD_LOGPROB))
	return found


## The sum of values(): how likely the model found the whole reply (divide by size() to compare
## replies of different lengths, e.g. candidates).
func total() -> float:
	var sum := 0.0
	for value: float in values():
		sum += value
	return sum


## The bytes of the token at `position` (a token may hold part of a UTF-8 character).
func piece(position: int) -> PackedByteArray:
	return Protocol.read_bytes(_at(position), Protocol.FIELD_PIECE)


## The likeliest tokens at `position`, likeliest first (as many as XlmAskOptions.logprobs asked).
func alternative_ids(position: int) -> PackedInt32Array:
	var ids := PackedInt32Array()
	for alternative: Dictionary in Protocol.read_array(_at(position), Protocol.FIELD_TOP):
		ids.append(Protocol.read_int(alternative, Protocol.FIELD_TOKEN_ID))
	return ids


## The log probabilities of alternative_ids(position), in the same order.
func alternative_logprobs(position: int) -> PackedFloat32Array:
	var found := PackedFloat32Array()
	for alternative: Dictionary in Protocol.read_array(_at(position), Protocol.FIELD_TOP):
		found.append(Protocol.read_float(alternative, Protocol.FIELD_LOGPROB))
	return found


## Called by XlmCall with each chunk's entries.
func add(chunk_entries: Array) -> void:
	entries.append_array(chunk_entries)


func _at(position: int) -> Dictionary:
	if position >= 0 and position < entries.size() and entries[position] is Dictionary:
		return entries[position]
	return {}
