class_name XlmDaemon
extends RefCounted
## Launches `xlm-sidecar serve` beside the game and stops it again.
##
## The daemon gets the game's process id (--parent-pid), so it exits by itself within two
## seconds if the game dies without stopping it, and a fresh random token that every call must
## carry, so other programs on the machine cannot drive the model.

const TOKEN_ENV := "XLM_SIDECAR_TOKEN"
const TOKEN_BYTES := 24
## How long stop() waits for the daemon to exit after SIGTERM before killing it.
const STOP_GRACE_MS := 3000

## The daemon's executable: a name on PATH or a full path (a bundled daemon).
var executable := "xlm-sidecar"
## gRPC listens here and the WebSocket bridge on port + 1, both on 127.0.0.1.
var port := 50551
## VRAM the game grants: "0" (CPU only), "512M", "3G", ...
var budget := "0"
## More `serve` flags, e.g. ["--model", "/path/to/model.gguf", "--mmproj", "/path/to/mmproj.gguf"].
var extra_args := PackedStringArray()
var pid := -1
var token := ""


func arguments() -> PackedStringArray:
	var args := PackedStringArray(
		[
			"serve",
			"--budget",
			budget,
			"--port",
			str(port),
			"--ws-port",
			str(port + 1),
			"--parent-pid",
			str(OS.get_process_id()),
		]
	)
	args.append_array(extra_args)
	return args


func websocket_url() -> String:
	return "ws://127.0.0.1:%d" % (port + 1)


func start() -> Error:
	if is_running():
		return ERR_ALREADY_IN_USE
	token = Crypto.new().generate_random_bytes(TOKEN_BYTES).hex_encode()
	# OS.create_process takes no environment: the child inherits the game's, so the token is put
	# there for the moment of the launch only. A flag would show in every process list.
	OS.set_environment(TOKEN_ENV, token)
	pid = OS.create_process(executable, arguments())
	OS.unset_environment(TOKEN_ENV)
	if pid <= 0:
		pid = -1
		return ERR_CANT_CREATE
	return OK


func is_running() -> bool:
	return pid > 0 and OS.is_process_running(pid)


## Stops the daemon and waits for it (at most STOP_GRACE_MS, then it is killed).
func stop() -> void:
	if not is_running():
		pid = -1
		return
	if OS.get_name() != "Windows":
		# OS.kill sends SIGKILL; SIGTERM first lets the daemon close its sockets and remove its
		# token file. Windows has no such signal, so there it is killed at once.
		OS.execute("kill", PackedStringArray(["-TERM", str(pid)]))
		var deadline := Time.get_ticks_msec() + STOP_GRACE_MS
		while OS.is_process_running(pid) and Time.get_ticks_msec() < deadline:
			OS.delay_msec(20)
	if OS.is_process_running(pid):
		OS.kill(pid)
	pid = -1
