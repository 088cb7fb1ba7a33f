class_name XlmAskOptions
extends Resource
## How one question is asked: the NPC's persona, reply length, sampling (logit biases too), stop
## strings, an optional JSON schema or GBNF grammar, and token log probabilities. Values left at
## their defaults (negative or empty) are not sent, so the daemon's defaults apply. A Resource, so
## an NPC can keep its options in the inspector.

const Tool := preload("res://addons/xlm_sidecar/xlm_tool.gd")

## The NPC's persona, sent as the system message on a session's first turn (on every turn when
## there is no session). Image questions have no system message and ignore it.
@export_multiline var system_prompt := ""
## Shared world context (lore, rules of speech, quest state) that opens the prompt before the
## persona. Give every NPC of a scene the very same text: the daemon computes it once and copies
## it to the others. Sent like system_prompt: with a session's first turn only.
@export_multiline var world_context := ""
## Most tokens in the reply; 0 means the daemon's default (256).
@export var max_tokens := 0
## 0 is greedy (always the likeliest token); negative means the daemon's default (0.7).
@export var temperature := -1.0
## A fixed seed makes sampling reproducible; negative means a random seed per request.
@export var sampling_seed := -1
## The reply stops before any of these strings.
@export var stop := PackedStringArray()
## A JSON schema, as text, that the reply must follow (XlmSidecarClient.ask_json fills it).
@export_multiline var json_schema := ""
## Functions the NPC may call (its actions; XlmSidecarClient.ask_tools fills it): the reply is a
## call of one of them, read with XlmCall.tool_call_name() and tool_call_arguments().
@export var tools: Array[Tool] = []
## With tools: "required" (the daemon's default when empty: the reply is a call), "auto" (a call
## or words), "none" (tools ignored), or one tool's name (a call of that one).
@export var tool_choice := ""
## Token id -> a bias added to its logit before sampling, -100 to 100: -100 bans the token, +5
## makes it much likelier. XlmSidecarClient.tokenize() finds the ids. At most 1024 entries.
@export var logit_bias := {}
## Return each reply token's log probability with this many of the likeliest alternatives at its
## position (0 to 20): XlmCall.token_logprobs(), alternative_ids(). Negative: none.
@export var logprobs := -1
## A GBNF grammar (llama.cpp's format, with a root rule) the reply is held to, e.g.
## root ::= "Aye" | "Nay" for a fixed answer shape. Not with json_schema or tools.
@export_multiline var grammar := ""
## Forget the session's history before this turn.
@export var reset_session := false
## NPC memory (with a session): the scopes each turn recalls from, e.g. the NPC's own
## ("smith/p1") and what the village knows ("village"); empty: the session's own scope.
@export var memory_read_scopes := PackedStringArray()
## Where the session's turns go as memories when they leave its context; empty: the session id.
@export var memory_scope := ""
## Give up after this many milliseconds (the call fails with DEADLINE_EXCEEDED); 0 = no limit.
@export var timeout_ms := 0
