class_name XlmTool
extends Resource
## A function an NPC may call (an action): its name, what it does (the model reads this), and a
## JSON schema of its arguments. Give a list of them to XlmSidecarClient.ask_tools: the reply is
## then a call of one of them, with arguments that fit its schema. A Resource, so an NPC can keep
## its actions in the inspector.

## The function's name, as the reply's call names it (XlmCall.tool_call_name()).
@export var name := ""
## What the function does, in words the model reads.
@export_multiline var description := ""
## A JSON schema of the arguments (an object schema); empty means any object.
@export var parameters := {}


func _init(tool_name := "", tool_description := "", tool_parameters := {}) -> void:
	name = tool_name
	description = tool_description
	parameters = tool_parameters
