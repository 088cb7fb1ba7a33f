@tool
extends EditorPlugin
## Registers the client as the `XlmSidecar` autoload while the plugin is enabled.

const AUTOLOAD_NAME := "XlmSidecar"
const CLIENT_PATH := "res://addons/xlm_sidecar/xlm_sidecar_client.gd"


func _enable_plugin() -> void:
	add_autoload_singleton(AUTOLOAD_NAME, CLIENT_PATH)


func _disable_plugin() -> void:
	remove_autoload_singleton(AUTOLOAD_NAME)
