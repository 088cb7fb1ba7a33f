using System;
using System.Collections.Generic;

namespace Xlm.Sidecar
{
    // NPC actions as function calls (GenerateRequest.tools and tool_choice, GenerationFinal.tool_call).
    // The daemon holds the reply to a grammar built from the tools' schemas, so a call always names
    // one of the declared tools and its arguments are JSON that fits that tool's parameters.

    /// <summary>A function the NPC may call: a name, what it does (the model reads it), and a JSON
    /// schema of its arguments as JSON text (null or empty: any object).</summary>
    public sealed class ToolDefinition
    {
        public string Name;
        public string Description;
        /// <summary>A JSON schema, e.g. {"type":"object","properties":{"target":{"type":"string"}},"required":["target"]}.</summary>
        public string ParametersJsonSchema;

        public ToolDefinition(string name, string description = null, string parametersJsonSchema = null)
        {
            Name = name;
            Description = description;
            ParametersJsonSchema = parametersJsonSchema;
        }

        internal JsonObject ToJson()
        {
            if (string.IsNullOrEmpty(Name))
                throw new ArgumentException("every tool needs a name");
            var json = new JsonObject { { "name", Name } };
            if (!string.IsNullOrEmpty(Description)) json["description"] = Description;
            if (!string.IsNullOrEmpty(ParametersJsonSchema)) json["parametersJsonSchema"] = ParametersJsonSchema;
            return json;
        }

        internal static List<object> ListToJson(List<ToolDefinition> tools)
        {
            var list = new List<object>();
            foreach (var tool in tools)
            {
                if (tool == null)
                    throw new ArgumentException("a tool in the list is null");
                list.Add(tool.ToJson());
            }
            return list;
        }
    }

    /// <summary>Whether and which tool the reply must call. Null on a request means the daemon's
    /// default with tools, Required.</summary>
    public sealed class ToolChoice
    {
        /// <summary>The reply is a call of one of the tools.</summary>
        public static readonly ToolChoice Required = new ToolChoice("required");
        /// <summary>A call, or words (then the reply's text is the words, as without tools).</summary>
        public static readonly ToolChoice Auto = new ToolChoice("auto");
        /// <summary>The tools are ignored: free text.</summary>
        public static readonly ToolChoice None = new ToolChoice("none");

        /// <summary>"required", "auto", "none", or a tool's name: as the daemon's tool_choice takes it.</summary>
        public string Value { get; private set; }

        ToolChoice(string value)
        {
            Value = value;
        }

        /// <summary>The reply is a call of this tool (one of the request's).</summary>
        public static ToolChoice Function(string toolName)
        {
            if (string.IsNullOrEmpty(toolName))
                throw new ArgumentException("name the tool the reply must call", "toolName");
            return new ToolChoice(toolName);
        }

        public override string ToString() { return Value; }
    }

    /// <summary>The call a reply made (GenerationFinal.ToolCall, with FinishReason.ToolCall).</summary>
    public sealed class ToolCall
    {
        /// <summary>One of the request's tools.</summary>
        public string Name;
        /// <summary>The arguments as JSON text; they validate against the tool's parameters schema.</summary>
        public string ArgumentsJson;

        /// <summary>The arguments parsed (a JSON object); FormatException if they are not JSON.</summary>
        public JsonObject Arguments { get { return Json.ParseObject(string.IsNullOrEmpty(ArgumentsJson) ? "{}" : ArgumentsJson); } }

        /// <summary>What the game reports back after acting: a user message the model reads as the
        /// call's outcome (the daemon's HTTP API writes OpenAI's role "tool" messages the same way).
        /// Send it in the same session to let the NPC go on in words.</summary>
        public ChatMessage ResultMessage(string result)
        {
            return ChatMessage.User("Result of " + Name + ": " + (result ?? ""));
        }

        /// <summary>The call as the assistant turn the model wrote, for a conversation without a
        /// session, where the client sends the whole history again.</summary>
        public ChatMessage AssistantMessage()
        {
            var call = new JsonObject { { "name", Name ?? "" }, { "arguments", Arguments } };
            return ChatMessage.Assistant(Json.Write(call));
        }

        internal static ToolCall FromJson(JsonObject json)
        {
            if (json == null)
                return null;
            return new ToolCall { Name = json.GetString("name"), ArgumentsJson = json.GetString("argumentsJson") };
        }
    }
}
