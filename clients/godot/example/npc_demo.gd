extends Control
## The addon's example: Brom the blacksmith answers what the player types, his reply appearing as
## the model writes it, and F2 asks the model what is on the screen. It launches the daemon with
## the game (through the XlmSidecar autoload the plugin adds) and the daemon stops with the game.

const NPC_ID := "brom"
const PERSONA := (
	"You are Brom, a gruff dwarven blacksmith in the mountain town of Emberfall. "
	+ "Answer in one or two short sentences."
)
const SCREEN_QUESTION := "Describe what is on the screen in one sentence."

## Launch `xlm-sidecar serve` (on PATH, or set XlmSidecar.daemon_executable); otherwise connect
## to a daemon you started yourself, with its token in XLM_SIDECAR_TOKEN.
@export var start_daemon := true
@export var daemon_budget := "0"
## More `serve` flags; screenshot questions need a vision model:
## ["--model", "/path/model.gguf", "--mmproj", "/path/mmproj.gguf"].
@export var daemon_args := PackedStringArray()

var _npc_call: XlmCall = null
var _options := XlmAskOptions.new()
var _screen_waiting := false

@onready var _status: Label = $Box/Status
@onready var _reply: Label = $Box/Reply
@onready var _input: LineEdit = $Box/Input
@onready var _screen_answer: Label = $Box/ScreenAnswer


func _ready() -> void:
	_options.system_prompt = PERSONA
	_options.max_tokens = 80
	XlmSidecar.connected.connect(_on_connected)
	XlmSidecar.disconnected.connect(_on_disconnected)
	_input.text_submitted.connect(_on_player_said)
	_input.grab_focus()
	if start_daemon:
		XlmSidecar.daemon_budget = daemon_budget
		XlmSidecar.daemon_args = daemon_args
		if XlmSidecar.launch_daemon() != OK:
			_status.text = "Could not start %s" % XlmSidecar.daemon_executable
	else:
		XlmSidecar.connect_to_daemon("", OS.get_environment("XLM_SIDECAR_TOKEN"))


func _unhandled_input(event: InputEvent) -> void:
	var key := event as InputEventKey
	if key != null and key.pressed and not key.echo and key.keycode == KEY_F2:
		get_viewport().set_input_as_handled()
		_ask_about_screen()


func _on_connected(_daemon_status: Dictionary) -> void:
	var sees := " (can see the screen)" if XlmSidecar.vision_available else ""
	_status.text = "Model: %s%s" % [XlmSidecar.model_name, sees]


func _on_disconnected(reason: String) -> void:
	_status.text = "Disconnected: %s" % reason


func _on_player_said(line: String) -> void:
	if line.strip_edges().is_empty():
		return
	_input.clear()
	# A new line from the player interrupts Brom.
	if _npc_call != null and not _npc_call.done:
		XlmSidecar.cancel(_npc_call.id)
	_reply.text = ""
	var call: XlmCall = XlmSidecar.ask(line, NPC_ID, _options)
	_npc_call = call
	call.token.connect(_on_npc_token.bind(call))
	await call.finished
	if not call.ok() and call.error_code != XlmProtocol.STATUS_CANCELLED:
		_reply.text = "(%s: %s)" % [call.error_code, call.error_message]


func _on_npc_token(text: String, call: XlmCall) -> void:
	if call == _npc_call:
		_reply.text += text


func _ask_about_screen() -> void:
	_screen_answer.text = "Looking..."
	_screen_waiting = true
	# Read the frame back once it is drawn, so the model sees what the player sees.
	await RenderingServer.frame_post_draw
	var call: XlmCall = XlmSidecar.ask_about_screen(SCREEN_QUESTION)
	call.token.connect(_on_screen_token)
	await call.finished
	if not call.ok():
		_screen_answer.text = "(%s: %s)" % [call.error_code, call.error_message]


func _on_screen_token(text: String) -> void:
	if _screen_waiting:
		_screen_answer.text = ""
		_screen_waiting = false
	_screen_answer.text += text
